package integration

// Network partitions on the built binary (issue 29): three in-process
// servers whose routes pass through proxies (natstest.ProxiedCluster),
// nodes run as processes, each linked to one server through a proxy of
// its own; a producer on every server that retries each publish with the
// same Nats-Msg-Id until it is acknowledged; raw consumers of every
// node's queue that ack every message. A fault is a black hole: the
// connections stay open, nothing flows, and what was sent arrives after
// the heal, as on a real network. checkPartition then reads everything
// the consumers got.
//
//	go test -race -count=1 -run 'TestPartition' ./integration/ -v

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// partitionFlags are the node flags of the partition tests. A node grace
// of 2 s (the default is 15 s) makes a fault of 12 to 20 s outlast it, so
// that the handler moves the cut-off node's groups during the fault: the
// case where a heal can reorder them. Rebalancing stays on, as by
// default: after a heal it moves groups back to the healed node. Debug
// logs are the evidence when a test fails (routerProc shows their tail).
var partitionFlags = []string{"--node-grace", "2s", "--log-level", "debug"}

// partitionAckWait is the queue consumers' ack wait in these runs (the
// nodes' default, --queue-ack-wait).
const partitionAckWait = 30 * time.Second

const (
	// partitionEvery is each producer's pace: with one producer per
	// server, a message every 3 ms across them.
	partitionEvery = 9 * time.Millisecond
	// partitionDrain bounds the wait, after the producers stop, for every
	// acknowledged message to be processed and the queues to empty. A
	// delivery lost with a cut-off consumer leader comes again only an ack
	// wait (30 s) after the next election, or after a drain's own ack wait
	// when a move paused that queue meanwhile (seen in CI: a rebalancing
	// move 30 s after the heal, and 60 s were not enough on a loaded
	// machine); a stall past 90 s is the router's.
	partitionDrain = 90 * time.Second
	// handlerName is the grouping-handler name the nodes run with (the
	// default of --name).
	handlerName = "grouping-handler"
)

// partitionNode is a node process of a partition test: its id, type and
// the server its link proxy leads to.
type partitionNode struct {
	id, typ string
	server  int
}

// partitionRun is a running partition test: cluster, nodes, consumers and
// producers.
type partitionRun struct {
	bin   string // the built binary
	pc    *natstest.ProxiedCluster
	procs map[string]*routerProc
	links map[string]*natstest.Proxy
	col   *timedCollector
	cons  []*appConsumer
	ps    []*loadProducer
	admin *nats.Conn          // of the test, on server 1 directly (on the others while it is down)
	js    jetstream.JetStream // on admin
	reg   *kvbinding.Registry
}

// partitionSetup is what varies between the runs of startPartitionRunWith.
type partitionSetup struct {
	// bin is the built binary ("": built by the run).
	bin string
	// flags are the nodes' flags after --nats, --node and --type (nil:
	// partitionFlags).
	flags []string
	// ackFor is how long the consumers retry a failed ack (0:
	// defaultAckFor).
	ackFor time.Duration
	// logsOnFailure saves the nodes' logs (see saveLogs) only when the
	// test failed.
	logsOnFailure bool
	// fallbacks: a node whose server refuses its link (shut down) is
	// linked to another server instead (natstest.Fallbacks), as a client
	// that learned the cluster's servers reconnects to another one.
	// Without it a node stays off NATS until its own server is back.
	fallbacks bool
}

// startPartitionRun builds the binary, starts a proxied 3-server cluster
// and the nodes (the first one first, and it is made the active handler),
// consumes every node's queue through its server's client proxy, starts a
// producer on every server with slots[i] groups of its own, and waits
// until the cluster routes under load.
func startPartitionRun(t *testing.T, nodes []partitionNode, slots []int) *partitionRun {
	t.Helper()
	return startPartitionRunWith(t, partitionSetup{}, nodes, slots)
}

// startPartitionRunWith is startPartitionRun as setup says.
func startPartitionRunWith(t *testing.T, setup partitionSetup, nodes []partitionNode, slots []int) *partitionRun {
	t.Helper()
	bin := setup.bin
	if bin == "" {
		bin = buildRelease(t, "")
	}
	flags := setup.flags
	if flags == nil {
		flags = partitionFlags
	}
	ackFor := setup.ackFor
	if ackFor == 0 {
		ackFor = defaultAckFor
	}
	pc := natstest.RunProxiedCluster(t, 3)
	// Server 1 first, and kept while it runs (a scenario cuts server 0
	// off: the test reads the majority's view); the others while it is
	// stopped.
	admin := natstest.Connect(t, strings.Join([]string{pc.Servers[1].URL(), pc.Servers[2].URL(), pc.Servers[0].URL()}, ","),
		nats.Name("partition-admin"), nats.DontRandomize())
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	r := &partitionRun{bin: bin, pc: pc, procs: map[string]*routerProc{}, links: map[string]*natstest.Proxy{},
		col: &timedCollector{}, admin: admin, js: js}
	// Registered first, so it runs last: after the processes ended.
	t.Cleanup(func() {
		if !setup.logsOnFailure || t.Failed() {
			r.saveLogs(t)
		}
	})
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.id
		var opts []natstest.ProxyOption
		if setup.fallbacks {
			opts = append(opts, natstest.Fallbacks(pc.ServerAddrs(n.server)...))
		}
		link := pc.LinkProxy(t, n.server, opts...)
		r.links[n.id] = link
		args := append([]string{"--nats", link.URL(), "--node", n.id, "--type", n.typ}, flags...)
		r.procs[n.id] = startRouterProc(t, bin, n.id, args...)
		if i == 0 {
			// The first node creates the registry; it takes the lease
			// before any other LOCAL node runs.
			natstest.Eventually(t, 60*time.Second, func() error {
				if r.reg == nil {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					defer cancel()
					// Open the node's bucket only once it exists:
					// OpenRegistry creates a missing one with its own
					// defaults (one replica).
					if _, err := js.KeyValue(ctx, kvbinding.DefaultNodesBucket); err != nil {
						return fmt.Errorf("registry bucket: %w", err)
					}
					if r.reg, err = kvbinding.OpenRegistry(ctx, js, kvbinding.RegistryConfig{}, nil); err != nil {
						r.reg = nil
						return err
					}
				}
				if h := r.holder(); h != handlerName+"/"+n.id {
					return fmt.Errorf("lease held by %q, want %s", h, n.id)
				}
				return nil
			})
		}
	}
	for _, n := range nodes {
		natstest.Eventually(t, 60*time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := js.Consumer(ctx, router.QueueStream, router.QueueConsumer(n.id))
			return err
		})
		r.cons = append(r.cons, startAppConsumerAckingFor(t, pc.ClientURL(n.server), n.id, r.col, ackFor))
	}
	waitEligible(t, admin, ids, ids)
	// A partition tests replication: every stream the nodes depend on
	// must have a replica on each server.
	for _, name := range streamsOfTheRouter {
		if n := streamInfo(t, js, name).Config.Replicas; n != 3 {
			t.Fatalf("stream %s has %d replicas, want 3", name, n)
		}
	}
	for i, n := range slots {
		r.ps = append(r.ps, startLoad(t, pc.ClientURL(i), fmt.Sprintf("p%d", i), n, 0, partitionEvery))
	}
	r.progress(t, 300)
	return r
}

// leadersOff moves the leaders of the router's streams off server from
// (to server to), so that a fault of from leaves them on the other side.
func (r *partitionRun) leadersOff(t *testing.T, from, to int) {
	t.Helper()
	body := fmt.Sprintf(`{"placement":{"preferred":%q}}`, r.pc.Servers[to].Name())
	for _, name := range streamsOfTheRouter {
		natstest.Eventually(t, 30*time.Second, func() error {
			info := streamInfo(t, r.js, name)
			if info.Cluster == nil || info.Cluster.Leader == "" {
				return fmt.Errorf("%s has no leader", name)
			}
			if info.Cluster.Leader != r.pc.Servers[from].Name() {
				return nil
			}
			_, err := r.admin.Request("$JS.API.STREAM.LEADER.STEPDOWN."+name, []byte(body), 2*time.Second)
			return fmt.Errorf("%s led by %s (step-down asked: %v)", name, info.Cluster.Leader, err)
		})
	}
}

// saveLogs writes every node's whole log to dir/<test>-<node>.log, when
// GROUPROUTER_TEST_LOGDIR names a directory: the evidence of a failure
// is longer than the tail a failing test shows.
func (r *partitionRun) saveLogs(t *testing.T) {
	dir := os.Getenv("GROUPROUTER_TEST_LOGDIR")
	if dir == "" {
		return
	}
	for id, p := range r.procs {
		path := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+id+".log")
		if err := os.WriteFile(path, []byte(p.log.String()), 0o644); err != nil {
			t.Logf("save log of %s: %v", id, err)
		}
	}
}

// holder returns the holder of the handler lease as the majority side
// sees it ("" if none or unknown).
func (r *partitionRun) holder() string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l, err := r.reg.GetLease(ctx, handlerName)
	if err != nil {
		return ""
	}
	return l.Holder
}

// boundTo returns how many groups are bound to node, or -1 if the
// bindings cannot be read.
func (r *partitionRun) boundTo(node string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n := 0
	err := kvbinding.ScanBindings(ctx, r.js, "", func(b kvbinding.Binding) error {
		if b.State == kvbinding.StateBound && b.Node == node {
			n++
		}
		return nil
	})
	if err != nil {
		return -1
	}
	return n
}

// progress waits until more messages than now were processed.
func (r *partitionRun) progress(t *testing.T, more int) {
	t.Helper()
	want := r.col.len() + more
	natstest.Eventually(t, 90*time.Second, func() error {
		if n := r.col.len(); n < want {
			return fmt.Errorf("%d of %d messages processed", n, want)
		}
		return nil
	})
}

// hold keeps a fault on for d: a fault's length is part of the scenario,
// not a wait for a condition.
func hold(d time.Duration) { time.Sleep(d) }

// finish stops the producers, waits up to partitionDrain for every
// acknowledged message to be processed and the queues to empty (without
// failing: checkPartition reports what is missing), checks every delivery
// and fails the test on a violation. It returns the check.
func (r *partitionRun) finish(t *testing.T) partitionCheck {
	t.Helper()
	haltAll(t, r.ps...)
	want, total := sentAll(r.ps...)
	deadline := time.Now().Add(partitionDrain)
	var left error
	stuck := ""
	for {
		left, stuck = nil, ""
		if n, ex := r.col.missing(want); n > 0 {
			left, stuck = fmt.Errorf("%d acknowledged messages not processed (e.g. %s)", n, ex), ex
		} else if err := queuesEmpty(r.js); err != nil {
			left = err
		}
		if left == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if left != nil {
		t.Errorf("after %v of draining: %v", partitionDrain, left)
		if stuck != "" {
			r.explainStuck(t, stuck)
		}
	}
	for _, p := range r.ps {
		p.mu.Lock()
		t.Logf("producer %s: %d publish attempts failed and retried, %d of the retries answered as duplicates (an earlier attempt was stored)",
			p.name, p.retries, p.dups)
		p.mu.Unlock()
	}
	for _, a := range r.cons {
		if n := a.ackErr.Load(); n > 0 {
			t.Logf("consumer of %s gave up on %d acks (JetStream redelivers those)", a.node, n)
		}
	}
	c := checkPartition(r.col.all(), want)
	c.report(t)
	if c.Messages != total {
		t.Errorf("checked %d messages, the producers had %d acknowledged", c.Messages, total)
	}
	return c
}

// explainStuck says where the message body (group/number) waits: the
// group's binding, the queues and their consumers, and what each node
// logged about the group (a CI failure shows no more than the test
// prints).
func (r *partitionRun) explainStuck(t *testing.T, body string) {
	t.Helper()
	group, _, _ := strings.Cut(body, "/")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := kvbinding.ScanBindings(ctx, r.js, "", func(b kvbinding.Binding) error {
		if b.Group == group {
			t.Logf("stuck %s: binding %s on %s rev %d epoch %d from_seq %d drain %v prev %s (%s)",
				body, b.State, b.Node, b.Revision, b.Epoch, b.FromSeq, b.Drain, b.PrevNode, b.Reason)
		}
		return nil
	})
	if err != nil {
		t.Logf("stuck %s: bindings not read: %v", body, err)
	}
	if s, err := r.js.Stream(ctx, router.QueueStream); err == nil {
		t.Logf("stuck %s: queue consumers: %s", body, queueConsumers(ctx, s))
	}
	if err := queuesEmpty(r.js); err != nil {
		t.Logf("stuck %s: %v", body, err)
	}
	for _, name := range sortedKeys(r.procs) {
		var lines []string
		for _, l := range strings.Split(r.procs[name].log.String(), "\n") {
			if strings.Contains(l, group) || strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				lines = append(lines, l)
			}
		}
		lines = lines[max(0, len(lines)-40):]
		t.Logf("stuck %s: %s's last %d log lines about the group or warning:\n%s", body, name, len(lines), strings.Join(lines, "\n"))
	}
}

// ---------------------------------------------------------------------------
// The check

// partitionCheck is what checkPartition found.
type partitionCheck struct {
	Messages    int // acknowledged by the ingress
	Groups      int
	Deliveries  int
	Stored      int // distinct queue messages delivered (by queue sequence)
	Redelivered int // deliveries of a queue message after its first
	// Lost lists acknowledged messages never delivered.
	Lost []string
	// Copies lists messages stored on the queues more than once (under
	// two queue sequences), each as body@node#seq of every copy, but the
	// LateCopies: routed twice, or moved and processed again within the
	// queue's ack wait of the first.
	Copies []string
	// LateCopies lists those processed again only past the ack wait: a
	// queue consumer's leader on the losing side of a partition delivered
	// them there, its successor never learned of it, and the drain moved
	// them once the ack wait since its election had passed; JetStream
	// would have delivered them again by then all the same (its
	// at-least-once bound, docs/protocol.md, "Hand-over and epochs").
	// Only a copy moved off the queue of the first processing is taken
	// as such: a copy moved off another node's queue was routed twice.
	LateCopies []string
	// Unexpected lists delivered bodies no producer had acknowledged.
	Unexpected []string
	// OutOfOrder maps each group processed out of order to its first
	// violation: the message ahead, then the earlier one processed after
	// it, as group/index@node#queue-sequence.
	OutOfOrder map[string]string
	// QueueOrder maps the out-of-order groups whose first violation is
	// JetStream's rather than the router's to why: both messages on one
	// node's queue, stored in order, the earlier delivered after the
	// later (a delivery held in transit, say); the application sees the
	// group out of order all the same.
	QueueOrder map[string]string
	// Redeliveries lists the groups whose earlier message, stored first
	// on one queue, was processed after a later one only because its
	// first delivery never reached the consumer and JetStream delivered it
	// again after its ack wait, or the servers delivered it first and the
	// network held it: its queue's delivery, not the router's.
	Redeliveries []string
	// Traces maps each out-of-order group to its processing in runs:
	// index range @node #queue-sequence range e<epoch>.
	Traces map[string]string
}

// checkPartition checks, over every delivery the consumers recorded and
// what the producers had acknowledged (want: each group's bodies in the
// order sent):
//   - loss: every acknowledged message was delivered;
//   - copies: each message was stored on the queues once (the same body
//     under two queue sequences is a copy; JetStream's redelivery of one
//     queue message is not);
//   - order: taking each stored message's first delivery, in the order
//     processed (one clock, the test's), each group's indexes increase.
//     A violation is the router's when the two messages are on different
//     queues or were stored out of order; when both are on one queue,
//     stored in order and delivered in the other order, it is the queue
//     consumer's (QueueOrder), and fails the test all the same: the
//     application processed the group out of order.
//
// A group whose index repeats (a copy processed right after itself) is a
// copy, not an order violation; one that goes back below an index already
// processed is out of order.
func checkPartition(got []delivery, want map[string][]string) partitionCheck {
	c := partitionCheck{Groups: len(want), Deliveries: len(got), OutOfOrder: map[string]string{}, QueueOrder: map[string]string{},
		Traces: map[string]string{}}
	index := map[string]int{}
	for _, bs := range want {
		c.Messages += len(bs)
		for i, b := range bs {
			index[b] = i
		}
	}
	first := map[uint64]delivery{} // queue sequence -> first delivery
	for _, d := range got {
		if f, ok := first[d.queueSeq]; !ok || d.at.Before(f.at) {
			if ok {
				c.Redelivered++
			}
			first[d.queueSeq] = d
		} else {
			c.Redelivered++
		}
	}
	c.Stored = len(first)
	stored := make([]delivery, 0, len(first))
	for _, d := range first {
		stored = append(stored, d)
	}
	sort.Slice(stored, func(i, j int) bool {
		if !stored[i].at.Equal(stored[j].at) {
			return stored[i].at.Before(stored[j].at)
		}
		return stored[i].queueSeq < stored[j].queueSeq
	})

	byBody := map[string][]delivery{}
	byGroup := map[string][]delivery{}
	for _, d := range stored {
		byBody[d.body] = append(byBody[d.body], d)
		byGroup[d.group] = append(byGroup[d.group], d)
	}
	for _, g := range sortedKeys(want) {
		for _, b := range want[g] {
			if len(byBody[b]) == 0 {
				c.Lost = append(c.Lost, b)
			}
		}
	}
	for _, b := range sortedKeys(byBody) {
		ds := byBody[b]
		if _, ok := index[b]; !ok {
			c.Unexpected = append(c.Unexpected, b)
		}
		if len(ds) > 1 {
			var parts []string
			for k, d := range ds {
				p := fmt.Sprintf("%s@%s#%de%d", b, d.node, d.queueSeq, d.epoch)
				if d.movedFrom != "" {
					p += "(moved from " + d.movedFrom + ")"
				}
				if k > 0 {
					p += fmt.Sprintf(" %v later", d.at.Sub(ds[0].at).Round(time.Millisecond))
				}
				parts = append(parts, p)
			}
			// JetStream's copy is the same queue message: moved off the
			// queue it was first processed from. One moved off another
			// node's queue was routed there a second time: the router's.
			if late := ds[len(ds)-1]; len(ds) == 2 && late.at.Sub(ds[0].at) >= partitionAckWait && late.movedFrom == ds[0].node {
				c.LateCopies = append(c.LateCopies, strings.Join(parts, " "))
			} else {
				c.Copies = append(c.Copies, strings.Join(parts, " "))
			}
		}
	}
	idx := func(d delivery) int {
		if i, ok := index[d.body]; ok {
			return i
		}
		_, s, _ := strings.Cut(d.body, "/")
		i, _ := strconv.Atoi(s)
		return i
	}
	for _, g := range sortedKeys(byGroup) {
		ds := byGroup[g]
		var ahead delivery
		top := -1
		for _, d := range ds {
			i := idx(d)
			if i < top {
				c.OutOfOrder[g] = fmt.Sprintf("%s %s", deliveredAt(g, top, ahead), deliveredAt(g, i, d))
				if d.movedFrom != "" && d.movedFrom == ahead.node {
					// The earlier message was moved off the queue the later one
					// was processed from: delivered there, it never reached the
					// consumer (or was not acknowledged) while later ones were,
					// and the hand-over moved it once that consumer made no
					// progress for its ack wait (README, guarantee 2).
					c.Redeliveries = append(c.Redeliveries, g+": "+c.OutOfOrder[g]+" (moved off "+ahead.node+"'s queue after its consumer's ack wait)")
					delete(c.OutOfOrder, g)
					break
				}
				if d.node == ahead.node && d.queueSeq < ahead.queueSeq {
					c.QueueOrder[g] = fmt.Sprintf("both on %s's queue, stored in order (#%d before #%d), delivered in the other order (consumer sequence %d after %d, delivery count %d)",
						d.node, d.queueSeq, ahead.queueSeq, d.consSeq, ahead.consSeq, d.delivered)
					if d.delivered > 1 || (d.consSeq != 0 && ahead.consSeq != 0 && d.consSeq < ahead.consSeq) {
						// Its first delivery never reached the test's consumer (a
						// leader cut off with it delivered it on the losing
						// side): JetStream delivered it again after its ack wait,
						// behind later ones. Or the servers delivered it first
						// (its consumer sequence is lower) and the network held
						// it. The router stored it in order; package consumer
						// holds a group whose delivery is missing (a gap in the
						// consumer sequence) until it comes.
						c.Redeliveries = append(c.Redeliveries, g+": "+c.OutOfOrder[g]+" ("+c.QueueOrder[g]+")")
						delete(c.OutOfOrder, g)
						delete(c.QueueOrder, g)
						break
					}
				}
				break
			}
			if i > top {
				top, ahead = i, d
			}
		}
		if _, bad := c.OutOfOrder[g]; bad {
			c.Traces[g] = traceRuns(ds, idx)
		}
	}
	return c
}

// deliveredAt formats one delivery as group/index@node#queue-sequence.
func deliveredAt(g string, i int, d delivery) string {
	return fmt.Sprintf("%s/%d@%s#%d", g, i, d.node, d.queueSeq)
}

// traceRuns writes a group's deliveries compactly: consecutive indexes on
// one node in one epoch form a run "a..b@node#s1..s2e<epoch>".
func traceRuns(ds []delivery, idx func(delivery) int) string {
	var runs []string
	for k := 0; k < len(ds); {
		j := k
		for j+1 < len(ds) && idx(ds[j+1]) == idx(ds[j])+1 && ds[j+1].node == ds[k].node && ds[j+1].epoch == ds[k].epoch {
			j++
		}
		a, b := ds[k], ds[j]
		if j == k {
			runs = append(runs, fmt.Sprintf("%d@%s#%de%d", idx(a), a.node, a.queueSeq, a.epoch))
		} else {
			runs = append(runs, fmt.Sprintf("%d..%d@%s#%d..%de%d", idx(a), idx(b), a.node, a.queueSeq, b.queueSeq, a.epoch))
		}
		k = j + 1
	}
	const most = 40
	if len(runs) > most {
		runs = append(runs[:most], fmt.Sprintf("… (%d runs more)", len(runs)-most))
	}
	return strings.Join(runs, " ")
}

// report logs the counts and fails the test on any violation, with
// examples.
func (c partitionCheck) report(t *testing.T) {
	t.Helper()
	t.Logf("checked: %d messages in %d groups, %d deliveries of %d stored queue messages (%d redeliveries); out of order: %d groups (%d by the queue consumer's delivery order); lost: %d; copies: %d; unexpected: %d; past the ack wait: %d copies, %d redelivered behind later ones",
		c.Messages, c.Groups, c.Deliveries, c.Stored, c.Redelivered, len(c.OutOfOrder), len(c.QueueOrder), len(c.Lost), len(c.Copies), len(c.Unexpected),
		len(c.LateCopies), len(c.Redeliveries))
	for i, g := range sortedKeys(c.OutOfOrder) {
		if i < 10 {
			why := "routed out of order"
			if q, ok := c.QueueOrder[g]; ok {
				why = q
			}
			t.Errorf("group %s out of order: %s (%s)", g, c.OutOfOrder[g], why)
		}
		if i < 3 {
			t.Logf("group %s as processed: %s", g, c.Traces[g])
		}
	}
	if n := len(c.Lost); n > 0 {
		t.Errorf("%d acknowledged messages lost, e.g. %v", n, c.Lost[:min(n, 5)])
	}
	if n := len(c.Copies); n > 0 {
		t.Errorf("%d messages stored on the queues more than once and processed again within the ack wait, e.g. %v", n, c.Copies[:min(n, 5)])
	}
	if n := len(c.LateCopies); n > 0 {
		t.Logf("%d messages processed again past the queue's ack wait (JetStream's at-least-once bound: a consumer leader cut off with its clients delivered them), e.g. %v",
			n, c.LateCopies[:min(n, 3)])
	}
	if n := len(c.Redeliveries); n > 0 {
		t.Logf("%d groups had a message redelivered by JetStream after its ack wait, behind later ones of one queue (stored in order), e.g. %v",
			n, c.Redeliveries[:min(n, 3)])
	}
	if n := len(c.Unexpected); n > 0 {
		t.Errorf("%d messages delivered that no producer had acknowledged, e.g. %v", n, c.Unexpected[:min(n, 5)])
	}
}

// ---------------------------------------------------------------------------
// Evidence: a timeline of the fault and the nodes' logs

// timeline samples probes while a fault is on and records when each
// one's answer changed, relative to its start.
type timeline struct {
	start  time.Time
	mu     sync.Mutex
	events []string
	stop   chan struct{}
	done   chan struct{}
}

// probe is one thing a timeline watches: its name and how to read it.
type probe struct {
	name string
	read func() string
}

// startTimeline reads every probe once, then samples them every 100 ms
// (plus each probe's own time) until halt. Its clock starts after the
// first reading: start the fault right after.
func startTimeline(t *testing.T, probes ...probe) *timeline {
	tl := &timeline{stop: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(tl.end) // a test that fails before halt
	last := make([]string, len(probes))
	for i, p := range probes {
		last[i] = p.read()
	}
	tl.start = time.Now()
	for i, p := range probes {
		tl.mark(fmt.Sprintf("%s: %s", p.name, last[i]))
	}
	go func() {
		defer close(tl.done)
		for {
			select {
			case <-tl.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			for i, p := range probes {
				if v := p.read(); v != last[i] {
					tl.mark(fmt.Sprintf("%s: %s", p.name, v))
					last[i] = v
				}
			}
		}
	}()
	return tl
}

// mark records an event now.
func (tl *timeline) mark(what string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.events = append(tl.events, fmt.Sprintf("%+7.3fs %s", time.Since(tl.start).Seconds(), what))
}

// end stops sampling and waits for the sampler.
func (tl *timeline) end() {
	select {
	case <-tl.stop:
	default:
		close(tl.stop)
	}
	<-tl.done
}

// halt stops sampling and logs the timeline.
func (tl *timeline) halt(t *testing.T) {
	t.Helper()
	tl.end()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	t.Logf("timeline (from the cut):\n  %s", strings.Join(tl.events, "\n  "))
}

// logLine is one line of a node's text log.
type logLine struct {
	at   time.Time
	text string
}

// logLines returns the lines of a node's log (slog text: time=... first)
// stamped at or after since, in order.
func logLines(log string, since time.Time) []logLine {
	var out []logLine
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		v, ok := strings.CutPrefix(line, "time=")
		if !ok {
			continue
		}
		v, _, _ = strings.Cut(v, " ")
		ts, err := time.Parse(time.RFC3339Nano, v)
		if err != nil || ts.Before(since) {
			continue
		}
		out = append(out, logLine{at: ts, text: line})
	}
	return out
}

// firstLine returns the first of lines matching re.
func firstLine(lines []logLine, re *regexp.Regexp) (logLine, bool) {
	for _, l := range lines {
		if re.MatchString(l.text) {
			return l, true
		}
	}
	return logLine{}, false
}

// countLines counts the lines matching re before until.
func countLines(lines []logLine, re *regexp.Regexp, until time.Time) int {
	n := 0
	for _, l := range lines {
		if l.at.Before(until) && re.MatchString(l.text) {
			n++
		}
	}
	return n
}

var (
	// standDownLog matches a handler's log line saying it stopped acting
	// as the active handler: today's "lease lost: standing down", and the
	// wordings a fix may use.
	standDownLog = regexp.MustCompile(`(?i)standing down|stood down|stands down|stopped deciding|stops deciding`)
	activeLog    = regexp.MustCompile(`msg="handler active"`)
	renewLog     = regexp.MustCompile(`msg="lease renew failed"`)
	decisionLog  = regexp.MustCompile(`msg="(moving groups off node|groups moved off node|groups asked to move off node|groups moved to rebalance)"`)
	floorLog     = regexp.MustCompile(`routing floor is past the ingress stream's end|ingress stream was recreated after the routing floor`)
)

// leaderships returns the router's streams server i leads (and "meta" for
// the JetStream meta leader), or "-" for none.
func leaderships(pc *natstest.ProxiedCluster, i int) string {
	srv := pc.Servers[i].Server()
	if srv == nil {
		return "stopped"
	}
	var out []string
	if srv.JetStreamIsLeader() {
		out = append(out, "meta")
	}
	for _, s := range streamsOfTheRouter {
		if srv.JetStreamIsStreamLeader("$G", s) {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ",")
}

// ---------------------------------------------------------------------------
// Scenarios

// The server of the active handler is cut off from the other two for
// 20 s: n0 (LOCAL, the active handler) and the REMOTE n3 on server 0, the
// backup LOCAL n1 on server 1, the REMOTE n2 on server 2. The majority's
// n1 takes the lease once it lapses; n0's side keeps its stale view until
// the heal. Every acknowledged message is delivered, stored once, each
// group in order. n0 stops deciding by its own clock, before n1 can hold
// the lease, and decides nothing more until the heal (before, it went on
// as the active handler for the whole cut, "moving" groups from its side's
// stale view).
func TestPartitionHandlerServerCutOff(t *testing.T) {
	t.Parallel() // see doc.go
	r := startPartitionRun(t, []partitionNode{{"n0", "LOCAL", 0}, {"n1", "LOCAL", 1}, {"n3", "REMOTE", 0}, {"n2", "REMOTE", 2}},
		[]int{12, 12, 12})
	// The active handler's server is the one cut off: n0's on server 0
	// as a rule, n1's on server 1 when n1 took the lease meanwhile (a
	// renewal slowed past its TTL on a loaded machine).
	r.progress(t, 300)
	active, backup, cutSrv, other := "n0", "n1", 0, 1
	switch h := r.holder(); h {
	case handlerName + "/n0":
	case handlerName + "/n1":
		active, backup, cutSrv, other = "n1", "n0", 1, 0
	default:
		t.Fatalf("lease held by %q before the cut, want n0 or n1", h)
	}
	// The router's stream leaders on the majority side: the cut-off
	// handler's side then has only stale replicas (issue 29's case).
	r.leadersOff(t, cutSrv, other)
	if h := r.holder(); h != handlerName+"/"+active {
		t.Fatalf("lease moved to %q while the leaders moved; the test wants it stable", h)
	}
	var heldBytes int
	tl := startTimeline(t,
		probe{"lease", r.holder},
		probe{"S1 routes", func() string { return strconv.Itoa(r.pc.Servers[0].Server().NumRoutes()) }},
		probe{"S1 leads", func() string { return leaderships(r.pc, 0) }},
		probe{"S2 leads", func() string { return leaderships(r.pc, 1) }},
		probe{"S3 leads", func() string { return leaderships(r.pc, 2) }},
	)
	cut := time.Now()
	r.pc.Isolate(cutSrv)
	tl.mark(fmt.Sprintf("S%d (%s's) cut off from the others", cutSrv+1, active))
	hold(20 * time.Second)
	for j := range r.pc.Servers {
		heldBytes += r.pc.RouteProxy(j).HeldBytes()
	}
	healed := time.Now()
	r.pc.Heal()
	tl.mark(fmt.Sprintf("healed (%d bytes held on the routes)", heldBytes))
	r.progress(t, 300)
	tl.halt(t)
	r.finish(t)

	n0 := logLines(r.procs[active].log.String(), cut)
	if l, ok := firstLine(n0, renewLog); ok {
		t.Logf("%s's first failed lease renewal %v after the cut", active, l.at.Sub(cut).Round(time.Millisecond))
	}
	end := healed
	stood, stoodOK := firstLine(n0, standDownLog)
	if stoodOK {
		end = stood.at
		t.Logf("%s (the active handler) stood down %v after the cut (%v after the heal): %s", active, stood.at.Sub(cut).Round(time.Millisecond),
			stood.at.Sub(healed).Round(time.Millisecond), stood.text)
	} else {
		t.Errorf("%s logged no stand-down after the cut", active)
	}
	t.Logf("%s before it stood down: %d failed lease renewals, %d move decisions, %d 'routing floor past the ingress end' errors",
		active, countLines(n0, renewLog, end), countLines(n0, decisionLog, end), countLines(n0, floorLog, end))
	if stoodOK {
		for _, l := range n0 {
			if l.at.After(stood.at) && l.at.Before(healed) && (decisionLog.MatchString(l.text) || floorLog.MatchString(l.text)) {
				t.Errorf("%s decided after it stood down, before the heal: %s", active, l.text)
			}
		}
	}
	// The fault had its effect: the majority side's backup took over, and
	// only after n0 had stopped deciding.
	if l, ok := firstLine(logLines(r.procs[backup].log.String(), cut), activeLog); ok && l.at.Before(healed) {
		t.Logf("%s became the active handler %v after the cut", backup, l.at.Sub(cut).Round(time.Millisecond))
		if stoodOK && !stood.at.Before(l.at) {
			t.Errorf("%s stood down %v after %s became active: two handlers decided at once", active, stood.at.Sub(l.at).Round(time.Millisecond), backup)
		}
	} else {
		t.Errorf("%s did not become the active handler during the cut: did the cut take effect?", backup)
	}
}

// A REMOTE node's link to its server is black-holed for 12 s, then
// healed: n0 LOCAL on server 0, n1 LOCAL on server 1, n2 REMOTE on server
// 2. n2's groups move off it past the node grace; after the heal,
// rebalancing may move groups back to it while what it sent before the
// cut arrives. Every acknowledged message is delivered, stored once, each
// group in order.
func TestPartitionRemoteLinkBlackHoled(t *testing.T) {
	t.Parallel() // see doc.go
	r := startPartitionRun(t, []partitionNode{{"n0", "LOCAL", 0}, {"n1", "LOCAL", 1}, {"n2", "REMOTE", 2}},
		[]int{14, 13, 13})
	natstest.Eventually(t, 30*time.Second, func() error {
		if n := r.boundTo("n2"); n <= 0 {
			return errors.New("n2 holds no group yet; the test needs some")
		}
		return nil
	})
	r.progress(t, 300)
	link := r.links["n2"]
	tl := startTimeline(t,
		probe{"lease", r.holder},
		probe{"groups on n2", func() string { return strconv.Itoa(r.boundTo("n2")) }},
	)
	link.Hold()
	tl.mark("n2's link black-holed")
	hold(12 * time.Second)
	held := link.HeldBytes()
	r.pc.Heal()
	tl.mark(fmt.Sprintf("healed (%d bytes held on n2's link)", held))
	r.progress(t, 300)
	tl.halt(t)
	r.finish(t)
}

// checkPartition finds what it is for: an order violation (with its
// trace), a loss, a copy; and takes a redelivery for neither.
func TestCheckPartition(t *testing.T) {
	t.Parallel() // see doc.go
	t0 := time.Now()
	d := func(ms int, node string, qseq uint64, body string, delivered uint64) delivery {
		g, _, _ := strings.Cut(body, "/")
		return delivery{received: received{node: node, group: g, body: body}, at: t0.Add(time.Duration(ms) * time.Millisecond),
			queueSeq: qseq, delivered: delivered, epoch: 1}
	}
	moved := func(x delivery, from string) delivery { x.movedFrom = from; return x }
	cs := func(x delivery, consSeq uint64) delivery { x.consSeq = consSeq; return x }
	want := map[string][]string{"g": {"g/0", "g/1", "g/2"}, "h": {"h/0", "h/1"}}
	for _, tc := range []struct {
		name                  string
		got                   []delivery
		outOfOrder, lost, cpy int
		redelivered           int
		example               string
		queueOrder            bool // the violation is the queue consumer's
	}{
		{"clean, with a redelivery", []delivery{d(1, "n0", 1, "g/0", 1), d(2, "n0", 2, "h/0", 1), d(3, "n0", 3, "g/1", 1),
			d(4, "n1", 4, "g/2", 1), d(5, "n1", 5, "h/1", 1), d(9, "n0", 1, "g/0", 2)}, 0, 0, 0, 1, "", false},
		{"a message ahead of its group", []delivery{d(1, "n0", 1, "g/0", 1), d(2, "n0", 9, "g/2", 1), d(3, "n2", 4, "g/1", 1),
			d(4, "n0", 2, "h/0", 1), d(5, "n0", 3, "h/1", 1)}, 1, 0, 0, 0, "g/2@n0#9 g/1@n2#4", false},
		{"a delivery late on its queue", []delivery{d(1, "n0", 1, "g/0", 1), d(2, "n0", 3, "g/2", 1), d(3, "n0", 2, "g/1", 1),
			d(4, "n0", 4, "h/0", 1), d(5, "n0", 5, "h/1", 1)}, 1, 0, 0, 0, "g/2@n0#3 g/1@n0#2", true},
		{"lost and copied", []delivery{d(1, "n0", 1, "g/0", 1), d(2, "n0", 2, "g/1", 1), d(3, "n1", 5, "g/1", 1),
			d(4, "n1", 6, "g/2", 1), d(5, "n0", 3, "h/0", 1)}, 0, 1, 1, 0, "", false},
		// Past the ack wait: JetStream's at-least-once, not the router's.
		{"copied past the ack wait", []delivery{d(1, "n0", 1, "g/0", 1), d(2, "n0", 2, "g/1", 1), moved(d(40_000, "n1", 5, "g/1", 1), "n0"),
			d(40_001, "n1", 6, "g/2", 1), d(5, "n0", 3, "h/0", 1), d(6, "n0", 4, "h/1", 1)}, 0, 0, 0, 0, "", false},
		// Routed twice (not moved) is the router's, however late; so is
		// a copy moved off a node's queue other than the first's.
		{"routed twice, moved off another queue", []delivery{d(1, "n0", 1, "g/0", 1), d(2, "n0", 2, "g/1", 1), moved(d(40_000, "n1", 5, "g/1", 1), "n2"),
			d(40_001, "n1", 6, "g/2", 1), d(5, "n0", 3, "h/0", 1), d(6, "n0", 4, "h/1", 1)}, 0, 0, 1, 0, "", false},
		{"routed twice, late", []delivery{d(1, "n0", 1, "g/0", 1), d(2, "n0", 2, "g/1", 1), d(40_000, "n1", 5, "g/1", 1),
			d(40_001, "n1", 6, "g/2", 1), d(5, "n0", 3, "h/0", 1), d(6, "n0", 4, "h/1", 1)}, 0, 0, 1, 0, "", false},
		{"redelivered behind later ones on one queue", []delivery{d(1, "n0", 1, "g/0", 1), d(2, "n0", 3, "g/2", 1), d(3, "n0", 2, "g/1", 2),
			d(4, "n0", 4, "h/0", 1), d(5, "n0", 5, "h/1", 1)}, 0, 0, 0, 0, "", false},
		{"moved off the queue the later one was processed from", []delivery{d(1, "n0", 1, "g/0", 1), d(2, "n0", 3, "g/2", 1),
			moved(d(3, "n1", 7, "g/1", 1), "n0"), d(4, "n0", 4, "h/0", 1), d(5, "n0", 5, "h/1", 1)}, 0, 0, 0, 0, "", false},
		{"redelivered: delivered first, held in transit", []delivery{d(1, "n0", 1, "g/0", 1), cs(d(2, "n0", 3, "g/2", 1), 9), cs(d(3, "n0", 2, "g/1", 1), 2),
			d(4, "n0", 4, "h/0", 1), d(5, "n0", 5, "h/1", 1)}, 0, 0, 0, 0, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := checkPartition(tc.got, want)
			if len(c.OutOfOrder) != tc.outOfOrder || len(c.Lost) != tc.lost || len(c.Copies) != tc.cpy || c.Redelivered != tc.redelivered {
				t.Errorf("out of order %v, lost %v, copies %v, redelivered %d; want %d, %d, %d, %d",
					c.OutOfOrder, c.Lost, c.Copies, c.Redelivered, tc.outOfOrder, tc.lost, tc.cpy, tc.redelivered)
			}
			if tc.example != "" && c.OutOfOrder["g"] != tc.example {
				t.Errorf("violation %q, want %q (trace %s)", c.OutOfOrder["g"], tc.example, c.Traces["g"])
			}
			if _, q := c.QueueOrder["g"]; q != tc.queueOrder {
				t.Errorf("taken for the queue consumer's: %v, want %v", q, tc.queueOrder)
			}
			if late := strings.HasPrefix(tc.name, "copied past"); late != (len(c.LateCopies) == 1) {
				t.Errorf("late copies %v", c.LateCopies)
			}
			if re := strings.HasPrefix(tc.name, "redelivered") || strings.HasPrefix(tc.name, "moved off"); re != (len(c.Redeliveries) == 1) {
				t.Errorf("redeliveries %v", c.Redeliveries)
			}
		})
	}
}
