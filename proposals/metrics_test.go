package proposals

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/grouprouter/grouprouter/kvbinding"
)

func TestMetricsMoveDuration(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	moving := kvbinding.Binding{Group: "g", State: kvbinding.StateMoving, Node: "n2", PrevNode: "n1", FromSeq: 1}
	drain := kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n2", PrevNode: "n1", FromSeq: 5, Step: kvbinding.StepDrain, Drain: []string{"n1"}}
	catchUp := kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n2", PrevNode: "n1", FromSeq: 5, Step: kvbinding.StepCatchUp}
	settled := kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n2", PrevNode: "n1", FromSeq: 5}
	released := kvbinding.Binding{Group: "g", State: kvbinding.StateReleased, PrevNode: "n1", ThroughSeq: 4}
	type write struct {
		at    time.Duration
		cause string
		b     kvbinding.Binding
	}
	tests := []struct {
		name   string
		writes []write
		want   []float64 // observed durations, seconds
		moves  map[string]float64
	}{
		{name: "binds alone observe nothing", writes: []write{{0, "", settled}, {time.Second, "", settled}}},
		{name: "operator move to settled", writes: []write{
			{0, causeOperator, moving}, {time.Second, "", drain}, {2 * time.Second, "", catchUp}, {3 * time.Second, "", settled},
		}, want: []float64{3}, moves: map[string]float64{causeOperator: 1}},
		{name: "unbind ends released", writes: []write{{0, causeOperator, moving}, {500 * time.Millisecond, "", released}},
			want: []float64{0.5}, moves: map[string]float64{causeOperator: 1}},
		{name: "redirected move keeps its first record's time", writes: []write{
			{0, causeOperator, moving}, {10 * time.Second, causeFenceOverdue, drain}, {12 * time.Second, "", settled},
		}, want: []float64{12}, moves: map[string]float64{causeOperator: 1, causeFenceOverdue: 1}},
		{name: "evacuation", writes: []write{{0, causeNodeGone, drain}, {time.Second, "", catchUp}, {4 * time.Second, "", settled}},
			want: []float64{4}, moves: map[string]float64{causeNodeGone: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMetrics()
			for _, w := range tc.writes {
				m.written("g", w.cause, w.b, t0.Add(w.at))
			}
			var d dto.Metric
			if err := m.moveDuration.Write(&d); err != nil {
				t.Fatal(err)
			}
			var sum float64
			for _, v := range tc.want {
				sum += v
			}
			if h := d.GetHistogram(); h.GetSampleCount() != uint64(len(tc.want)) || h.GetSampleSum() != sum {
				t.Errorf("move durations: %d summing to %vs, want %v", h.GetSampleCount(), h.GetSampleSum(), tc.want)
			}
			for i, c := range moveCauses {
				if got := float64(m.moves[i].Load()); got != tc.moves[c] {
					t.Errorf("moves %s: %v, want %v", c, got, tc.moves[c])
				}
			}
			if len(m.moveStarts) != 0 || m.moving.Load() != 0 {
				t.Errorf("moves left in progress: %v", m.moveStarts)
			}
		})
	}
}

func TestMetricsPrune(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	m := NewMetrics()
	moving := kvbinding.Binding{State: kvbinding.StateMoving, Node: "n2", PrevNode: "n1", FromSeq: 1}
	for _, g := range []string{"a", "b", "c"} {
		moving.Group = g
		m.written(g, causeOperator, moving, t0)
	}
	moving.Group = "d"
	m.written("d", causeOperator, moving, t0.Add(2*time.Second))
	// At t0+1s the cache still shows a as moving; b and c ended some other
	// way; d started after the snapshot and must stay.
	m.prune(map[string]kvbinding.Binding{"a": {State: kvbinding.StateMoving}}, t0.Add(time.Second))
	if _, a := m.moveStarts["a"]; !a || len(m.moveStarts) != 2 || m.moving.Load() != 2 {
		t.Errorf("after prune: %v (moving %d), want a and d", m.moveStarts, m.moving.Load())
	}
}

func TestMetricsDecisions(t *testing.T) {
	m := NewMetrics()
	m.decided(OpBind, Accepted)
	m.decided(OpBind, Accepted)
	m.decided(OpFence, Refused)
	m.decided(Op("bogus"), Failed)
	m.decided(OpBind, Outcome("nonsense")) // not counted
	h := &Handler{metrics: m}
	m.h.Store(h)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	n, err := testutil.GatherAndCount(reg, "grouprouter_decisions_total")
	if err != nil || n != len(metricOps)*len(metricOutcomes)+1 {
		t.Fatalf("%d decision series (%v), want every op and outcome plus the other op seen", n, err)
	}
	want := map[[2]string]float64{{"bind", "accepted"}: 2, {"fence", "refused"}: 1, {"other", "failed"}: 1}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "grouprouter_decisions_total" {
			continue
		}
		for _, metric := range mf.GetMetric() {
			key := [2]string{metric.GetLabel()[0].GetValue(), metric.GetLabel()[1].GetValue()}
			if got := metric.GetCounter().GetValue(); got != want[key] {
				t.Errorf("decisions %v: %v, want %v", key, got, want[key])
			}
		}
	}
}
