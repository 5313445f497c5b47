package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func TestHistoryRing(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		adds     int
		want     []int // the seconds of the samples kept, oldest first
	}{
		{name: "empty", capacity: 3, adds: 0, want: []int{}},
		{name: "partly filled", capacity: 3, adds: 2, want: []int{0, 1}},
		{name: "full", capacity: 3, adds: 3, want: []int{0, 1, 2}},
		{name: "wrapped", capacity: 3, adds: 7, want: []int{4, 5, 6}},
		{name: "capacity 0 keeps one", capacity: 0, adds: 2, want: []int{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistoryRing(tt.capacity)
			for i := range tt.adds {
				h.add(histSample{at: t0.Add(time.Duration(i) * time.Second)})
			}
			got := []int{}
			for _, s := range h.samples() {
				got = append(got, int(s.at.Sub(t0)/time.Second))
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("samples %v, want %v", got, tt.want)
			}
		})
	}
	if n := len(newHistory().ring.buf); n != 300 {
		t.Errorf("the server's history keeps %d samples, want 10 min / 2 s = 300", n)
	}
}

func TestSampleOf(t *testing.T) {
	st := router.Status{At: t0, IngressLast: 50, IngressKnown: true, Unsettled: 2, Nodes: []router.NodeStatus{
		{Node: "n1", Live: true, Position: 51, Routed: 20, Groups: 3, Held: 4, QueuePending: 5, QueueUnacked: 6},
		{Node: "n2", Groups: 1},
	}}
	s := sampleOf(st)
	if s.ingressLast != 50 || s.unsettled != 2 || len(s.nodes) != 2 ||
		s.nodes["n1"] != (nodeSample{live: true, position: 51, routed: 20, groups: 3, held: 4, queuePending: 5, queueUnacked: 6}) ||
		s.nodes["n2"] != (nodeSample{groups: 1}) {
		t.Errorf("sample %+v", s)
	}
	st.IngressKnown = false
	if s := sampleOf(st); s.ingressLast != 0 {
		t.Errorf("an unknown ingress last sequence is sampled as %d, want 0 (unknown)", s.ingressLast)
	}
}

// values renders a series as "v v - v" (- for a gap).
func values(s chartSeries) string {
	var out []string
	for _, p := range s.Points {
		if !p.ok {
			out = append(out, "-")
			continue
		}
		out = append(out, strconv.FormatFloat(p.v, 'f', -1, 64))
	}
	return strings.Join(out, " ")
}

func TestChartsOf(t *testing.T) {
	// Four samples 2 s apart: n1 routes 10 messages a second, n2 reads
	// but is killed at the third sample (its groups stay bound to it) and
	// comes back restarted (its counter from 0) at the fourth.
	at := func(i int) time.Time { return t0.Add(time.Duration(2*i) * time.Second) }
	samples := []histSample{
		{at: at(0), ingressLast: 100, nodes: map[string]nodeSample{
			"n1": {live: true, position: 101, routed: 0, groups: 2, held: 1, queuePending: 3, queueUnacked: 1},
			"n2": {live: true, position: 101, routed: 50, groups: 1, held: 3, queuePending: 1}}},
		{at: at(1), ingressLast: 100, nodes: map[string]nodeSample{
			"n1": {live: true, position: 141, routed: 20, groups: 2, held: 0, queuePending: 4},
			"n2": {live: true, position: 141, routed: 60, groups: 1, held: 2}}},
		{at: at(2), ingressLast: 180, unsettled: 1, nodes: map[string]nodeSample{
			"n1": {live: true, position: 181, routed: 40, groups: 2},
			"n2": {live: false, groups: 1}}},
		{at: at(3), ingressLast: 220, nodes: map[string]nodeSample{
			"n1": {live: true, position: 221, routed: 60, groups: 3},
			"n2": {live: true, position: 221, routed: 6, groups: 0}}},
	}
	charts := chartsOf(samples)
	got := map[string]string{}
	var ids []string
	for _, c := range charts {
		ids = append(ids, c.ID)
		for _, s := range c.Series {
			got[c.ID+"/"+s.Name] = values(s)
		}
	}
	if fmt.Sprint(ids) != "[ingress routed groups backlog moves]" {
		t.Fatalf("charts %v", ids)
	}
	want := map[string]string{
		// Rates span up to 3 intervals: 40 over 2 s, 80 over 4 s, 120 over 6 s.
		// The stale last sequence of sample 1 (100) is made up by the
		// nodes' positions (141: they read through 140).
		"ingress/stored": "- 20 20 20",
		"ingress/n1":     "- 20 20 20",
		// n2 gone at sample 2: no rate there, nor over a span that starts
		// or ends where it was gone; at sample 3 the span is 0..3, both live.
		"ingress/n2": "- 20 - 20",
		"routed/n1":  "- 10 10 10",
		// A restarted counter counts from 0: 6 over 6 s.
		"routed/n2":                            "- 5 - 1",
		"groups/n1":                            "2 2 2 3",
		"groups/n2":                            "1 1 1 0",
		"backlog/held (most any router holds)": "3 2 0 0",
		"backlog/waiting on the queues":        "4 4 0 0",
		"backlog/unacked":                      "1 0 0 0",
		"moves/groups moving or in a hand-over step": "0 0 1 0",
		"moves/gone nodes with groups":               "0 0 1 0",
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %q, want %q", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("series %v, want exactly %d", got, len(want))
	}
	// Each node keeps its color across charts; cluster-wide lines are 0.
	if c := charts[1].Series; c[0].color != 1 || c[1].color != 2 || charts[0].Series[0].color != 0 {
		t.Errorf("colors: routed %d %d, stored %d", c[0].color, c[1].color, charts[0].Series[0].color)
	}
	// JSON: [unix ms, value or null].
	b, err := json.Marshal(charts[1].Series[1].Points)
	if err != nil {
		t.Fatal(err)
	}
	ms := t0.UnixMilli()
	if w := fmt.Sprintf("[[%d,null],[%d,5],[%d,null],[%d,1]]", ms, ms+2000, ms+4000, ms+6000); string(b) != w {
		t.Errorf("JSON %s, want %s", b, w)
	}
	if len(chartsOf(nil)) != 5 {
		t.Error("no samples: want the five charts, empty")
	}
}

var pathRE = regexp.MustCompile(`<path class="line" data-series="([^"]*)" data-points="(\d+)" d="([^"]*)"`)

func TestRenderChart(t *testing.T) {
	every := 2 * time.Second
	pt := func(sec int, v float64) chartPoint {
		return chartPoint{at: t0.Add(time.Duration(sec) * time.Second), v: v, ok: true}
	}
	gap := func(sec int) chartPoint { return chartPoint{at: t0.Add(time.Duration(sec) * time.Second)} }
	c := chart{ID: "routed", Title: "Routed <by node>", Unit: "msgs/s", Series: []chartSeries{
		{Name: "n1", color: 1, Points: []chartPoint{pt(0, 0), pt(2, 40), pt(4, 80), gap(6), pt(8, 30), pt(10, 20)}},
		{Name: `a"b`, color: 2, Points: []chartPoint{gap(0), pt(2, 5), gap(4), pt(30, 7), pt(40, 7)}}, // a dot, then two points 10 s apart: two dots
		{Name: "empty", Points: []chartPoint{gap(0), gap(2)}},
	}}
	out := string(renderChart(c, t0, t0.Add(time.Minute), every))
	paths := pathRE.FindAllStringSubmatch(out, -1)
	if len(paths) != 2 {
		t.Fatalf("%d paths, want 2 (the empty series draws none):\n%s", len(paths), out)
	}
	if paths[0][1] != "n1" || paths[0][2] != "5" || strings.Count(paths[0][3], "M") != 2 || strings.Count(paths[0][3], "L") != 3 {
		t.Errorf("n1's path: %q points %s d %q; want 5 points in 2 segments", paths[0][1], paths[0][2], paths[0][3])
	}
	if paths[1][1] != "a&#34;b" || paths[1][2] != "3" || strings.Count(paths[1][3], "M") != 3 || strings.Count(paths[1][3], "l0,0") != 3 {
		t.Errorf("second path: %q points %s d %q; want 3 dots", paths[1][1], paths[1][2], paths[1][3])
	}
	// The top of the y axis is 100 (80 rounded up), at y = chartTop; 0
	// at the bottom of the plot; x from chartLeft (t0) to the right edge.
	if !strings.HasPrefix(paths[0][3], fmt.Sprintf("M%d.0,%d.0 ", chartLeft, chartH-chartBottom)) {
		t.Errorf("n1's first point: %q", paths[0][3])
	}
	for _, want := range []string{">100</text>", ">50</text>", ">−1 min</text>", ">now</text>", "Routed &lt;by node&gt;", `data-chart="routed"`, "<svg xmlns"} {
		if !strings.Contains(out, want) {
			t.Errorf("chart lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "no data yet") {
		t.Error("a chart with data says no data yet")
	}
	empty := string(renderChart(chart{ID: "x", Series: []chartSeries{{Name: "n1"}}}, t0, t0.Add(time.Minute), every))
	if !strings.Contains(empty, "no data yet") || strings.Contains(empty, "<path") {
		t.Errorf("an empty chart:\n%s", empty)
	}
}

func TestChartScale(t *testing.T) {
	for _, tt := range []struct {
		v    float64
		want float64
		text string
	}{
		{0, 1, "1"}, {0.4, 1, "1"}, {1, 1, "1"}, {1.5, 2, "2"}, {3, 5, "5"}, {7, 10, "10"}, {10, 10, "10"},
		{11, 20, "20"}, {2400, 5000, "5k"}, {1.2e6, 2e6, "2M"},
	} {
		if got := niceCeil(tt.v); got != tt.want || compact(got) != tt.text {
			t.Errorf("niceCeil(%v) = %v (%s), want %v (%s)", tt.v, got, compact(got), tt.want, tt.text)
		}
	}
	// The window: from the first sample, at least a minute, at most HistorySpan.
	mk := func(secs ...int) []chart {
		var s chartSeries
		for _, sec := range secs {
			s.Points = append(s.Points, chartPoint{at: t0.Add(time.Duration(sec) * time.Second)})
		}
		return []chart{{Series: []chartSeries{s}}}
	}
	for _, tt := range []struct {
		secs     []int
		from, to int
	}{
		{[]int{0, 10}, -50, 10},
		{[]int{0, 300}, 0, 300},
		{[]int{0, 900}, 300, 900},
	} {
		from, to := chartWindow(mk(tt.secs...))
		if int(from.Sub(t0).Seconds()) != tt.from || int(to.Sub(t0).Seconds()) != tt.to {
			t.Errorf("window of %v: %v to %v, want %d to %d", tt.secs, from.Sub(t0), to.Sub(t0), tt.from, tt.to)
		}
	}
}

// fakeNode is a ready node with a fixed status.
type fakeNode struct{}

func (fakeNode) CheckReady() error { return nil }
func (fakeNode) Status(context.Context) router.Status {
	return router.Status{At: time.Now(), Node: "n1", Type: router.Local, Nodes: []router.NodeStatus{{Node: "n1", Live: true, Groups: 1}}}
}

// TestFirstRenderListsEvents: the first status request of a page whose
// events follower was idle lists the events stored, not "none"; without
// an events stream it says it is reading them, not "none".
func TestFirstRenderListsEvents(t *testing.T) {
	for _, stored := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream %v", stored), func(t *testing.T) {
			srv := natstest.RunServer(t)
			nc := srv.Connect()
			if stored {
				js, err := jetstream.New(nc)
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: router.EventsStream, Subjects: []string{proposals.SubjectEventsPrefix + ">"}}); err != nil {
					t.Fatal(err)
				}
				for i := range 3 {
					ev := fmt.Sprintf(`{"id":"%d","kind":"bind","group":"g%d","node":"n1","by":"h/n1","at":"2026-12-01T10:00:0%dZ"}`, i, i, i)
					if _, err := js.Publish(ctx, proposals.SubjectEventsPrefix+"bind", []byte(ev)); err != nil {
						t.Fatal(err)
					}
				}
			}
			s, err := New(Config{Node: fakeNode{}, Conn: nc})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = s.Run(ctx) }()
			defer func() { cancel(); <-done }()
			hs := httptest.NewServer(s.Handler())
			defer hs.Close()

			resp, err := http.Get(hs.URL + "/")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			page := string(body)
			events := regexp.MustCompile(`(?s)<h2>Latest events</h2>(.*)</main>`).FindStringSubmatch(page)
			if events == nil {
				t.Fatalf("no events section:\n%s", page)
			}
			if stored {
				if n := strings.Count(events[1], `data-kind="bind"`); n != 3 || strings.Contains(events[1], "none") {
					t.Errorf("first render lists %d of the 3 stored events:\n%s", n, events[1])
				}
				return
			}
			if !strings.Contains(events[1], "reading the events stream") || strings.Contains(events[1], "none") {
				t.Errorf("without an events stream, the first render says:\n%s", events[1])
			}
		})
	}
}

// A chart of whole counts labels its axis with whole numbers: a top of 1
// (0 / 0.5 / 1) becomes 2, a top of 5 (2.5 halfway) becomes 10.
func TestRenderCountsChart(t *testing.T) {
	labels := regexp.MustCompile(`fill="#777">([0-9.k]+)</text>`)
	for _, tc := range []struct {
		top    float64
		counts bool
		want   string
	}{
		{1, true, "[0 1 2]"},
		{4, true, "[0 5 10]"},
		{4, false, "[0 2.5 5]"},
		{1, false, "[0 0.5 1]"},
	} {
		c := chart{ID: "moves", Counts: tc.counts, Series: []chartSeries{{Name: "n1", color: 1, Points: []chartPoint{
			{at: t0, v: 0, ok: true}, {at: t0.Add(2 * time.Second), v: tc.top, ok: true}}}}}
		var got []string
		for _, m := range labels.FindAllStringSubmatch(string(renderChart(c, t0, t0.Add(time.Minute), 2*time.Second)), -1) {
			got = append(got, m[1])
		}
		if fmt.Sprint(got) != tc.want {
			t.Errorf("top %v, counts %v: labels %v, want %s", tc.top, tc.counts, got, tc.want)
		}
	}
}
