package ops

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"
)

// The charts are drawn on the server as inline SVG: the page needs no
// script or asset from the network, is right on its first render, and a
// screenshot or a saved page shows them.
const (
	chartW      = 590
	chartH      = 170
	chartLeft   = 46 // room for the y labels
	chartRight  = 8
	chartTop    = 10
	chartBottom = 20 // room for the x labels
	// minChartSpan is the narrowest time window drawn, so that the first
	// samples do not fill the width.
	minChartSpan = time.Minute
)

// chartColors are the lines' colors: 0 for cluster-wide lines, then one
// per node (cycled).
var chartColors = [...]string{"#444", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"}

func colorOf(i int) string {
	if i <= 0 {
		return chartColors[0]
	}
	return chartColors[1+(i-1)%(len(chartColors)-1)]
}

// chartWindow is the time range the charts draw: from the first sample (at
// least minChartSpan and at most HistorySpan back) to the last.
func chartWindow(charts []chart) (from, to time.Time) {
	for _, c := range charts {
		for _, s := range c.Series {
			for _, p := range s.Points {
				if from.IsZero() || p.at.Before(from) {
					from = p.at
				}
				if p.at.After(to) {
					to = p.at
				}
			}
		}
	}
	if to.Sub(from) < minChartSpan {
		from = to.Add(-minChartSpan)
	}
	if to.Sub(from) > HistorySpan {
		from = to.Add(-HistorySpan)
	}
	return from, to
}

// niceCeil is the smallest of 1, 2, 5 times a power of ten at least v (1
// for v ≤ 1).
func niceCeil(v float64) float64 {
	if v <= 1 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v*(1-1e-12) {
			return m * p
		}
	}
	return 10 * p
}

// countsCeil raises a nice top for a chart of whole counts until its half
// is whole too, so that no label reads 0.5 or 2.5: 1 → 2, 5 → 10.
func countsCeil(top float64) float64 {
	for math.Mod(top/2, 1) != 0 {
		top *= 2
	}
	return top
}

// compact formats an axis value: 0, 2.5, 40, 1.2k, 3M.
func compact(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// spanLabel says how far back a chart's left edge is.
func spanLabel(d time.Duration) string {
	if d >= time.Minute {
		return fmt.Sprintf("−%.0f min", math.Round(d.Minutes()))
	}
	return fmt.Sprintf("−%.0f s", d.Seconds())
}

// renderChart draws c between from and to as an SVG figure with its
// legend. A series' points are joined into a path, cut where a point is a
// gap or the next one is more than 2.5 sample intervals (every) later; a
// point alone is drawn as a dot. Each path carries data-series and
// data-points (its points drawn).
func renderChart(c chart, from, to time.Time, every time.Duration) template.HTML {
	var b strings.Builder
	esc := template.HTMLEscapeString
	fmt.Fprintf(&b, `<figure class="chart" id="chart-%s" data-chart="%s"><figcaption><b>%s</b> <span class="dim">%s</span><span class="legend">`,
		esc(c.ID), esc(c.ID), esc(c.Title), esc(c.Unit))
	for _, s := range c.Series {
		fmt.Fprintf(&b, ` <span><i style="background:%s"></i>%s</span>`, colorOf(s.color), esc(s.Name))
	}
	fmt.Fprintf(&b, `</span></figcaption><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s">`,
		chartW, chartH, chartW, chartH, esc(c.Title))

	pw, ph := float64(chartW-chartLeft-chartRight), float64(chartH-chartTop-chartBottom)
	span := to.Sub(from)
	top := 0.0
	for _, s := range c.Series {
		for _, p := range s.Points {
			if p.ok && !p.at.Before(from) && !p.at.After(to) {
				top = max(top, p.v)
			}
		}
	}
	ymax := niceCeil(top)
	if c.Counts {
		ymax = countsCeil(ymax)
	}
	x := func(t time.Time) float64 {
		if span <= 0 {
			return chartLeft + pw
		}
		return chartLeft + pw*float64(t.Sub(from))/float64(span)
	}
	y := func(v float64) float64 { return chartTop + ph*(1-min(max(v, 0), ymax)/ymax) }

	// Grid, y labels (0, half, top) and x labels (the left edge, now).
	for _, v := range []float64{0, ymax / 2, ymax} {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e3e3e3"/>`, chartLeft, y(v), chartW-chartRight, y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" font-size="11" fill="#777">%s</text>`, chartLeft-4, y(v)+4, compact(v))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" fill="#777">%s</text>`, chartLeft, chartH-5, spanLabel(span))
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" font-size="11" fill="#777">now</text>`, chartW-chartRight, chartH-5)

	drawn := 0
	for _, s := range c.Series {
		var d strings.Builder
		n, segLen := 0, 0
		var last time.Time
		for _, p := range s.Points {
			if !p.ok || p.at.Before(from) || p.at.After(to) {
				if segLen == 1 {
					d.WriteString(" l0,0")
				}
				segLen = 0
				continue
			}
			if segLen > 0 && every > 0 && p.at.Sub(last) > every*5/2 {
				if segLen == 1 {
					d.WriteString(" l0,0")
				}
				segLen = 0
			}
			cmd := "L"
			if segLen == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&d, "%s%.1f,%.1f ", cmd, x(p.at), y(p.v))
			segLen++
			n++
			last = p.at
		}
		if segLen == 1 {
			d.WriteString(" l0,0")
		}
		if n == 0 {
			continue
		}
		drawn++
		fmt.Fprintf(&b, `<path class="line" data-series="%s" data-points="%d" d="%s" fill="none" stroke="%s" stroke-width="1.8" stroke-linejoin="round" stroke-linecap="round"/>`,
			esc(s.Name), n, strings.TrimSpace(d.String()), colorOf(s.color))
	}
	if drawn == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle" font-size="12" fill="#999">no data yet (a sample every %s)</text>`,
			chartLeft+int(pw/2), chartTop+int(ph/2), every)
	}
	b.WriteString(`</svg></figure>`)
	return template.HTML(b.String()) //nolint:gosec // every text above is escaped
}

// renderCharts draws every chart over their common window.
func renderCharts(charts []chart, every time.Duration) []template.HTML {
	from, to := chartWindow(charts)
	out := make([]template.HTML, len(charts))
	for i, c := range charts {
		out[i] = renderChart(c, from, to, every)
	}
	return out
}
