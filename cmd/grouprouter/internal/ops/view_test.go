package ops

import (
	"fmt"
	"html/template"
	"strings"
	"testing"
	"time"
)

func TestRateSampler(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration, routed uint64, nodes map[string]uint64) sample {
		return sample{at: t0.Add(d), routed: routed, ingress: 2 * routed, nodes: nodes}
	}
	var rs rateSampler
	steps := []struct {
		name   string
		s      sample
		ok     bool
		routed float64 // per second
		nodes  map[string]float64
		kept   int // samples kept after the step
	}{
		{name: "first request: no rate yet", s: at(0, 100, map[string]uint64{"a": 10}), kept: 1},
		{name: "too soon after: no rate, not kept", s: at(500*time.Millisecond, 150, nil), kept: 1},
		{name: "2 s later", s: at(2*time.Second, 300, map[string]uint64{"a": 30, "b": 5}), ok: true, routed: 100,
			nodes: map[string]float64{"a": 10}, kept: 2},
		{name: "a burst 10 ms later: rate, not kept", s: at(2010*time.Millisecond, 300, nil), ok: true, routed: 200 / 2.01, kept: 2},
		{name: "counter reset (node restarted)", s: at(4*time.Second, 40, map[string]uint64{"a": 1}), ok: true, routed: 10,
			nodes: map[string]float64{"a": 0.25}, kept: 3},
		{name: "window slides: base is 4 s", s: at(12500*time.Millisecond, 1040, nil), ok: true, routed: (1040 - 40) / 8.5, kept: 2},
	}
	for _, st := range steps {
		r, nodes, ok := rs.observe(st.s)
		if ok != st.ok || fmt.Sprintf("%.3f", r.Routed) != fmt.Sprintf("%.3f", st.routed) ||
			(ok && fmt.Sprintf("%.3f", r.Ingress) != fmt.Sprintf("%.3f", 2*st.routed) && st.name != "counter reset (node restarted)") {
			t.Errorf("%s: rates %+v ok=%v, want routed %.3f/s ok=%v", st.name, r, ok, st.routed, st.ok)
		}
		if st.nodes != nil && fmt.Sprint(nodes) != fmt.Sprint(st.nodes) {
			t.Errorf("%s: node rates %v, want %v", st.name, nodes, st.nodes)
		}
		if len(rs.samples) != st.kept {
			t.Errorf("%s: %d samples kept, want %d", st.name, len(rs.samples), st.kept)
		}
	}
}

func TestEventRings(t *testing.T) {
	e := newEventRings(3)
	e.start()
	for i := range 10 {
		kind := "bind"
		if i == 2 || i == 5 {
			kind = "move"
		}
		e.add("grouping.events."+kind, fmt.Appendf(nil, `{"id":"%d","kind":"%s","group":"g%d","by":"h/n0","at":"2026-12-01T10:00:0%d.000Z"}`, i, kind, i, i))
	}
	e.add("grouping.events.handoff", []byte("{not json"))
	// Progress events: the latest per step, not among the latest events.
	for i, p := range []struct{ node, step, group string }{
		{"n1", "catchup", ""}, {"n2", "drain", "g1"}, {"n1", "catchup", ""}, {"n2", "drain", "g2"}, {"n1", "catchup", ""},
	} {
		e.add("grouping.events.progress", fmt.Appendf(nil, `{"id":"p%d","kind":"progress","group":%q,"node":%q,"step":%q,"count":%d,"total":50,"groups":3,"by":%q,"at":"2026-12-01T10:00:1%d.000Z"}`,
			i, p.group, p.node, p.step, 10*(i+1), p.node, i))
	}
	all, moves, steps, following, _ := e.latest()
	var got []string
	for _, ev := range all {
		got = append(got, ev.Kind+":"+ev.Group)
	}
	if fmt.Sprint(got) != "[handoff: bind:g9 bind:g8]" || !following {
		t.Errorf("latest events %v (following %v), want the 3 newest, newest first", got, following)
	}
	got = got[:0]
	for _, ev := range moves {
		got = append(got, ev.Kind+":"+ev.Group)
	}
	if fmt.Sprint(got) != "[handoff: move:g5 move:g2]" {
		t.Errorf("latest moves %v: want the moves and hand-offs, kept apart from the binds", got)
	}
	if moves[0].Reason == "" {
		t.Error("an undecodable event is listed without saying so")
	}
	got = got[:0]
	for _, ev := range steps {
		got = append(got, fmt.Sprintf("%s/%s/%s:%d", ev.Node, ev.Step, ev.Group, ev.Count))
	}
	if fmt.Sprint(got) != "[n1/catchup/:50 n2/drain/g2:40 n2/drain/g1:20]" {
		t.Errorf("steps %v: want the latest progress of each step, newest first", got)
	}
	for i := range 2 * maxSteps {
		e.add("grouping.events.progress", fmt.Appendf(nil, `{"id":"q%d","kind":"progress","group":"x%d","node":"n3","step":"drain","count":1}`, i, i))
	}
	if _, _, steps, _, _ := e.latest(); len(steps) != maxSteps || steps[0].Group != fmt.Sprintf("x%d", 2*maxSteps-1) {
		t.Errorf("%d steps kept (newest %q), want the %d newest", len(steps), steps[0].Group, maxSteps)
	}
	e.stop()
	e.start()
	if all, moves, steps, _, _ := e.latest(); len(all) != 0 || len(moves) != 0 || len(steps) != 0 {
		t.Errorf("restarted follower kept %d events, %d moves, %d steps", len(all), len(moves), len(steps))
	}
}

// TestPageListsSteps: the page renders the steps table from the steps kept.
func TestPageListsSteps(t *testing.T) {
	page, err := template.New("status").Funcs(pageFuncs()).Parse(statusPage)
	if err != nil {
		t.Fatal(err)
	}
	e := newEventRings(5)
	e.start()
	e.add("grouping.events.progress", []byte(`{"id":"1","kind":"progress","node":"n2","step":"catchup","count":300,"total":1200,"groups":66,"by":"n2","at":"2026-12-01T10:00:00Z"}`))
	e.add("grouping.events.progress", []byte(`{"id":"2","kind":"progress","group":"g7","node":"n1","prev_node":"n0","step":"drain","count":40,"by":"n1","reason":"done","at":"2026-12-01T10:00:01Z"}`))
	var v view
	v.Events, v.Moves, v.Steps, v.Following, v.EventsLoaded = e.latest()
	var out strings.Builder
	if err := page.Execute(&out, v); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`data-step="catchup"`, "300 of 1200 (25%)", "<td>running</td>", `data-step="drain"`, "<td>g7</td><td>n0</td>", "<td>done</td>"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

// TestPageListsParkedGroups: the page renders the parked groups, says how
// many there are when it shows the first of them only, and says why it
// could not read them.
func TestPageListsParkedGroups(t *testing.T) {
	page, err := template.New("status").Funcs(pageFuncs()).Parse(statusPage)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		parked *parkedList
		want   []string
	}{
		{"some", &parkedList{Total: 2, Groups: []parkedV{
			{Group: "g1", Node: "n1", At: at, Attempts: 5, Reason: "store down", Messages: 3},
			{Group: "g2", Node: "n2", At: at, Attempts: 1, Reason: "x", Messages: 1, Replay: "retry"},
		}}, []string{"Parked groups <span class=\"dim\">(2)</span>", "<td>g1</td><td>n1</td><td>2026-12-01 10:00:00</td>", "store down",
			"waits for grouprouter retry", "<td>retry</td>"}},
		{"the first of many", &parkedList{Total: 40, Groups: []parkedV{{Group: "g1", Node: "n1", At: at}}},
			[]string{"(40, the first 1 by id)", "<td>g1</td>"}},
		{"none", &parkedList{}, []string{"Parked groups <span class=\"dim\">(0)</span></h2>\n<p class=\"dim\">none</p>"}},
		{"unreadable", &parkedList{Error: "permissions violation"}, []string{`id="parked-error"`, "not read: permissions violation"}},
		{"no connection", nil, []string{"no NATS connection to read them with"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			if err := page.Execute(&out, view{Parked: tc.parked, EventsLoaded: true}); err != nil {
				t.Fatal(err)
			}
			for _, want := range tc.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("page lacks %q", want)
				}
			}
		})
	}
}
