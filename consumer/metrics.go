package consumer

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are Consume's Prometheus metrics, all prefixed
// grouprouter_consumer_ and labelled by node only.
type metrics struct {
	processed, retries, parkedMsgs, redelivered, stale, duplicates prometheus.Counter
	collectors                                                     []prometheus.Collector
}

// newMetrics builds the metrics; the gauges read s under mu at scrape
// time through gauge.
func newMetrics(node string, gauge func(func(*laneSet) float64) func() float64, parkedGroups func() float64) *metrics {
	labels := prometheus.Labels{"node": node}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "grouprouter", Subsystem: "consumer", Name: name, Help: help, ConstLabels: labels})
	}
	gaugeFunc := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "grouprouter", Subsystem: "consumer", Name: name, Help: help, ConstLabels: labels}, f)
	}
	m := &metrics{
		processed:   counter("processed_total", "Messages whose handler succeeded and that were acknowledged."),
		retries:     counter("retries_total", "Failed handler attempts that are retried after a backoff."),
		parkedMsgs:  counter("parked_messages_total", "Messages moved to the parked stream."),
		redelivered: counter("redeliveries_held_total", "Redelivered messages put back in order in their lane (or merged with the copy held)."),
		stale:       counter("stale_dropped_total", "Copies of an older epoch than their group showed, dropped unprocessed."),
		duplicates:  counter("duplicates_dropped_total", "Deliveries at or below their group's done mark, dropped."),
	}
	m.collectors = []prometheus.Collector{m.processed, m.retries, m.parkedMsgs, m.redelivered, m.stale, m.duplicates,
		gaugeFunc("lanes_in_use", "Groups with a message held or running.", gauge(func(s *laneSet) float64 { return float64(s.active()) })),
		gaugeFunc("in_flight", "Handlers running.", gauge(func(s *laneSet) float64 { return float64(s.running) })),
		gaugeFunc("held", "Messages held in lanes, waiting for their turn.", gauge(func(s *laneSet) float64 { return float64(s.held) })),
		gaugeFunc("parked_groups", "Groups recorded as parked.", parkedGroups),
	}
	return m
}

// register registers every metric with r; nil registers nothing.
func (m *metrics) register(r prometheus.Registerer) error {
	if r == nil {
		return nil
	}
	for _, c := range m.collectors {
		if err := r.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return fmt.Errorf("%w: metrics already registered (one Consume per node and registry): %v", ErrConfig, err)
			}
			return fmt.Errorf("%w: metrics: %v", ErrConfig, err)
		}
	}
	return nil
}

// unregister undoes register.
func (m *metrics) unregister(r prometheus.Registerer) {
	if r == nil {
		return
	}
	for _, c := range m.collectors {
		r.Unregister(c)
	}
}
