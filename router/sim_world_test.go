package router

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/grouprouter/grouprouter/proposals"
)

// The deterministic simulation (TestSimulation): the record state machine
// (proposals.Transition) behind a simulated LOCAL handler, and the lane
// engine of 2–4 simulated nodes behind simulated shells, over a simulated
// ingress stream, bindings bucket, node registry, queue stream (duplicate
// window included), dead-letter stream and queue consumers. One seeded
// random source drives everything: latencies (and so the order in which
// messages, records and replies arrive), losses, failures, crashes,
// partitions (a node's link black-holed, what it held delivered at the
// heal: simCut) and the operator's moves. There is no wall clock, and the
// only goroutines are the real shells', which run between the world's
// instants (sim_shell_test.go): a seed replays exactly. The files:
//
//	sim_world_test.go     the clock, the agenda of events, a run's profile, the faults
//	sim_state_test.go     the bindings bucket and the node registry (each process watches them with a real kvbinding.Cache and LiveView)
//	sim_queue_test.go     the queue stream, the dead-letter stream, the queue consumers
//	sim_node_test.go      a router node: the real engine in simulated shells
//	sim_shell_test.go     the real hand-over shell, asker, liveness, timers, checkpoint loop and fair shell, on stand-ins
//	sim_handler_test.go   the LOCAL handler: decisions, the monitor, pauses, the lease
//	sim_check_test.go     the invariants
//	sim_test.go           TestSimulation, TestSimulationRegressions
//
// The engine (engine.go), the hand-over shell (handover.go, stage.go: its
// drain, staging and catch-up steps, reports and retries), the asker
// (ask.go: its requests in flight, a fence's look at its queue), liveness
// (liveness.go: the heartbeat, the consumer's presence, the catch-up with
// the records after a lapse), the engine's timers (runTimers), the
// checkpoint loop (runCheckpoints), the fair shell (fair.go: its rounds
// and releases of held messages; heldFound at a start), the publisher
// (publish.go), the change loop (runChanges), the ingress decoder, the
// bindings cache (kvbinding.Cache: its revision rules and views, fed
// through Cache.Feed with the values the bucket stores), the live nodes'
// view (kvbinding.LiveView: its change rules, and its expiry of a node by
// looking its record up, the registry's expiry leaving no marker), the
// live set a node counts on (liveNodes) and what it announces of its
// groups (engineReport), the handler's live state and monitor input
// (proposals.LiveState, GatherMonitorInput), the duties a
// start resumes (dutiesOf), the record state machine
// (proposals.Transition), the node-choice rules (proposals/choose.go,
// route.go), the tracker and the handler's authority rule
// (proposals.AuthorityEnd) are the real code. The other shells around
// them are models written after router.go, ingest.go and
// proposals/handler.go, apply.go, monitor.go, call for call: they must
// be kept in step with those files.
// What the simulation
// does not model: a partition between the servers (only a node's link is
// cut: the servers stay one side); the handler's worker
// limit and busy replies, and the asker's 8 requests in flight;
// priority-group pinning (one consumer process per queue, which may leave
// and come back); the fair share's automatic share (the seeds with one
// fix it, at 1 to 3 messages; the queue consumer's window is not read);
// the lost book (lost.go); subjects too long to republish; gaps in the ingress
// sequence (deleted or expired messages); an invalid or unreadable
// checkpoint; events and the inspect views; KV watch restarts replaying
// history; clock skew (one virtual clock); and JetStream itself beyond
// what is listed: stores with a duplicate window, work-queue acks,
// deletes, direct gets, subject-filtered reads and states, ordered
// consumers' fetches, consumer pauses and infos, per-message TTLs with
// delete markers, delivery with an ack wait.

// simEpoch is where the virtual clock starts.
func simEpoch() time.Time { return time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC) }

// Constants of the simulated deployment, as in the real one.
const (
	simHeartbeat   = DefaultHeartbeat
	simCheckpoint  = DefaultCheckpoint
	simLeaseTTL    = DefaultLeaseTTL
	simLeaseTick   = simLeaseTTL / 4 // the handler's lease loop (proposals.Handler.Run)
	simPubTimeout  = 5 * time.Second // jspub.New(nc, 5*time.Second) in Router.Run
	simPauseWindow = 10 * time.Second
	simMaxSteps    = 3_000_000
)

// simProfile is one run's shape: sizes, settings and how faulty it is.
type simProfile struct {
	nodes, locals, groups, messages int
	pUngrouped, pInvalid, pClose    float64
	active                          time.Duration // faults and producers stop after this

	// Node and handler settings.
	timeout     time.Duration
	maxAttempts int
	maxHeld     int
	maxInFlight int
	// maxBatch, maxBatches: atomic batches of a group's backlog (off
	// below 2) and the batches a node keeps in flight.
	maxBatch, maxBatches int
	// fastBatches: the batches are fast-ingest ones (an R1 queue stream),
	// stored message by message, not atomic ones.
	fastBatches bool
	// bursts: the producer publishes in up to 4 bursts of 50 ms, so that
	// groups have backlogs (batches).
	bursts       bool
	localFirst   bool
	groupTimeout time.Duration
	reaperPeriod time.Duration
	nodeGrace    time.Duration
	rebindAfter  time.Duration
	fence        time.Duration // FenceDeadline
	recordTTL    time.Duration
	ackWait      time.Duration
	prefetch     int
	// rebalance: the handler's rebalancing (on in odd seeds).
	rebalance proposals.RebalanceConfig
	// join: the last REMOTE node and its consumer join during the active
	// phase, without a checkpoint (seeds divisible by 3, with a REMOTE
	// node), instead of starting with the others.
	join bool

	// Per-operation fault probabilities.
	pDrop     float64 // an ask, reply or step report is lost (the asker times out)
	pSlow     float64 // a network hop takes 50 ms – 1.5 s
	pPubFail  float64 // a publish fails before it is stored
	pAckLost  float64 // a publish is stored but its ack is lost (the client times out)
	pLate     float64 // a publish lands after the client's 5 s publish timeout
	pKVFail   float64 // a KV write or registry call fails
	pOpFail   float64 // a queue get, delete, pause, ingress read fails
	pSlowCons float64 // a consumer takes 1–4 s over a message

	// Fault events during the active phase.
	crashes, stops, standDowns, consumerFlaps, moves, unbinds, announceGaps int
	// partitions: a node's link black-holed for a while (faultPartition).
	partitions int
	windowLoss bool
	calm       bool
	// spillFrom, maxSpilled: the engine's spilling (0: off).
	spillFrom, maxSpilled int64
	// maxGroups: the handler's group limit (0: none).
	maxGroups int
	// groupShare: Config.GroupShare, a fixed share of the queue window
	// per group, past which a group's messages wait on the node's held
	// subject for the real fair shell to release (0: none held back).
	groupShare int
}

func newSimProfile(rng *rand.Rand) simProfile {
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo+1)) * time.Millisecond }
	pick := func(ps ...float64) float64 { return ps[rng.IntN(len(ps))] }
	p := simProfile{
		nodes:        2 + rng.IntN(3),
		groups:       1 + rng.IntN(5),
		messages:     5 + rng.IntN(36),
		active:       ms(8000, 25000),
		timeout:      ms(500, 2000),
		maxHeld:      100_000,
		maxInFlight:  DefaultMaxInFlight,
		localFirst:   rng.IntN(3) == 0,
		nodeGrace:    ms(1500, 5000),
		rebindAfter:  ms(2000, 6000),
		fence:        ms(1500, 5000),
		recordTTL:    ms(20000, 60000),
		ackWait:      ms(3000, 10000),
		prefetch:     1 + rng.IntN(4),
		reaperPeriod: ms(500, 1500),
	}
	p.locals = 1 + rng.IntN(2)
	if rng.IntN(4) == 0 {
		p.pUngrouped = 0.15
	}
	if rng.IntN(6) == 0 {
		p.pInvalid = 0.05
	}
	if rng.IntN(4) == 0 {
		p.pClose = 0.08
	}
	if rng.IntN(3) == 0 {
		p.maxAttempts = 2 + rng.IntN(3)
	}
	if rng.IntN(5) == 0 {
		p.maxHeld = 2 + rng.IntN(6)
	}
	if rng.IntN(5) == 0 {
		p.maxInFlight = 1 + rng.IntN(3)
	}
	if rng.IntN(3) == 0 {
		p.groupTimeout = ms(1000, 4000)
	}
	if rng.IntN(5) == 0 {
		p.rebindAfter = -1
	}
	if rng.IntN(4) != 0 {
		p.maxBatch, p.maxBatches = 2+rng.IntN(7), 1+rng.IntN(3)
		p.bursts = rng.IntN(2) == 0
	}
	p.calm = rng.IntN(5) == 0
	if p.calm {
		return p
	}
	p.pDrop = pick(0, 0.02, 0.08)
	p.pSlow = pick(0, 0.01, 0.05)
	p.pPubFail = pick(0, 0.02, 0.1)
	p.pAckLost = pick(0, 0.01, 0.05)
	p.pKVFail = pick(0, 0.01, 0.05)
	p.pOpFail = pick(0, 0.01, 0.05)
	p.pSlowCons = pick(0, 0.01, 0.05)
	if rng.IntN(10) == 0 {
		p.pLate = 0.02
	}
	p.crashes = rng.IntN(4)
	p.stops = rng.IntN(2)
	p.standDowns = rng.IntN(3)
	p.consumerFlaps = rng.IntN(4)
	p.moves = rng.IntN(4)
	p.unbinds = rng.IntN(2)
	if rng.IntN(8) == 0 {
		p.announceGaps = 1
	}
	p.windowLoss = rng.IntN(20) == 0
	return p
}

func (p simProfile) String() string {
	extra := ""
	if p.join {
		extra += ", the last node joins later"
	}
	if p.rebalance.Enabled {
		extra += ", rebalancing"
	}
	if p.maxGroups > 0 {
		extra += fmt.Sprintf(", at most %d groups bound", p.maxGroups)
	}
	if p.spillFrom > 0 {
		extra += fmt.Sprintf(", spilling (at most %d bytes)", p.maxSpilled)
	}
	if p.groupShare > 0 {
		extra += fmt.Sprintf(", a share of %d unacknowledged messages per group", p.groupShare)
	}
	if p.maxBatch > 1 {
		kind := "atomic"
		if p.fastBatches {
			kind = "fast-ingest"
		}
		extra += fmt.Sprintf(", %s batches of %d (%d in flight)", kind, p.maxBatch, p.maxBatches)
		if p.bursts {
			extra += " with bursts"
		}
	}
	if p.calm {
		return fmt.Sprintf("calm: %d nodes (%d LOCAL)%s, %d groups, %d messages", p.nodes, p.locals, extra, p.groups, p.messages)
	}
	return fmt.Sprintf("%d nodes (%d LOCAL)%s, %d groups, %d messages; crashes %d, stops %d, stand-downs %d, consumer flaps %d, moves %d, unbinds %d, announce gaps %d, partitions %d, window loss %v; p(drop %.2f slow %.2f pubfail %.2f acklost %.2f late %.2f kv %.2f op %.2f)",
		p.nodes, p.locals, extra, p.groups, p.messages, p.crashes, p.stops, p.standDowns, p.consumerFlaps, p.moves, p.unbinds, p.announceGaps, p.partitions, p.windowLoss,
		p.pDrop, p.pSlow, p.pPubFail, p.pAckLost, p.pLate, p.pKVFail, p.pOpFail)
}

// simEvent is something that happens at a virtual time; seq breaks ties
// in the order events were scheduled.
type simEvent struct {
	at  time.Duration
	seq uint64
	fn  func()
}

type simAgenda []simEvent

func (h simAgenda) Len() int { return len(h) }
func (h simAgenda) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h simAgenda) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *simAgenda) Push(x any)   { *h = append(*h, x.(simEvent)) }
func (h *simAgenda) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = simEvent{}
	*h = old[:len(old)-1]
	return e
}

// simIngress is one message of the ingress stream.
type simIngress struct {
	seq     uint64
	group   string
	invalid string // why the group id is unusable ("" if fine)
	close   bool   // Group-Seq: -1
	at      time.Duration
}

// simWorld is one run.
type simWorld struct {
	seed    uint64
	rng     *rand.Rand
	p       simProfile
	clock   time.Duration
	agenda  simAgenda
	evSeq   uint64
	steps   int
	tracing bool
	trace   []string
	quiet   bool // faults are over
	stopped bool // a violation ended the run
	strict  bool // known issues are violations

	ingress []simIngress
	kv      *simKV
	reg     *simRegistry
	q       *simQueues
	nodes   []*simNode // the current incarnation of each node, by id
	lease   simLease
	gaps    []simGap // stretches without an active handler
	// cuts: the nodes whose link is black-holed now (faultPartition).
	cuts map[string]*simCut
	chk  *simChecker

	// The real shells' calls and log lines, queued by their goroutines,
	// and what wakes them at the next settle (sim_shell_test.go).
	callMu     sync.Mutex
	calls      []simCall
	shellLines []string
	wakes      []func()
}

func newSimWorld(seed uint64, tracing, strict bool) *simWorld {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	w := &simWorld{seed: seed, rng: rng, tracing: tracing, strict: strict}
	w.p = newSimProfile(rng)
	if seed%2 == 1 {
		// Without a draw from rng: the even seeds run as they did
		// before rebalancing was simulated.
		w.p.rebalance = proposals.RebalanceConfig{Enabled: true, Tolerance: int(seed / 2 % 2), MaxMoves: 2, MaxInFlight: 4,
			CoolDown: 3 * time.Second}
	}
	// Without a draw from rng either: other seeds run as before.
	w.p.join = seed%3 == 0 && w.p.nodes > w.p.locals
	if seed%7 == 3 {
		// A group limit of 1 to 3, below the groups of most seeds: binds
		// are refused and their groups dead-lettered, then bound again
		// once others close or expire.
		w.p.maxGroups = 1 + int(seed/7%3)
	}
	// A third of the seeds with batches have fast-ingest ones, again
	// without a draw.
	w.p.fastBatches = w.p.maxBatch > 1 && seed%3 == 1
	if seed%4 == 2 {
		// Spilling past one held message of 100 bytes, and reading stops
		// after a few spilled ones: messages waiting for a decision go
		// without their body most of the time.
		w.p.spillFrom, w.p.maxSpilled = 100, int64(200*(1+seed/4%8))
	}
	// A third of the fault-prone seeds have 1 to 3 partitions, without a
	// draw: the others run as before.
	if !w.p.calm && seed%3 == 2 {
		w.p.partitions = 1 + int(seed/3%3)
	}
	if seed%5 == 4 {
		// A fair share of 1 to 3 messages per group, without a draw:
		// groups with a backlog are held back, and the real fair shell
		// releases them as their consumer acknowledges.
		w.p.groupShare = 1 + int(seed/5%3)
	}
	w.cuts = map[string]*simCut{}
	w.kv = newSimKV(w)
	w.reg = newSimRegistry(w)
	w.q = newSimQueues(w)
	w.chk = newSimChecker(w)
	w.gaps = []simGap{{from: 0, to: -1}}
	return w
}

func (w *simWorld) now() time.Time { return simEpoch().Add(w.clock) }

// after schedules fn d from now.
func (w *simWorld) after(d time.Duration, fn func()) {
	w.evSeq++
	heap.Push(&w.agenda, simEvent{at: w.clock + max(d, 0), seq: w.evSeq, fn: fn})
}

// run carries out the events due up to until, then sets the clock there.
// After each instant's events the shells' goroutines run (settle).
func (w *simWorld) run(until time.Duration) {
	w.settle()
	for len(w.agenda) > 0 && !w.stopped && w.agenda[0].at <= until {
		ev := heap.Pop(&w.agenda).(simEvent)
		w.clock = ev.at
		w.steps++
		if w.steps > simMaxSteps {
			w.chk.violation("runaway", "more than %d events: the system does not settle", simMaxSteps)
			return
		}
		ev.fn()
		if len(w.agenda) == 0 || w.agenda[0].at > w.clock {
			w.settle()
		}
	}
	if w.clock < until {
		w.clock = until
	}
}

// logf adds a line to the step trace (only when tracing).
func (w *simWorld) logf(who, format string, args ...any) {
	if !w.tracing {
		return
	}
	w.trace = append(w.trace, fmt.Sprintf("%9.4fs %-8s %s", w.clock.Seconds(), who, fmt.Sprintf(format, args...)))
}

// chance reports, during the faulty phase, whether a fault of probability
// p happens.
func (w *simWorld) chance(p float64) bool {
	return !w.quiet && p > 0 && w.rng.Float64() < p
}

// between returns a uniformly random duration in [lo, hi].
func (w *simWorld) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)+1))
}

// lat is one network hop: mostly under 2 ms, sometimes tens of ms, and in
// the faulty phase sometimes up to 1.5 s.
func (w *simWorld) lat() time.Duration {
	if w.chance(w.p.pSlow) {
		return w.between(50*time.Millisecond, 1500*time.Millisecond)
	}
	if w.rng.IntN(4) == 0 {
		return w.between(2*time.Millisecond, 30*time.Millisecond)
	}
	return w.between(100*time.Microsecond, 2*time.Millisecond)
}

// node returns the current incarnation of node id.
func (w *simWorld) node(id string) *simNode {
	for _, n := range w.nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

func simNodeID(i int) string  { return fmt.Sprintf("n%d", i) }
func simGroupID(i int) string { return fmt.Sprintf("g%d", i) }

// setup creates the nodes, the producer and the faults of the run.
func (w *simWorld) setup() {
	p := w.p
	joiner := ""
	if p.join {
		joiner = simNodeID(p.nodes - 1)
	}
	for i := 0; i < p.nodes; i++ {
		id := simNodeID(i)
		w.q.consumer(id).present = id != joiner
	}
	for i := 0; i < p.nodes; i++ {
		n := newSimNode(w, simNodeID(i), i < p.locals)
		w.nodes = append(w.nodes, n)
	}
	// Nodes start one after another, a little apart; a joiner later, with
	// its consumer.
	for _, n := range w.nodes {
		n := n
		if n.id == joiner {
			continue
		}
		w.after(w.between(0, 300*time.Millisecond), func() { n.start() })
	}
	if joiner != "" {
		w.afterAt(w.between(p.active/4, p.active*3/4), func() {
			n := w.node(joiner)
			if n == nil || n.up() {
				return
			}
			w.logf(joiner, "joins, with its consumer")
			w.q.consumer(joiner).back()
			n.start()
		})
	}
	// The producer: messages at random times over most of the active phase.
	times := make([]time.Duration, p.messages)
	var bursts []time.Duration
	if p.bursts {
		bursts = make([]time.Duration, 1+w.rng.IntN(4))
		for i := range bursts {
			bursts[i] = w.between(200*time.Millisecond, p.active*7/10)
		}
	}
	for i := range times {
		if len(bursts) > 0 {
			times[i] = bursts[w.rng.IntN(len(bursts))] + w.between(0, 50*time.Millisecond)
			continue
		}
		times[i] = w.between(200*time.Millisecond, p.active*7/10)
	}
	slices.Sort(times)
	hot := w.rng.IntN(p.groups)
	for _, at := range times {
		w.afterAt(at, func() { w.produce(hot) })
	}
	// Faults.
	at := func() time.Duration { return w.between(time.Second, p.active) }
	for i := 0; i < p.crashes; i++ {
		w.afterAt(at(), func() { w.faultCrash(false) })
	}
	for i := 0; i < p.stops; i++ {
		w.afterAt(at(), func() { w.faultCrash(true) })
	}
	for i := 0; i < p.standDowns; i++ {
		w.afterAt(at(), w.faultStandDown)
	}
	for i := 0; i < p.consumerFlaps; i++ {
		w.afterAt(at(), w.faultConsumer)
	}
	for i := 0; i < p.moves; i++ {
		w.afterAt(at(), func() { w.faultMove(false) })
	}
	for i := 0; i < p.unbinds; i++ {
		w.afterAt(at(), func() { w.faultMove(true) })
	}
	for i := 0; i < p.announceGaps; i++ {
		w.afterAt(at(), w.faultAnnounceGap)
	}
	for i := 0; i < p.partitions; i++ {
		w.afterAt(at(), w.faultPartition)
	}
	if p.windowLoss {
		w.afterAt(at(), func() {
			if !w.quiet {
				w.logf("queue", "server restart: the duplicate window forgets consumed messages")
				w.q.loseWindow()
			}
		})
	}
}

// afterAt schedules fn at virtual time at.
func (w *simWorld) afterAt(at time.Duration, fn func()) { w.after(at-w.clock, fn) }

// produce stores one message in the ingress stream.
func (w *simWorld) produce(hot int) {
	m := simIngress{seq: uint64(len(w.ingress) + 1), at: w.clock}
	r := w.rng.Float64()
	switch {
	case r < w.p.pInvalid:
		m.invalid = "invalid Group-Id header: simulated"
	case r < w.p.pInvalid+w.p.pUngrouped:
	default:
		g := w.rng.IntN(w.p.groups)
		if w.rng.IntN(3) == 0 {
			g = hot // one group gets more traffic
		}
		m.group = simGroupID(g)
		m.close = w.rng.Float64() < w.p.pClose
	}
	w.ingress = append(w.ingress, m)
	if w.tracing {
		note := ""
		switch {
		case m.close:
			note = " (close)"
		case m.invalid != "":
			note = " (invalid)"
		}
		w.logf("ingress", "stored seq %d group %q%s", m.seq, m.group, note)
	}
	for _, n := range w.nodes {
		n.ingressGrew()
	}
}

// upNodes returns the running nodes.
func (w *simWorld) upNodes() []*simNode {
	var out []*simNode
	for _, n := range w.nodes {
		if n.up() {
			out = append(out, n)
		}
	}
	return out
}

// anyUp draws a running node, or returns nil: none runs, or the faults
// are over.
func (w *simWorld) anyUp() *simNode {
	if w.quiet {
		return nil
	}
	up := w.upNodes()
	if len(up) == 0 {
		return nil
	}
	return up[w.rng.IntN(len(up))]
}

func (w *simWorld) faultCrash(graceful bool) {
	n := w.anyUp()
	if n == nil {
		return
	}
	restart := w.rng.IntN(5) > 0
	down := w.between(300*time.Millisecond, 2*w.p.nodeGrace)
	if graceful {
		n.stop(func() { w.scheduleRestart(n.id, restart, down) })
		return
	}
	n.crash()
	w.scheduleRestart(n.id, restart, down)
}

func (w *simWorld) scheduleRestart(id string, restart bool, down time.Duration) {
	if !restart {
		return // perhaps at quiescence
	}
	w.after(down, func() {
		if n := w.node(id); n != nil && !n.up() && !n.stopping {
			w.restart(id)
		}
	})
}

// restart starts a new incarnation of node id (behind a cut link, once
// it heals: it loads its state from the servers first).
func (w *simWorld) restart(id string) {
	if w.cutOff(id) {
		w.hop(id, 0, func() {
			if n := w.node(id); n != nil && !n.up() && !n.stopping {
				w.restart(id)
			}
		})
		return
	}
	for i, n := range w.nodes {
		if n.id == id {
			nn := newSimNode(w, id, n.local)
			w.nodes[i] = nn
			nn.start()
			return
		}
	}
}

func (w *simWorld) faultStandDown() {
	if w.quiet || w.lease.term == nil || w.lease.term.dead {
		return
	}
	w.lease.term.standDown("lease lost")
}

func (w *simWorld) faultConsumer() {
	if w.quiet {
		return
	}
	c := w.q.consumer(simNodeID(w.rng.IntN(w.p.nodes)))
	if !c.present || c.leaving {
		return
	}
	c.leave(w.rng.IntN(2) == 0)
	if w.rng.IntN(4) > 0 {
		w.after(w.between(500*time.Millisecond, 10*time.Second), func() { c.back() })
	}
}

// faultMove is an operator's move (or unbind) of a group with a record.
func (w *simWorld) faultMove(unbind bool) {
	if w.quiet {
		return
	}
	groups := sortedKeys(w.kv.recs)
	if len(groups) == 0 {
		return
	}
	g := groups[w.rng.IntN(len(groups))]
	if g == "" {
		return // the operator cannot name the ungrouped routing binding
	}
	target := ""
	if !unbind {
		target = simNodeID(w.rng.IntN(w.p.nodes))
	}
	w.logf("operator", "asks to move %s to %q", g, target)
	w.after(w.lat(), func() {
		if h := w.activeHandler(); h != nil {
			w.hop(h.host.id, 0, func() { h.operator(g, target) })
		}
	})
}

// faultAnnounceGap makes a live node's announcements fail for a while:
// its liveness record expires while it keeps routing.
func (w *simWorld) faultAnnounceGap() {
	n := w.anyUp()
	if n == nil {
		return
	}
	d := w.between(2*time.Second, 2*w.p.nodeGrace+3*time.Second)
	n.announceFailUntil = w.clock + d
	w.logf(n.id, "announcements fail for %v", d)
}

// simCut is a node's link black-holed: the connections stay open, nothing
// flows either way, and what was sent is delivered, in order, when the
// link heals, as through the nemesis's link proxies. The node's process
// runs on meanwhile, by its own clock.
type simCut struct {
	held []func()
}

// cutOff reports whether node id's link is black-holed now.
func (w *simWorld) cutOff(id string) bool { return w.cuts[id] != nil }

// hop carries fn over node id's link (to or from the servers): it runs
// after d, or, if the link is cut then, when the link heals, after what
// was held before it. With d 0 and the link up it runs at once.
func (w *simWorld) hop(id string, d time.Duration, fn func()) {
	arrive := func() {
		if c := w.cuts[id]; c != nil {
			c.held = append(c.held, fn)
			return
		}
		fn()
	}
	if d == 0 {
		arrive()
		return
	}
	w.after(d, arrive)
}

// faultPartition black-holes a running node's link for 1 s to past twice
// the node grace: half the time the active handler's node, so that a
// standby takes the lease while the cut-off handler runs on.
func (w *simWorld) faultPartition() {
	n := w.anyUp()
	if n == nil {
		return
	}
	if h := w.activeHandler(); h != nil && w.rng.IntN(2) == 0 && h.host.up() {
		n = h.host
	}
	if w.cutOff(n.id) {
		return
	}
	d := w.between(time.Second, 2*w.p.nodeGrace+4*time.Second)
	w.cuts[n.id] = &simCut{}
	w.chk.stats.partitions++
	w.logf(n.id, "link black-holed for %v", d)
	w.after(d, func() { w.heal(n.id) })
}

// heal ends a cut: what the link held arrives, in the order it was sent,
// before anything sent from now on.
func (w *simWorld) heal(id string) {
	c := w.cuts[id]
	if c == nil {
		return
	}
	delete(w.cuts, id)
	w.chk.stats.held += uint64(len(c.held))
	w.logf(id, "link heals: %d held deliveries arrive", len(c.held))
	for i, fn := range c.held {
		w.after(time.Duration(i+1)*time.Nanosecond, fn)
	}
}

// beginQuiet ends the faults: no more losses or failures, every consumer
// comes back, most crashed nodes restart, and a LOCAL node runs.
func (w *simWorld) beginQuiet() {
	w.quiet = true
	w.logf("world", "faults end")
	for _, id := range sortedKeys(w.cuts) {
		w.heal(id)
	}
	for _, n := range w.nodes {
		n.announceFailUntil = 0
		c := w.q.consumer(n.id)
		if !c.present || c.leaving {
			c := c
			w.after(w.between(0, time.Second), func() { c.back() })
		}
	}
	anyLocal := false
	for _, n := range w.nodes {
		if n.local && (n.up() || n.stopping) {
			anyLocal = true
		}
	}
	for _, n := range w.nodes {
		if n.up() || n.stopping {
			continue
		}
		if w.rng.IntN(10) < 7 || (n.local && !anyLocal) {
			anyLocal = anyLocal || n.local
			id := n.id
			w.after(w.between(0, 2*time.Second), func() {
				if nn := w.node(id); nn != nil && !nn.up() && !nn.stopping {
					w.restart(id)
				}
			})
		}
	}
}

// ensureLocal restarts a LOCAL node when none runs (one that was stopping
// as the faults ended may have stayed down).
func (w *simWorld) ensureLocal() {
	for _, n := range w.nodes {
		if n.local && (n.up() || n.stopping || !n.started) {
			return
		}
	}
	for _, n := range w.nodes {
		if n.local {
			w.restart(n.id)
			return
		}
	}
}

// runAll runs the whole simulation and the final checks.
func (w *simWorld) runAll() {
	defer w.shutdown()
	w.setup()
	w.run(w.p.active)
	if w.stopped {
		return
	}
	w.beginQuiet()
	start := w.clock
	settledAt := time.Duration(-1)
	for !w.stopped {
		w.run(w.clock + time.Second)
		if w.stopped {
			return
		}
		w.ensureLocal()
		if why := w.chk.unsettled(); why != "" {
			settledAt = -1
			if w.clock-start > 3*time.Minute {
				w.chk.stranded(fmt.Sprintf("not quiescent %v after the faults ended: %s", w.clock-start, why))
				return
			}
			continue
		}
		if settledAt < 0 {
			settledAt = w.clock
			continue
		}
		if w.clock-settledAt >= 20*time.Second {
			break
		}
	}
	w.chk.final()
}

// tail returns the last n lines of the trace.
func (w *simWorld) tail(n int) string {
	lines := w.trace
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
