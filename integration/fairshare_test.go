package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// fairRun is one node on one server whose queue an application consumes
// with package consumer (16 lanes), a handler slow for one group.
type fairRun struct {
	js    jetstream.JetStream
	nc    *nats.Conn
	col   collector
	holds *eventLog
	stop  func()
}

// startFairRun starts node n1 and its consumer. The queue consumer's
// window is set to window messages (the router creates it with 1,000):
// the same story at a tenth of the size. slow(group) says how long the
// handler takes for a message of group.
func startFairRun(t *testing.T, window int, slow func(group string) time.Duration) *fairRun {
	t.Helper()
	s := natstest.RunServer(t)
	cfg := testConfig("n1", router.Local)
	n := startNode(t, s.URL(), cfg)
	r := &fairRun{nc: s.Connect()}
	r.holds = watchEvents(t, r.nc, proposals.EventHold)
	r.js = jetStream(t, s.URL())
	setQueueWindow(t, r.js, "n1", window)
	cctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- consumer.Consume(cctx, r.js, "n1", func(ctx context.Context, m *consumer.Message) error {
			if d := slow(m.Group); d > 0 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(d):
				}
			}
			r.col.add(received{node: "n1", group: m.Group, body: string(m.Data), subject: m.Subject, seq: m.IngressSeq, at: time.Now()})
			return nil
		}, consumer.WithConcurrency(16))
	}()
	r.stop = func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("consume: %v", err)
		}
	}
	t.Cleanup(func() { r.stop(); n.stop() })
	waitEligible(t, r.nc, []string{"n1"}, []string{"n1"})
	natstest.Eventually(t, 10*time.Second, func() error {
		if got := n.r.Stats().GroupShare; got != window/2 {
			return fmt.Errorf("the node's group share is %d, want %d (half the window)", got, window/2)
		}
		return nil
	})
	return r
}

// burst publishes n messages of group at once (asynchronously), bodies
// group/00000...
func (r *fairRun) burst(t *testing.T, group string, n int, want map[string][]string) {
	t.Helper()
	var futures []jetstream.PubAckFuture
	for i := range n {
		m := nats.NewMsg("jms.orders")
		m.Header.Set("Group-Id", group)
		body := fmt.Sprintf("%s/%05d", group, i)
		m.Data = []byte(body)
		f, err := r.js.PublishMsgAsync(m)
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
		want[group] = append(want[group], body)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		case <-time.After(30 * time.Second):
			t.Fatal("burst not acknowledged")
		}
	}
}

// trickle publishes one message to each of groups every every, rounds
// times, and returns when each was published.
func (r *fairRun) trickle(t *testing.T, groups []string, rounds int, every time.Duration, want map[string][]string) map[string]time.Time {
	t.Helper()
	sent := map[string]time.Time{}
	for i := range rounds {
		for _, g := range groups {
			body := fmt.Sprintf("%s/%05d", g, i)
			sent[body] = time.Now()
			publish(t, r.js, "jms.orders", g, body)
			want[g] = append(want[g], body)
		}
		time.Sleep(every)
	}
	return sent
}

// A group with a backlog several times the queue consumer's window does
// not hold the others back: past its share, its messages wait on the
// node's held subject and reach the queue as the consumer works through
// the earlier ones. Quiet groups published after the backlog are all
// processed while the busy group is still early in its backlog (before,
// they waited behind the window full of it: a 3,000-message backlog at
// 10 ms a message held them 20 s at the p99). The busy group is processed
// in order, once.
func TestBusyGroupDoesNotHoldOthersBack(t *testing.T) {
	t.Parallel() // see doc.go
	const window, backlog = 100, 600
	r := startFairRun(t, window, func(g string) time.Duration {
		if g == "hot" {
			return 5 * time.Millisecond
		}
		return 0
	})
	want := map[string][]string{}
	r.burst(t, "hot", backlog, want)
	quiet := []string{"q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q9"}
	sent := r.trickle(t, quiet, 10, 50*time.Millisecond, want)
	total := backlog + len(sent)
	got := r.col.waitCount(t, total, 60*time.Second)
	checkOrderedOnce(t, got, want)
	// Where was the busy group when the last quiet message was processed?
	hotDone, lastQuiet := 0, time.Time{}
	var lat []time.Duration
	for _, m := range got {
		if m.group != "hot" {
			lat = append(lat, m.at.Sub(sent[m.body]))
			if m.at.After(lastQuiet) {
				lastQuiet = m.at
			}
		}
	}
	for _, m := range got {
		if m.group == "hot" && m.at.Before(lastQuiet) {
			hotDone++
		}
	}
	t.Logf("quiet messages: %d, latency p50 %v p99 %v max %v; the busy group had %d of its %d processed when the last quiet one was",
		len(lat), pct(lat, 50), pct(lat, 99), pct(lat, 100), hotDone, backlog)
	if hotDone >= backlog-window {
		t.Errorf("the quiet groups waited for the busy group: their last message was processed after %d of its %d (a window of %d ahead of them)",
			hotDone, backlog, window)
	}
	r.holds.mu.Lock()
	holds := len(r.holds.evs)
	r.holds.mu.Unlock()
	if holds == 0 {
		t.Errorf("no %q event: the busy group was not held back", proposals.EventHold)
	}
}

// A handler that hangs on one group does not hold the others back: the
// hung group's messages past its share wait on the held subject, and the
// quiet groups are all processed while it hangs.
func TestHungGroupDoesNotHoldOthersBack(t *testing.T) {
	t.Parallel() // see doc.go
	const window = 100
	release := make(chan struct{})
	var once sync.Once
	hung := make(chan time.Time, 1)
	r := startFairRun(t, window, func(g string) time.Duration {
		if g == "stuck" {
			once.Do(func() {
				hung <- time.Now()
				<-release
			})
		}
		return 0
	})
	var unhang sync.Once
	free := func() { unhang.Do(func() { close(release) }) }
	defer free() // a failure below must not leave the handler hung
	want := map[string][]string{}
	r.burst(t, "stuck", 3*window, want)
	<-hung
	quiet := []string{"q0", "q1", "q2", "q3", "q4"}
	sent := r.trickle(t, quiet, 20, 20*time.Millisecond, want)
	got := r.col.waitCount(t, len(sent), 30*time.Second)
	for _, m := range got {
		if m.group == "stuck" {
			t.Fatalf("the hung group's message %s was processed while its handler hung", m.body)
		}
	}
	free()
	got = r.col.waitCount(t, 3*window+len(sent), 60*time.Second)
	checkOrderedOnce(t, got, want)
}

// pct returns the p-th percentile of ds (100: the largest).
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)].Round(time.Millisecond)
}

// A node that dies while a busy group's messages wait on its held
// subject loses none of them: started again, it counts what its held
// subject holds before it routes, sends the group's later messages behind
// them, and moves them onto its queue as the consumer works; every message
// is processed once, in order.
func TestHeldBackGroupSurvivesACrash(t *testing.T) {
	t.Parallel() // see doc.go
	const window, backlog = 100, 400
	s := natstest.RunServer(t)
	n, r, want := heldBackGroup(t, s, window, backlog)
	n.kill()
	r.burst(t, "hot", 100, want) // while it is down: behind the held ones
	n.restart()
	// No consumer yet, so nothing is released: the count comes from the
	// held subject, read before the node routes.
	natstest.Eventually(t, 10*time.Second, func() error {
		if st := n.r.Stats(); st.HeldBackGroups != 1 || st.HeldBackMessages < backlog-window {
			return fmt.Errorf("after the restart the node holds back %d messages of %d groups, want %d+ of 1 (counted from its held subject)",
				st.HeldBackMessages, st.HeldBackGroups, backlog-window)
		}
		return nil
	})
	startConsumer(t, s.URL(), "n1", &r.col)
	got := r.col.waitCount(t, backlog+100, 60*time.Second)
	checkOrderedOnce(t, got, want)
	natstest.Eventually(t, 10*time.Second, func() error {
		if st := n.r.Stats(); st.HeldBackMessages != 0 || st.HeldBackGroups != 0 {
			return fmt.Errorf("still %d messages of %d groups held back", st.HeldBackMessages, st.HeldBackGroups)
		}
		return nil
	})
}

// heldBackGroup starts node n1 (LOCAL) on s with a queue window of window
// messages and publishes backlog messages of group "hot" with no consumer:
// the backlog goes to the queue up to the group's share (half the window),
// the rest to the held subject. It returns once at least backlog-window
// are held back, with the node, the run and the messages published.
func heldBackGroup(t *testing.T, s *natstest.Server, window, backlog int) (*node, *fairRun, map[string][]string) {
	t.Helper()
	cfg := testConfig("n1", router.Local)
	// A group waits in memory for room (up to 15 s, or a quarter of the
	// held messages): this bound sends its backlog to the held subject
	// at once.
	cfg.MaxHeldMessages = 400
	n := startNode(t, s.URL(), cfg)
	r := &fairRun{nc: s.Connect(), js: jetStream(t, s.URL())}
	setQueueWindow(t, r.js, "n1", window)
	natstest.Eventually(t, 10*time.Second, func() error {
		if got := n.r.Stats().GroupShare; got != window/2 {
			return fmt.Errorf("group share %d, want %d", got, window/2)
		}
		return nil
	})
	want := map[string][]string{}
	r.burst(t, "hot", backlog, want)
	natstest.Eventually(t, 20*time.Second, func() error {
		if st := n.r.Stats(); st.HeldBackMessages < backlog-window {
			return fmt.Errorf("%d messages held back", st.HeldBackMessages)
		}
		return nil
	})
	return n, r, want
}

// setQueueWindow sets the MaxAckPending of node's queue consumer.
func setQueueWindow(t *testing.T, js jetstream.JetStream, node string, window int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, router.QueueStream, router.QueueConsumer(node))
	if err != nil {
		t.Fatal(err)
	}
	cc := c.CachedInfo().Config
	cc.MaxAckPending = window
	if _, err := js.UpdateConsumer(ctx, router.QueueStream, cc); err != nil {
		t.Fatal(err)
	}
}

// An operator unbinds a group held back on its node's held subject (a move
// to no node, which drains nothing): the node moves the held messages onto
// its queue before it fences, so that the binding's end comes behind all
// of them, and the group's next messages, bound afresh, come after them.
// Before, the node forgot the held messages and fenced at once: the next
// binding's messages went onto the queue ahead of them, or they stayed on
// the held subject (the simulation's seed 74).
func TestUnbindOfAHeldBackGroupKeepsItsOrder(t *testing.T) {
	t.Parallel() // see doc.go
	const window, backlog, after = 100, 400, 100
	s := natstest.RunServer(t)
	n, r, want := heldBackGroup(t, s, window, backlog)
	if _, err := proposals.Move(context.Background(), r.nc, "hot", "", 5*time.Second); err != nil {
		t.Fatalf("unbind: %v", err)
	}
	// The consumer makes room: the held messages go onto the queue, then
	// the node fences and the binding ends. Under load the moves of the
	// held messages can outlast the fence deadline: the handler then takes
	// the group from the node's checkpoint, and the drain moves what is
	// still held. Either way the move ends.
	startConsumer(t, s.URL(), "n1", &r.col)
	st := openStore(t, r.nc)
	natstest.Eventually(t, 60*time.Second, func() error {
		b, err := st.Get(context.Background(), "hot")
		if err != nil {
			return err
		}
		if b.State != kvbinding.StateReleased && !b.Settled() {
			return fmt.Errorf("hot is %s on %q step %q", b.State, b.Node, b.Step)
		}
		t.Logf("the unbind ended: hot is %s on %q (%s)", b.State, b.Node, b.Reason)
		return nil
	})
	later := bodies("hot/after", after) // bound afresh: behind every held message
	publishPipelined(t, r.js, "jms.orders", "hot", later...)
	want["hot"] = append(want["hot"], later...)
	got := r.col.waitCount(t, backlog+after, 60*time.Second)
	checkOrderedOnce(t, got, want)
	if st := n.r.Stats(); st.HeldBackMessages != 0 {
		t.Errorf("%d messages still held back", st.HeldBackMessages)
	}
}
