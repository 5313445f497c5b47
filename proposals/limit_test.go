package proposals

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

func TestTransitionBindAtGroupLimit(t *testing.T) {
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	live := map[string]NodeState{"n1": {HasConsumer: true}, "n2": {HasConsumer: true}}
	released := &kvbinding.Binding{State: kvbinding.StateReleased, PrevNode: "n1", ThroughSeq: 40, Revision: 7}
	bound := &kvbinding.Binding{State: kvbinding.StateBound, Node: "n2", FromSeq: 10, Revision: 3}
	for _, tc := range []struct {
		name       string
		group      string
		cur        *kvbinding.Binding
		bound, max int
		want       Outcome
	}{
		{"under the limit", "g", nil, 2, 3, Accepted},
		{"at the limit: refused", "g", nil, 3, 3, Refused},
		{"past the limit (a handler that took over counts more): refused", "g", nil, 5, 3, Refused},
		{"no limit", "g", nil, 5, 0, Accepted},
		{"an ended record is a new binding: refused", "g", released, 3, 3, Refused},
		{"a bound group's record answers, whatever the limit", "g", bound, 3, 3, Rejected},
		{"the ungrouped routing binding is not a group", "", nil, 3, 3, Accepted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Transition(tc.group, tc.cur, Input{Op: OpBind, By: "n1", Node: "n1", Seq: 50},
				Env{Now: now, Handler: "h/n1", Live: live, Bound: tc.bound, MaxGroups: tc.max})
			if res.Outcome != tc.want {
				t.Fatalf("outcome %s (%s), want %s", res.Outcome, res.Reason, tc.want)
			}
			if refused := res.Outcome == Refused; refused != errors.Is(res.Err, ErrGroupLimit) || refused != (res.Limit > 0 && res.Limit == tc.max) || refused && res.Write != nil {
				t.Fatalf("refused %v: err %v, limit %d, write %+v", refused, res.Err, res.Limit, res.Write)
			}
		})
	}
}

// TestHandlerGroupLimit: one request of five new groups against a limit
// of three binds three and refuses two (the batch counts its own binds);
// a bound group is still answered with its record; once a record is gone,
// a new group binds again.
func TestHandlerGroupLimit(t *testing.T) {
	s := natstest.RunServer(t)
	env := startHandler(t, s, "h1", liveNodes, func(c *HandlerConfig) { c.MaxGroups = 3 })
	natstest.Eventually(t, 5*time.Second, func() error {
		if !env.h.Active() {
			return natstest.ErrNotYet
		}
		return nil
	})
	ctx := context.Background()
	c := NewClient(s.Connect(), "n1", 5*time.Second)
	ps := make([]Proposal, 5)
	for i := range ps {
		ps[i] = Proposal{Group: fmt.Sprintf("g%d", i), Node: "n1", Seq: uint64(10 + i)}
	}
	ds, err := c.Propose(ctx, ps)
	if err != nil {
		t.Fatal(err)
	}
	accepted := 0
	for i, d := range ds {
		switch d.Outcome {
		case Accepted:
			accepted++
		case Refused:
			if d.Limit != 3 || !strings.Contains(d.Error, "--max-groups") {
				t.Errorf("g%d refused with limit %d, %q", i, d.Limit, d.Error)
			}
		default:
			t.Errorf("g%d: %+v", i, d)
		}
	}
	if accepted != 3 || env.h.LimitRefused() != 2 {
		t.Fatalf("%d accepted, %d refused at the limit; want 3 and 2: %+v", accepted, env.h.LimitRefused(), ds)
	}
	natstest.Eventually(t, 5*time.Second, func() error {
		if n := env.h.cache.Bound(); n != 3 {
			return fmt.Errorf("cache counts %d bound, want 3", n)
		}
		return nil
	})

	// A bound group asking again gets its record, not a refusal.
	d, err := c.Propose(ctx, []Proposal{{Group: ds0Group(ds), Node: "n2", Seq: 30}})
	if err != nil || d[0].Outcome != Rejected {
		t.Fatalf("bound group: %+v, %v; want rejected (its record stands)", d, err)
	}

	// Room again once a record is gone (an ended record expires so).
	rec, ok := env.h.cache.Lookup(ds0Group(ds))
	if !ok {
		t.Fatal("no record of the first accepted group")
	}
	if err := env.h.store.Delete(ctx, rec.Group, rec.Revision); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() error {
		if n := env.h.cache.Bound(); n != 2 {
			return fmt.Errorf("cache counts %d bound, want 2", n)
		}
		return nil
	})
	d, err = c.Propose(ctx, []Proposal{{Group: "late", Node: "n1", Seq: 40}, {Group: "later", Node: "n1", Seq: 41}})
	if err != nil || d[0].Outcome != Accepted || d[1].Outcome != Refused || d[1].Limit != 3 {
		t.Fatalf("after a record went: %+v, %v; want the first accepted, the second refused", d, err)
	}
}

// ds0Group returns the group of the first accepted decision.
func ds0Group(ds []Decision) string {
	for _, d := range ds {
		if d.Outcome == Accepted {
			return d.Group
		}
	}
	return ""
}

// A group dead-lettered while no node owned it (refused at the group
// limit) is dead-lettered again from any later message: every node holds
// all of its messages after the record's end. After a record that names
// the node that routed it last, only from the message right after the end.
func TestTransitionDeadLetterAgain(t *testing.T) {
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	env := Env{Now: now, Handler: "h/n1", Live: map[string]NodeState{"n1": {HasConsumer: true}}, IngressLast: 100}
	unowned := &kvbinding.Binding{State: kvbinding.StateDeadLettered, ThroughSeq: 10, Revision: 4}
	owned := &kvbinding.Binding{State: kvbinding.StateDeadLettered, PrevNode: "n2", ThroughSeq: 10, Revision: 4}
	for _, tc := range []struct {
		name        string
		cur         *kvbinding.Binding
		first, last uint64
		want        Outcome
	}{
		{"unowned, later messages", unowned, 15, 20, Accepted},
		{"unowned, right after the end", unowned, 11, 11, Accepted},
		{"unowned, covered by the record already", unowned, 5, 8, Rejected},
		{"unowned, starting inside the end", unowned, 9, 12, Refused},
		{"owned before, a gap after the end", owned, 15, 20, Refused},
		{"owned before, right after the end", owned, 11, 20, Accepted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Transition("g", tc.cur, Input{Op: OpDeadLetter, By: "n1", First: tc.first, Seq: tc.last, Count: 2, Reason: "limit"}, env)
			if res.Outcome != tc.want {
				t.Fatalf("outcome %s (%s), want %s", res.Outcome, res.Reason, tc.want)
			}
		})
	}
}

// TestGroupLimitCountsAWrittenGroupOnce: a new group's record can reach
// the handler's cache through the watch before its own write is
// acknowledged, while the group is still reserved. The limit counts it
// once then, not twice: with a limit of 2 and one group bound, a second
// new group is bound (TestGroupLimit once dead-lettered a new group so,
// at 19 bound of 20); a third is refused, before and after the
// reservation ends.
func TestGroupLimitCountsAWrittenGroupOnce(t *testing.T) {
	s := natstest.RunServer(t)
	env := startHandler(t, s, "h1", liveNodes, func(c *HandlerConfig) { c.MaxGroups = 2 })
	natstest.Eventually(t, 5*time.Second, func() error {
		if !env.h.Active() {
			return natstest.ErrNotYet
		}
		return nil
	})
	ctx := context.Background()
	// g1 decided and reserved, its record stored and applied by the
	// watch, its PubAck not yet handled (writeAll's stored not yet run).
	env.h.limit.decide(env.h.cache, "g1", func(int) bool { return true })
	if _, err := env.h.store.Create(ctx, kvbinding.Binding{Group: "g1", State: kvbinding.StateBound, Node: "n1", FromSeq: 10}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() error {
		if n := env.h.cache.Bound(); n != 1 {
			return fmt.Errorf("cache counts %d bound, want 1", n)
		}
		return nil
	})
	c := NewClient(s.Connect(), "n1", 5*time.Second)
	propose := func(group string, seq uint64, want Outcome) {
		t.Helper()
		ds, err := c.Propose(ctx, []Proposal{{Group: group, Node: "n1", Seq: seq}})
		if err != nil {
			t.Fatal(err)
		}
		if ds[0].Outcome != want {
			t.Fatalf("%s: %s (%s), want %s", group, ds[0].Outcome, ds[0].Error, want)
		}
	}
	propose("g2", 11, Accepted)
	propose("g3", 12, Refused)
	env.h.limit.release(env.h.cache, "g1")
	propose("g4", 13, Refused)
}
