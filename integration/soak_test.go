package integration

// The soak test: producers, consumers and random faults of every kind the
// lifecycle handles, one at a time, then a check of every message.
//
//	go test -race -run TestSoak ./integration/                      # CI size (~40s of faults)
//	GROUPROUTER_SOAK=10m go test -timeout 0 -run TestSoak ./integration/
//	GROUPROUTER_SOAK_SEED=<seed> go test -run TestSoak ./integration/  # same fault sequence

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// Fault kinds of the soak.
const (
	faultKillNode      = "kill-node"
	faultStopNode      = "stop-node"
	faultConsumer      = "restart-consumer"
	faultServer        = "restart-server"
	faultMove          = "move-group"
	faultKillHandler   = "kill-active-handler"
	soakDefault        = 40 * time.Second
	soakDrainDeadline  = 90 * time.Second // > the queue consumers' 30s ack wait
	soakProducers      = 3
	soakSlotsPerProd   = 13 // ~40 groups at a time
	soakRotateAfter    = 50 // messages per group, then a new group in its slot
	soakPublishEvery   = 10 * time.Millisecond
	soakHealthDeadline = 60 * time.Second
)

var soakFaults = []string{faultKillNode, faultStopNode, faultConsumer, faultServer, faultMove, faultKillHandler}

// faultSpan is one injected fault, from injection to healed.
type faultSpan struct {
	kind, target string
	from, to     time.Time
	// downs: a rolling restart's servers, each from its stop to its
	// restart.
	downs []faultSpan
}

func (f faultSpan) String() string {
	return fmt.Sprintf("%s %s at %s-%s", f.kind, f.target, f.from.Format("15:04:05.000"), f.to.Format("15:04:05.000"))
}

// during returns the faults overlapping [from, to].
func during(spans []faultSpan, from, to time.Time) string {
	var out []string
	for _, f := range spans {
		if !f.to.Before(from) && !f.from.After(to) {
			out = append(out, f.String())
		}
	}
	if len(out) == 0 {
		return "no fault"
	}
	return strings.Join(out, "; ")
}

func soakDuration(t *testing.T) time.Duration {
	d := soakDefault
	if v := os.Getenv("GROUPROUTER_SOAK"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			t.Fatalf("GROUPROUTER_SOAK=%q: want a duration such as 10m", v)
		}
	}
	// Leave the end of the test (drain, checks) its time within go test's -timeout.
	if dl, ok := t.Deadline(); ok {
		if left := time.Until(dl) - soakDrainDeadline - time.Minute; d > left {
			t.Logf("soak shortened from %v to %v to fit the test timeout (run with -timeout 0 for the full length)", d, left.Round(time.Second))
			d = left
		}
	}
	return d
}

func soakSeed(t *testing.T) uint64 {
	if v := os.Getenv("GROUPROUTER_SOAK_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("GROUPROUTER_SOAK_SEED=%q: %v", v, err)
		}
		return s
	}
	return uint64(time.Now().UnixNano())
}

// Three servers, n0 LOCAL, n1 LOCAL (hot backup), n2 REMOTE, each on its
// own server with an application consumer of its queue; three producers
// publish numbered messages over ~40 groups at a time (each group replaced
// by a new one after 50 messages, so decisions keep happening). A fault
// injector does, one at a time at random intervals: kill+restart a node,
// graceful stop+restart a node, stop+restart a consumer (long enough, at
// times, for consumer-loss rebinding), stop+restart a NATS server, an
// operator move of a random group, kill+restart the node of the active
// LOCAL handler. After the last fault everything is healed, producers
// stop, and every message must have been processed exactly once and in
// order within its group, with nothing left on the queues.
func TestSoak(t *testing.T) {
	t.Parallel() // see doc.go
	dur := soakDuration(t)
	seed := soakSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	t.Logf("soak: %v of faults, seed %d (replay the fault sequence with GROUPROUTER_SOAK_SEED=%d)", dur, seed, seed)

	c := natstest.RunCluster(t, 3)
	cfg := func(id string, typ router.HandlerType) router.Config {
		cf := testConfig(id, typ)
		cf.NodeGrace = 3 * time.Second
		cf.RebindAfter = 2 * time.Second
		return cf
	}
	nodes := []*node{
		startNode(t, c.Servers[0].URL(), cfg("n0", router.Local)),
		startNode(t, c.Servers[1].URL(), cfg("n1", router.Local)),
		startNode(t, c.Servers[2].URL(), cfg("n2", router.Remote)),
	}
	var col timedCollector
	consumers := make([]*appConsumer, len(nodes))
	for i, n := range nodes {
		consumers[i] = startAppConsumer(t, c.Servers[i].URL(), n.id, &col)
	}
	admin := natstest.Connect(t, c.URLs(), nats.Name("soak-admin"))
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	waitEligible(t, admin, all3, all3)
	st := openStore(t, admin)
	var ps []*loadProducer
	for i := range soakProducers {
		ps = append(ps, startLoad(t, c.Servers[i%len(c.Servers)].URL(), fmt.Sprintf("p%d", i),
			soakSlotsPerProd, soakRotateAfter, soakPublishEvery))
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		if n := col.len(); n < 100 {
			return fmt.Errorf("%d of 100 consumed before the first fault", n)
		}
		return nil
	})

	healthy := func() {
		t.Helper()
		waitStreamsCurrent(t, js, soakHealthDeadline, streamsOfTheRouter...)
		waitEligible(t, admin, all3, all3)
	}
	pause := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)))
	}
	counts := map[string]int{}
	var spans []faultSpan
	var moveErrs []string
	var bag []string // every kind once per round, in a random order
	start := time.Now()
	for time.Since(start) < dur {
		time.Sleep(pause(500*time.Millisecond, 2*time.Second))
		if len(bag) == 0 {
			bag = append(bag, soakFaults...)
			rng.Shuffle(len(bag), func(i, j int) { bag[i], bag[j] = bag[j], bag[i] })
		}
		kind := bag[0]
		bag = bag[1:]
		span := faultSpan{kind: kind, from: time.Now()}
		switch kind {
		case faultKillNode, faultStopNode:
			n := nodes[rng.IntN(len(nodes))]
			span.target = n.id
			if kind == faultKillNode {
				crash(t, n)
			} else {
				n.stop()
			}
			time.Sleep(pause(time.Second, 3*time.Second))
			n.restart()
		case faultKillHandler:
			n := waitActiveHandler(t, 20*time.Second, nodes[0], nodes[1])
			span.target = n.id
			crash(t, n)
			time.Sleep(pause(time.Second, 3*time.Second))
			n.restart()
		case faultConsumer:
			i := rng.IntN(len(consumers))
			span.target = consumers[i].node
			consumers[i].stop()
			time.Sleep(pause(time.Second, 4*time.Second))
			consumers[i].start()
		case faultServer:
			s := c.Servers[rng.IntN(len(c.Servers))]
			span.target = s.Name()
			s.Stop()
			time.Sleep(pause(time.Second, 3*time.Second))
			s.Restart()
		case faultMove:
			span.target = soakMove(t, rng, ps, st, admin, &moveErrs)
		}
		healthy()
		span.to = time.Now()
		spans = append(spans, span)
		counts[kind]++
		t.Logf("fault %d: %s", len(spans), span)
	}

	haltAll(t, ps...)
	want, total := sentAll(ps...)
	col.waitConsumed(t, want, soakDrainDeadline)
	got := col.all()
	where := checkDelivered(t, got, want, false, true)
	waitQueuesEmpty(t, js, 30*time.Second)
	for _, a := range consumers {
		if n := a.ackErr.Load(); n > 0 {
			t.Errorf("consumer of %s gave up on %d acks", a.node, n)
		}
	}

	// Measurements.
	acked, firsts := ackTimes(ps...)
	stall, stallGroup := soakDecisionStall(got, firsts)
	movePause, moveGroup, moveFrom, moveTo, moves := soakMovePause(got)
	longestWait, waitBody, waitFrom, waitTo := soakLongestWait(got, acked)
	retries, dups := retriesOf(ps...)
	moved := 0
	for _, w := range where {
		if len(w) > 1 {
			moved++
		}
	}
	var cs []string
	for _, k := range sortedKeys(counts) {
		cs = append(cs, fmt.Sprintf("%s=%d", k, counts[k]))
	}
	t.Logf("soak: %d messages in %d groups; %d groups changed node (%d node changes seen by consumers); %d publish retries (%d answered as duplicates); %d operator moves refused: %v",
		total, len(want), moved, moves, retries, dups, len(moveErrs), moveErrs)
	if stallGroup != "" {
		t.Logf("longest decision stall: group %s, first message acknowledged by the ingress %s, first processed %v later, during: %s",
			stallGroup, firsts[stallGroup].Format("15:04:05.000"), stall.Round(time.Millisecond),
			during(spans, firsts[stallGroup], firsts[stallGroup].Add(stall)))
	}
	if moveGroup != "" {
		t.Logf("longest pause of a moved group: %s from %s to %s, %v between the last message processed on %s (%s) and the first on %s, during: %s",
			moveGroup, moveFrom.node, moveTo.node, movePause.Round(time.Millisecond), moveFrom.node, moveFrom.at.Format("15:04:05.000"),
			moveTo.node, during(spans, moveFrom.at, moveTo.at))
	}
	if waitBody != "" {
		t.Logf("longest wait of a message whose predecessor in its group was already processed: %s, %v (acknowledged %s, processed %s on %s), during: %s",
			waitBody, longestWait.Round(time.Millisecond), waitFrom.Format("15:04:05.000"), waitTo.at.Format("15:04:05.000"), waitTo.node,
			during(spans, waitFrom, waitTo.at))
	}
	t.Logf("soak: longest decision stall %v, longest pause of a moved group %v, faults: %s",
		stall.Round(time.Millisecond), movePause.Round(time.Millisecond), strings.Join(cs, " "))
}

// soakMove asks the handler to move one of the producers' current groups
// to another node with a consumer; it returns "group->node" (or why not).
func soakMove(t *testing.T, rng *rand.Rand, ps []*loadProducer, st *kvbinding.Store, nc *nats.Conn, errs *[]string) string {
	t.Helper()
	p := ps[rng.IntN(len(ps))]
	p.mu.Lock()
	g := p.group(rng.IntN(len(p.version)))
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := st.Get(ctx, g)
	if err != nil || b.State != kvbinding.StateBound {
		return fmt.Sprintf("%s (not bound: %v %s)", g, err, b.State)
	}
	var targets []string
	for _, id := range all3 {
		if id != b.Node {
			targets = append(targets, id)
		}
	}
	to := targets[rng.IntN(len(targets))]
	if _, err := proposals.Move(ctx, nc, g, to, 5*time.Second); err != nil {
		*errs = append(*errs, fmt.Sprintf("%s->%s: %v", g, to, err))
		return fmt.Sprintf("%s %s->%s (refused: %v)", g, b.Node, to, err)
	}
	// The move is complete once the new owner cleared the handoff. The
	// bound is generous: the new owner may first finish a takeover of a
	// dead node's groups, which copies their waiting messages one at a
	// time (222 messages took 35 s while a restarted server rejoined).
	natstest.Eventually(t, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		cur, err := st.Get(ctx, g)
		if err != nil {
			return err
		}
		if !cur.Settled() {
			return fmt.Errorf("%s is %s step=%q", g, cur.State, cur.Step)
		}
		return nil
	})
	return fmt.Sprintf("%s %s->%s", g, b.Node, to)
}

// soakDecisionStall returns the longest time from a group's first PubAck
// to its first message processed.
func soakDecisionStall(got []delivery, firsts map[string]time.Time) (time.Duration, string) {
	seen := map[string]bool{}
	var worst time.Duration
	var group string
	for _, d := range got {
		if seen[d.group] {
			continue
		}
		seen[d.group] = true
		if at, ok := firsts[d.group]; ok && d.at.Sub(at) > worst {
			worst, group = d.at.Sub(at), d.group
		}
	}
	return worst, group
}

// soakMovePause returns the longest time between the last message of a
// group processed on one node and the first processed on the next, and
// how many such node changes there were.
func soakMovePause(got []delivery) (worst time.Duration, group string, from, to delivery, changes int) {
	last := map[string]delivery{}
	for _, d := range got {
		prev, ok := last[d.group]
		last[d.group] = d
		if !ok || prev.node == d.node || d.delivered > 1 {
			continue
		}
		changes++
		if gap := d.at.Sub(prev.at); gap > worst {
			worst, group, from, to = gap, d.group, prev, d
		}
	}
	return worst, group, from, to, changes
}

// soakLongestWait returns the message that waited longest, after both its
// PubAck and its group's previous message's processing, to be processed:
// the longest pause of any group while its producer had sent it something.
func soakLongestWait(got []delivery, acked map[string]time.Time) (time.Duration, string, time.Time, delivery) {
	ordered := append([]delivery(nil), got...)
	sort.SliceStable(ordered, func(i, j int) bool { return ordered[i].at.Before(ordered[j].at) })
	last := map[string]time.Time{}
	var worst time.Duration
	var body string
	var from time.Time
	var to delivery
	for _, d := range ordered {
		ready, ok := acked[d.body]
		if !ok || d.delivered > 1 {
			continue // a lost delivery's redelivery waits for the ack wait: reported apart
		}
		if p, ok := last[d.group]; ok && p.After(ready) {
			ready = p
		}
		last[d.group] = d.at
		if w := d.at.Sub(ready); w > worst {
			worst, body, from, to = w, d.body, ready, d
		}
	}
	return worst, body, from, to
}
