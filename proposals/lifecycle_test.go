package proposals

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/scripttest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// TestLifecycleScripts drives Transition with the scripts under
// testdata/lifecycle, in the style of etcd raft's data-driven tests. A
// script is a series of blocks: commands, a line "----", the expected
// output, a blank line. Commands:
//
//	live n1+ n2+:5 n3     live nodes: + has a queue consumer, :N bound groups
//	group NAME            the group (default g; "ungrouped" is "")
//	record none           the group has no record
//	record STATE k=v...   the record: node, from, through, prev, step, drain (a,b), rev, epoch, invalid
//	ingress N             the ingress stream's last sequence
//	OP k=v...             an input: by, node, from, seq, rev, kind, reason, count
//
// An input's output is the result; when it is accepted, the record written
// becomes the current one (at the next revision), so a script can follow a
// group through its whole life. Run with -rewrite to regenerate outputs.
func TestLifecycleScripts(t *testing.T) {
	scripttest.RunDir(t, "testdata/lifecycle", func() func(string) ([]string, error) {
		st := &scriptState{group: "g", live: map[string]NodeState{}, now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
		return func(cmd string) ([]string, error) {
			line, err := st.run(cmd)
			if line == "" {
				return nil, err
			}
			return []string{line}, err
		}
	})
}

// scriptState is what a script has set up so far.
type scriptState struct {
	group string
	cur   *kvbinding.Binding
	live  map[string]NodeState
	last  uint64
	now   time.Time
}

func (st *scriptState) run(cmd string) (string, error) {
	name, bare, kv := scripttest.Fields(cmd)
	num := func(k string) uint64 {
		n, _ := strconv.ParseUint(kv[k], 10, 64)
		return n
	}
	switch name {
	case "live":
		st.live = map[string]NodeState{}
		for _, a := range bare {
			id, groups, _ := strings.Cut(a, ":")
			ns := NodeState{}
			if strings.HasSuffix(id, "+") {
				id, ns.HasConsumer = strings.TrimSuffix(id, "+"), true
			}
			ns.Groups, _ = strconv.Atoi(groups)
			st.live[id] = ns
		}
		return "", nil
	case "group":
		st.group = bare[0]
		if st.group == "ungrouped" {
			st.group = ""
		}
		return "", nil
	case "ingress":
		st.last, _ = strconv.ParseUint(bare[0], 10, 64)
		return "", nil
	case "record":
		if len(bare) > 0 && bare[0] == "none" {
			st.cur = nil
			return "", nil
		}
		state := ""
		if len(bare) > 0 {
			state = bare[0]
		}
		r := &kvbinding.Binding{State: kvbinding.State(state), Node: kv["node"], FromSeq: num("from"), ThroughSeq: num("through"),
			PrevNode: kv["prev"], Step: kvbinding.Step(kv["step"]), Revision: num("rev"), Invalid: kv["invalid"] == "true",
			Routed: num("routed"), Ckpt: num("ckpt"), Epoch: num("epoch")}
		if r.Epoch == 0 {
			r.Epoch = r.Revision
		}
		if kv["drain"] != "" {
			r.Drain = strings.Split(kv["drain"], ",")
		}
		if r.Invalid {
			r.State = ""
		}
		st.cur = r
		return "", nil
	}
	in := Input{Op: Op(name), By: kv["by"], Node: kv["node"], From: kv["from"], Seq: num("seq"), First: num("first"), Rev: num("rev"),
		Kind: kv["kind"], Reason: strings.ReplaceAll(kv["reason"], "_", " "), Routed: num("routed"), Ckpt: num("ckpt"), Clean: kv["clean"] == "true"}
	in.Count, _ = strconv.Atoi(kv["count"])
	var before *kvbinding.Binding
	if st.cur != nil {
		c := *st.cur
		before = &c
	}
	liveBefore := fmt.Sprint(st.live)
	res := Transition(st.group, st.cur, in, Env{Now: st.now, Handler: "h/n0", Live: st.live, IngressLast: st.last})
	if !reflect.DeepEqual(before, st.cur) || fmt.Sprint(st.live) != liveBefore {
		return "", fmt.Errorf("Transition modified its arguments")
	}
	line := describe(res, st.cur)
	if res.Write != nil {
		if err := res.Write.Validate(); err != nil {
			return "", fmt.Errorf("Transition wrote an invalid record %+v: %v", *res.Write, err)
		}
		rev := uint64(1)
		if st.cur != nil {
			rev = st.cur.Revision + 1
		}
		w := *res.Write
		w.Revision = rev
		r := w.Cached()
		st.cur = &r
	}
	return line, nil
}

// describe formats a result for the scripts.
func describe(res Result, cur *kvbinding.Binding) string {
	var b strings.Builder
	b.WriteString(string(res.Outcome))
	if w := res.Write; w != nil {
		b.WriteString(": ")
		b.WriteString(recordString(w))
		switch {
		case res.Create:
			b.WriteString(" (create")
		case cur != nil:
			fmt.Fprintf(&b, " (cas %d", cur.Revision)
		}
		if res.Ended {
			b.WriteString(", ttl")
		}
		b.WriteString(")")
		if len(res.Pause) > 0 {
			fmt.Fprintf(&b, " pause=%s", strings.Join(res.Pause, ","))
		}
	} else if res.Reason != "" {
		b.WriteString(": " + res.Reason)
	}
	if res.Err != nil {
		fmt.Fprintf(&b, " [%v]", res.Err)
	}
	if e := res.Event; e != nil {
		fmt.Fprintf(&b, " event=%s", e.Kind)
	}
	return b.String()
}

func recordString(w *kvbinding.Binding) string {
	parts := []string{string(w.State)}
	add := func(k, v string) {
		if v != "" && v != "0" {
			parts = append(parts, k+"="+v)
		}
	}
	add("node", w.Node)
	add("from", strconv.FormatUint(w.FromSeq, 10))
	if w.State == kvbinding.StateReleased || w.State == kvbinding.StateDeadLettered {
		parts = append(parts, "through="+strconv.FormatUint(w.ThroughSeq, 10))
	}
	add("prev", w.PrevNode)
	add("step", string(w.Step))
	add("routed", strconv.FormatUint(w.Routed, 10))
	add("ckpt", strconv.FormatUint(w.Ckpt, 10))
	add("epoch", strconv.FormatUint(w.Epoch, 10))
	if len(w.Drain) > 0 {
		d := append([]string(nil), w.Drain...)
		sort.Strings(d)
		parts = append(parts, "drain="+strings.Join(d, ","))
	}
	add("proposed_by", w.ProposedBy)
	if w.Reason != "" {
		parts = append(parts, strconv.Quote(w.Reason))
	}
	return strings.Join(parts, " ")
}

// TestTransitionIsPure checks that Transition neither changes its input
// nor depends on anything but its arguments.
func TestTransitionIsPure(t *testing.T) {
	live := map[string]NodeState{"n0": {HasConsumer: true, Groups: 1}, "n1": {HasConsumer: true}}
	cur := &kvbinding.Binding{State: kvbinding.StateBound, Node: "n0", FromSeq: 3, Revision: 7}
	now := time.Unix(100, 0)
	for _, in := range []Input{
		{Op: OpBind, By: "n1", Node: "n5", Seq: 4},
		{Op: OpMove, By: "operator", Node: "n1"},
		{Op: OpEvacuate, By: "h", From: "n0", Node: "n1", Seq: 9},
	} {
		first := Transition("g", cur, in, Env{Now: now, Handler: "h", Live: live})
		for i := 0; i < 50; i++ {
			if got := Transition("g", cur, in, Env{Now: now, Handler: "h", Live: live}); !reflect.DeepEqual(got, first) {
				t.Fatalf("%s: Transition changed its answer: %+v vs %+v", in.Op, got, first)
			}
		}
	}
	if live["n0"].Groups != 1 || len(live) != 2 || cur.Node != "n0" || cur.Revision != 7 {
		t.Fatalf("Transition modified its arguments: %v %+v", live, cur)
	}
}
