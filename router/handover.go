package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/grouprouter/grouprouter/internal/jsack"
	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// The hand-over shell takes over the groups whose record names this node
// as their new owner, one step at a time (see proposals.Transition):
//
//   - StepDrain: move the group's messages still waiting on the queues in
//     the record's Drain list to this node's queue, in ingress order (the
//     handler paused those queues' consumers before it wrote the record),
//     then report OpDrained; an evacuated group's catch-up is staged
//     meanwhile (stage.go);
//   - StepCatchUp: route from the ingress the group's messages from the
//     record's FromSeq that this node skipped while another node owned the
//     group, then report OpCaughtUp; the record is then settled and the
//     lane routes what it held.
//
// Each step is idempotent: a copy carries a message id derived from the
// record revision and the ingress sequence, a catch-up publish the
// ingress sequence's, so a step done twice (a restart, a retry) stores
// nothing twice within the queue stream's duplicate window. Whoever owns
// the record next (this node after a restart, another node after an
// evacuation) starts the step again from what the queues hold.

// handOver is the hand-over shell, a room of its own: it owns the steps
// handed to its node (duties) and runs them (run); it reaches the engine
// only through step and the views it is given (each taken under the
// router's lock), and the rest of its node only through the functions
// below. Router.newHandOver wires it.
type handOver struct {
	node        string
	groupHeader string
	log         *slog.Logger
	io          queueIO    // the streams (msgstore.go)
	clock       clock      // the time, and its timers (clock.go)
	nc          *nats.Conn // the progress events (progress.go)
	duties      *dutyQueue
	warn        struct {
		// publish: failed hand-over publishes (nil: not logged); late and
		// lapsed: see warners.
		publish, late, lapsed *logagg.Warner
	}

	// The engine: its one door, and the views the steps read.
	step                 func(input)
	fencedNow            func() bool
	takeoverFrom         func(group string) uint64
	ungroupedDestination func() string
	holds                bool // the engine holds messages on a held subject (engine.holds, fixed at start)

	// The rest of the node.
	lookup           func(group string) (kvbinding.Binding, bool)                                           // the binding cache
	propose          func(ctx context.Context, ps []proposals.Proposal) ([]proposals.Decision, error)       // the active handler
	loadCheckpointAt func(ctx context.Context, node string, rev uint64) (kvbinding.Checkpoint, bool, error) // nil: no registry
	saveCheckpoint   func(ctx context.Context) error
	lostThrough      func(ctx context.Context, routes map[string]kvbinding.Binding) map[string]uint64
	stored           func(seq uint64, id string) // the store check of the queue
	classify         func(hdr nats.Header, subject string) (group, invalid string)
	toDeadLetter     func(out *nats.Msg, subject string, seq uint64, reason string, stripped bool) *nats.Msg
}

// newHandOver returns r's hand-over shell, once setup made the engine, the
// binding cache, the registry and the handler's client.
func (r *Router) newHandOver() *handOver {
	h := &handOver{
		node: r.cfg.Node, groupHeader: r.cfg.GroupHeader, log: r.log, io: jsQueueIO(r.js, r.side), clock: sysClock{}, nc: r.nc, duties: newDutyQueue(),
		step:      r.step,
		fencedNow: r.fencedNow,
		takeoverFrom: func(group string) uint64 {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.eng.takeoverFrom(group)
		},
		ungroupedDestination: func() string {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.eng.ungroupedDestination()
		},
		holds:          r.eng.holds(),
		lookup:         r.cache.Lookup,
		propose:        r.dec.client.Propose,
		saveCheckpoint: r.saveCheckpoint,
		lostThrough:    r.lostThrough,
		stored:         r.qcheck.stored,
		classify:       decoder{r.cfg.GroupHeader}.classify,
		toDeadLetter:   r.out.toDeadLetter,
	}
	if r.reg != nil {
		h.loadCheckpointAt = r.reg.LoadCheckpointAt
	}
	h.warn.publish, h.warn.late, h.warn.lapsed = r.warn.handOver, r.warn.late, r.warn.lapsed
	return h
}

// dutyQueue holds the takeover steps handed to this node.
type dutyQueue struct {
	mu   sync.Mutex
	jobs map[string]dutyJob
	wake chan struct{}
	// movedThrough: per group, the highest ingress sequence its drain
	// found on another queue: its catch-up starts after it.
	movedThrough map[string]uint64
	// caught: per group being taken over, the last ingress sequence its
	// catch-up routed; saved in the checkpoint before the catch-up is
	// reported, so that a successor does not route those messages again.
	caught map[string]uint64
	// staged: per group being taken over, what its drain step's staging
	// learned (stage.go).
	staged map[string]*stagedSpan
}

type dutyJob struct {
	duty proposals.Duty
	rev  uint64
}

func newDutyQueue() *dutyQueue {
	return &dutyQueue{jobs: map[string]dutyJob{}, wake: make(chan struct{}, 1), movedThrough: map[string]uint64{}, caught: map[string]uint64{},
		staged: map[string]*stagedSpan{}}
}

func (q *dutyQueue) add(group string, duty proposals.Duty, rev uint64) {
	q.mu.Lock()
	if j, ok := q.jobs[group]; !ok || j.rev < rev {
		q.jobs[group] = dutyJob{duty: duty, rev: rev}
	}
	q.mu.Unlock()
	wake(q.wake)
}

// pending returns how many steps wait to be taken.
func (q *dutyQueue) pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.jobs)
}

func (q *dutyQueue) takeAll() map[string]dutyJob {
	q.mu.Lock()
	defer q.mu.Unlock()
	jobs := q.jobs
	q.jobs = map[string]dutyJob{}
	return jobs
}

// How the hand-over loop gathers the records of a burst into one batch
// (handOver.run).
const (
	handOverQuick  = 2 * time.Millisecond
	handOverFew    = 16
	handOverSettle = 20 * time.Millisecond
	handOverLimit  = 250 * time.Millisecond
)

// run runs the takeover steps handed to this node, in batches:
// a whole node's groups arrive at once when it is evacuated.
func (h *handOver) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, 4)
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.duties.wake:
		}
		// Let a burst of records (a whole node's groups) arrive first: wait
		// until none came for handOverSettle (at most handOverLimit), so
		// that one batch reads the old queues and the ingress once for all
		// of them. A few records (a rebalancing tick's, an operator's move)
		// go after handOverQuick: the old queue is paused meanwhile, which
		// holds back every group of its node.
		quick := h.clock.NewTimer(handOverQuick)
		settle := h.clock.NewTimer(handOverSettle)
		limit := h.clock.NewTimer(handOverLimit)
	gather:
		for {
			select {
			case <-ctx.Done():
				quick.Stop()
				settle.Stop()
				limit.Stop()
				return
			case <-h.duties.wake:
				settle.Reset(handOverSettle)
			case <-quick.C():
				if h.duties.pending() <= handOverFew {
					break gather
				}
			case <-settle.C():
				break gather
			case <-limit.C():
				break gather
			}
		}
		quick.Stop()
		settle.Stop()
		limit.Stop()
		drains, catchUps := splitDuties(h.duties.takeAll(), h.lookup, h.node, h.forgetDuty)
		for _, batch := range []map[string]dutyJob{drains, catchUps} {
			if len(batch) == 0 {
				continue
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				h.runSteps(ctx, batch)
			}()
		}
	}
}

// splitDuties sorts a round's steps into drains and catch-ups, in group
// order. A step whose record moved on (another revision, or a record that
// no longer asks node for it) is dropped with forget: the record's change
// hands the next step.
func splitDuties(jobs map[string]dutyJob, lookup func(string) (kvbinding.Binding, bool), node string,
	forget func(group string, rev uint64)) (drains, catchUps map[string]dutyJob) {
	drains, catchUps = map[string]dutyJob{}, map[string]dutyJob{}
	groups := make([]string, 0, len(jobs))
	for g := range jobs {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	for _, g := range groups {
		j := jobs[g]
		route, ok := lookup(g)
		if !ok || route.Revision != j.rev || proposals.DutyOf(route, node) != j.duty {
			forget(g, j.rev)
			continue
		}
		if j.duty == proposals.DutyDrain {
			drains[g] = j
		} else {
			catchUps[g] = j
		}
	}
	return drains, catchUps
}

// forgetDuty lets the engine hand a step again.
func (h *handOver) forgetDuty(group string, rev uint64) {
	h.step(inDutyDone{group: group, rev: rev})
}

// runSteps runs one batch of drain or catch-up steps and reports them.
func (h *handOver) runSteps(ctx context.Context, jobs map[string]dutyJob) {
	start := h.clock.Now()
	routes := map[string]kvbinding.Binding{}
	var duty proposals.Duty
	for _, g := range sortedKeys(jobs) {
		j := jobs[g]
		route, ok := h.lookup(g)
		if !ok || route.Revision != j.rev || proposals.DutyOf(route, h.node) != j.duty {
			// The record moved on since splitDuties looked (a batch may
			// wait for one of the loop's slots): the step is not this
			// node's any more, or not at this revision, and a step run on
			// the newer record would act for a record that names another
			// node (nemesis seed 712389592: a catch-up of a record bound
			// to n0, published onto n1's queue). Its change hands the next
			// step, if any is this node's.
			h.log.Debug("hand-over step dropped: its record moved on", "group", logagg.Short(g), "revision", j.rev, "now", route.Revision)
			delete(jobs, g)
			h.forgetDuty(g, j.rev)
			continue
		}
		routes[g] = route
		duty = j.duty
		h.log.Debug("hand-over step starts", "group", logagg.Short(g), "step", route.Step, "node", route.Node, "prev_node", route.PrevNode,
			"drain", route.Drain, "from_seq", route.FromSeq, "revision", route.Revision)
	}
	if len(jobs) == 0 {
		return
	}
	var (
		counts map[string]int
		err    error
		op     proposals.Op
	)
	ctx, prog := h.startProgress(ctx, duty, routes) // progress.go
	if duty == proposals.DutyDrain {
		op = proposals.OpDrained
		// The groups the old queues hold nothing of are reported at once,
		// not behind the batch's slowest group: their catch-up follows
		// within milliseconds, while the queue stream's duplicate window
		// still drops the copies of what the old node routed and its
		// consumer took. A batch of an evacuated node's groups waits up to
		// the ack wait (30 s) for the ones its cut-off consumer holds
		// unacknowledged: long enough for a rolling restart of the servers
		// to lose that window (docs/protocol.md, "Remaining windows"), so
		// the catch-ups of those that were evacuated are staged meanwhile
		// (stage.go), once the scan is over (it must not see part of
		// them, when this node's own held subject is among those drained).
		var (
			early    sync.WaitGroup
			stageErr error
			scanned  bool
		)
		staged := make(chan struct{})
		counts, err = h.drainQueues(ctx, routes, func(none, some []string) {
			scanned = true
			evacuated, not := toStage(routes, none, some)
			for _, g := range not {
				h.duties.notStaged(g, routes[g].Epoch)
			}
			go func() {
				defer close(staged)
				stageErr = h.stage(ctx, evacuated)
			}()
			if len(none) == 0 {
				return
			}
			ps := make([]proposals.Proposal, 0, len(none))
			revs := make(map[string]uint64, len(none))
			for _, g := range none {
				ps = append(ps, proposals.Proposal{Op: op, Group: g, Rev: jobs[g].rev})
				revs[g] = jobs[g].rev
				delete(jobs, g)
			}
			h.log.Debug("hand-over drain: the old queues hold nothing of these groups; reported at once", "groups", len(none))
			early.Go(func() {
				for _, g := range sortedKeys(h.report(ctx, ps)) {
					h.forgetDuty(g, revs[g])
				}
			})
		})
		if scanned {
			<-staged
			if err == nil {
				err = stageErr
			}
		}
		early.Wait()
	} else {
		op = proposals.OpCaughtUp
		counts, err = h.catchUp(ctx, routes)
	}
	prog.end(err)
	if err != nil {
		h.stepFailed(ctx, op, jobs, err)
		return
	}
	if op == proposals.OpCaughtUp {
		// What was caught up is in the checkpoint before the handler hears
		// of it: should this node be gone before the record is settled,
		// its successor starts after it.
		if err := h.saveCheckpoint(ctx); err != nil && ctx.Err() == nil {
			h.log.Warn("hand-over step: checkpoint not saved; retrying", "groups", len(jobs), "err", err)
			h.retrySteps(ctx, jobs)
			return
		}
	}
	ps := make([]proposals.Proposal, 0, len(jobs))
	groups := sortedKeys(jobs)
	for _, g := range groups {
		ps = append(ps, proposals.Proposal{Op: op, Group: g, Rev: jobs[g].rev, Count: counts[g]})
	}
	refused := h.report(ctx, ps)
	for _, g := range groups {
		if refused[g] {
			h.forgetDuty(g, jobs[g].rev)
		}
	}
	if op == proposals.OpCaughtUp {
		h.duties.mu.Lock()
		for g := range jobs {
			delete(h.duties.caught, g)
			delete(h.duties.staged, g)
		}
		h.duties.mu.Unlock()
	}
	h.log.Info("hand-over step done", "step", op, "groups", len(jobs), "messages", sum(counts), "took", since(h.clock, start))
}

// stepFailed logs a failed step and hands it back after a pause (the
// records still asking for it are taken again).
func (h *handOver) stepFailed(ctx context.Context, op proposals.Op, jobs map[string]dutyJob, err error) {
	if ctx.Err() != nil {
		return
	}
	if errors.Is(err, errSuperseded) {
		h.log.Info("hand-over step stopped: a record moved past its revision", "step", op, "groups", len(jobs))
	} else {
		h.log.Warn("hand-over step failed; retrying", "step", op, "groups", len(jobs), "err", err)
	}
	h.retrySteps(ctx, jobs)
}

// retrySteps hands failed steps back after a pause.
func (h *handOver) retrySteps(ctx context.Context, jobs map[string]dutyJob) {
	select {
	case <-ctx.Done():
		return
	case <-after(h.clock, time.Second):
	}
	for g, j := range jobs {
		h.duties.add(g, j.duty, j.rev)
	}
}

// report sends step reports in batches and returns the groups whose
// report the handler did not take (the record moved on meanwhile). A
// report the handler could not take yet is sent again (see sortReports):
// nothing else would hand the step back.
func (h *handOver) report(ctx context.Context, ps []proposals.Proposal) map[string]bool {
	refused := map[string]bool{}
	seen := func(group string) uint64 {
		route, _ := h.lookup(group)
		return route.Revision
	}
	for off := 0; off < len(ps); off += maxBatch {
		chunk := ps[off:min(off+maxBatch, len(ps))]
		for attempt := 1; ; attempt++ {
			ds, err := h.propose(ctx, chunk)
			if err == nil {
				for i, d := range ds {
					if d.Outcome == proposals.Accepted {
						h.log.Debug("hand-over step reported", "group", logagg.Short(d.Group), "op", chunk[i].Op, "revision", d.Revision)
					} else {
						h.log.Debug("hand-over step report not taken", "group", logagg.Short(d.Group), "op", chunk[i].Op, "outcome", d.Outcome,
							"revision", d.Revision, "err", d.Error)
					}
				}
				again, notTaken := sortReports(chunk, ds, seen)
				for _, g := range notTaken {
					refused[g] = true
				}
				if len(again) == 0 {
					break
				}
				chunk = again
			} else if ctx.Err() != nil {
				return refused
			} else if attempt&(attempt-1) == 0 {
				h.log.Warn("hand-over report failed; retrying", "reports", len(chunk), "err", err)
			}
			select {
			case <-ctx.Done():
				return refused
			case <-after(h.clock, backoffBase*time.Duration(min(attempt, 20))):
			}
		}
	}
	return refused
}

// sortReports sorts the handler's answers to step reports: the reports to
// send again, and the groups whose report was not taken because their
// record moved on (its change hands the next step). A report is sent
// again while the record, as this node sees it (seen), is still the
// revision reported and the handler either decided nothing (a failed
// record write) or answered from an older revision (its view of the
// record lags this node's: it refused a report of a step it has not seen).
func sortReports(sent []proposals.Proposal, ds []proposals.Decision, seen func(group string) uint64) (again []proposals.Proposal, notTaken []string) {
	for i, d := range ds {
		p := sent[i]
		switch {
		case d.Outcome == proposals.Accepted:
		case seen(p.Group) == p.Rev && (d.Outcome == proposals.Failed || d.Revision < p.Rev):
			again = append(again, p)
		default:
			notTaken = append(notTaken, d.Group)
		}
	}
	return again, notTaken
}

// sortedKeys returns m's keys in order: what a step does one after
// another, it does in the same order every time (its logs read alike, and
// the simulation replays a seed exactly).
func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K {
	return slices.Sorted(maps.Keys(m))
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// queued is a message found on another node's queue.
type queued struct {
	msg        *jetstream.RawStreamMsg
	from       string
	ingressSeq uint64
	group      string
	// held: found on the old node's held subject, not its queue.
	held bool
	// lapsed: moved although its old consumer was delivered it (its copy
	// says so: HeaderDeliveredBefore).
	lapsed bool
}

// ingressSubject returns the ingress subject of a message found on an old
// node's queue or held subject.
func (q queued) ingressSubject() string {
	if !q.held {
		return strings.TrimPrefix(q.msg.Subject, QueueSubjectPrefix+q.from+".")
	}
	rest := strings.TrimPrefix(q.msg.Subject, HeldSubjectPrefix+q.from+".")
	if t := strings.SplitN(rest, ".", 3); len(t) == 3 {
		return t[2]
	}
	return rest
}

// drainQueues moves the groups' messages waiting on the queues named in
// their records' Drain lists to this node's queue, in ingress order, each
// deleted from the old queue once its copy is stored. A group is moved
// only once none of its messages is delivered and unacked on an old queue
// whose consumer is alive and acknowledging (see drainplan.go): until
// then the old consumer works on the group and no message of it reaches
// this node's queue.
//
// scanned, if not nil, is called once the old queues are read, with the
// groups they hold nothing of (those are done) and those they hold some
// of.
func (h *handOver) drainQueues(ctx context.Context, routes map[string]kvbinding.Binding, scanned func(none, some []string)) (map[string]int, error) {
	byNode := map[string]map[string]bool{}
	for g, route := range routes {
		for _, n := range route.Drain {
			// This node's own queue too, when the record lists it (a group
			// coming back to a node whose queue still holds some of it):
			// what waits there is copied behind what the other queues
			// hold of earlier messages, all in ingress order; the copies
			// this step made already are left in place.
			if byNode[n] == nil {
				byNode[n] = map[string]bool{}
			}
			byNode[n][g] = true
		}
	}
	if len(byNode) == 0 {
		return map[string]int{}, nil
	}
	stream, err := h.io.queue(ctx)
	if err != nil {
		return nil, err
	}
	return h.moveFound(ctx, stream, byNode, routes, func(ctx context.Context) (map[string][]queued, error) {
		return h.scanQueues(ctx, stream, byNode, routes, 0)
	}, scanned, true)
}

// moveFound moves, group by group, the messages find returns (a group's
// messages on the old queues of byNode) to this node's queue, in ingress
// order, each deleted from its old queue once its copy is stored, as soon
// as no message of the group is delivered and unacked on an old queue
// whose consumer is alive and acknowledging. The old queues' consumers
// are paused before find looks and stay paused until it returns.
//
// What a group's move put on this node's queue is remembered for the
// catch-up (movedThrough): the whole move's, and, when scan is true (a
// drain, whose retry scans the old queues again and finds no original it
// deleted), a failed move's too. A late copy's move (takeLateCopy) is
// remembered only whole: its retry meets the original again by its id,
// and a catch-up started past it would leave on the old queue an
// original whose deletion failed, for the old consumer to take once its
// pause ends.
func (h *handOver) moveFound(ctx context.Context, stream msgStore, byNode map[string]map[string]bool,
	routes map[string]kvbinding.Binding, find func(context.Context) (map[string][]queued, error), scanned func(none, some []string),
	scan bool) (map[string]int, error) {
	// The handler paused the old queues before it wrote the records and
	// renews the pauses while records say they are drained; this node
	// renews them too while it drains, so that they hold also while no
	// handler is active. The first renewal is made before the drain
	// looks at the queues.
	//
	// The handler's pause is usually in effect already (it paused before
	// it wrote the record): a reading of the consumer that finds it paused
	// for long enough (its leader applied it) stands for this node's first
	// renewal and for the drain's first readings (quiet at once), instead
	// of a pause call and a second reading after it.
	began := h.clock.Now()
	holdCtx, release := context.WithCancel(ctx)
	var holding sync.WaitGroup
	defer func() { release(); holding.Wait() }()
	views := map[string]consumerView{}
	for _, node := range sortedKeys(byNode) {
		first := drainPause / 3
		if v, ok := h.pausedView(ctx, node); ok {
			views[node] = v
			// Renewed while a third of drainPause at least is left of the
			// pause found, as of this node's own.
			first = min(first, v.pauseLeft-drainPause/3-since(h.clock, v.progress))
		} else {
			h.pauseQueue(ctx, node)
		}
		holding.Add(1)
		go func() {
			defer holding.Done()
			h.holdPaused(holdCtx, node, first)
		}()
	}
	read := h.clock.Now()
	byGroup, err := find(ctx)
	if err != nil {
		return nil, err
	}
	h.log.Debug("hand-over drain: old queues read", "nodes", len(byNode), "found", countFound(byGroup),
		"paused_in", read.Sub(began).Round(time.Microsecond), "read_in", since(h.clock, read).Round(time.Microsecond))
	progressOf(ctx).found(countFound(byGroup))
	if scanned != nil {
		var none, some []string
		for g := range routes {
			if len(byGroup[g]) == 0 {
				none = append(none, g)
			} else {
				some = append(some, g)
			}
		}
		sort.Strings(none)
		sort.Strings(some)
		scanned(none, some)
	}
	plans := make(map[string][]drainMsg, len(byGroup))
	for g, found := range byGroup {
		// In ingress order; copies of one message (moveGroup) in the order
		// they were stored.
		sort.Slice(found, func(i, j int) bool {
			a, b := found[i], found[j]
			return a.ingressSeq < b.ingressSeq || a.ingressSeq == b.ingressSeq && a.msg.Sequence < b.msg.Sequence
		})
		msgs := make([]drainMsg, len(found))
		for i, q := range found {
			msgs[i] = drainMsg{node: q.from, seq: q.msg.Sequence, ingressSeq: q.ingressSeq, ref: i, held: q.held}
		}
		plans[g] = msgs
	}
	// Groups in parallel, each as soon as its old consumers are done with
	// it; within a group, copies one after another in ingress order, each
	// original deleted once its copy is stored.
	moved := map[string]int{}
	var mu sync.Mutex
	work, wctx := errgroup.WithContext(ctx)
	work.SetLimit(128)
	start := func(g string, plan drainPlan) {
		found := byGroup[g]
		todo := make([]queued, len(plan.move))
		for i, m := range plan.move {
			todo[i] = found[m.ref]
			todo[i].lapsed = m.lapsed
		}
		route := routes[g]
		if plan.lapsed > 0 {
			h.warn.lapsed.Warn(g, "messages", plan.lapsed, "revision", route.Revision)
		}
		work.Go(func() error {
			n, through, err := h.moveGroup(wctx, stream, todo, route)
			mu.Lock()
			moved[g] = n
			mu.Unlock()
			switch {
			case err == nil && len(found) > 0:
				through = found[len(found)-1].ingressSeq
			case err != nil && !scan:
				through = 0
			}
			// Also when the move failed part of the way: what it copied is
			// on this node's queue, and the step's retry does not find its
			// originals any more (deleted), so only this says that the
			// catch-up must not route them again (the hand-over world, seed
			// 372: a delete whose reply was lost failed the step, the
			// retry's drain found nothing, and the catch-up stored 5..7
			// again behind their copies once a server restart had lost the
			// queue stream's duplicate window).
			if through > 0 {
				h.duties.mu.Lock()
				h.duties.movedThrough[g] = max(h.duties.movedThrough[g], through)
				h.duties.mu.Unlock()
			}
			return err
		})
	}
	if err := h.awaitConsumers(wctx, stream, byNode, views, routes, plans, start); err != nil {
		_ = work.Wait()
		return nil, err
	}
	if err := work.Wait(); err != nil {
		return nil, err
	}
	return moved, nil
}

// pausedView reads node's queue consumer and returns the drain's first
// view of it (its progress is the reading's time) when the reading found
// it paused with at least half of drainPause left (ok false: not paused, or for too short a while, or no
// consumer, or the reading failed: the caller pauses it).
func (h *handOver) pausedView(ctx context.Context, node string) (consumerView, bool) {
	read, err := h.readConsumer(ctx, node)
	if err != nil || !read.exists || !read.paused || read.pauseLeft < drainPause/2 {
		return consumerView{}, false
	}
	return consumerView{}.observe(read, h.clock.Now()), true
}

// getAgain is stream.get under readAgain.
func (h *handOver) getAgain(ctx context.Context, stream msgStore, seq uint64) (*jetstream.RawStreamMsg, error) {
	var m *jetstream.RawStreamMsg
	err := h.readAgain(ctx, func() (err error) {
		m, err = stream.get(ctx, seq)
		return err
	})
	return m, err
}

// readAttempts is how many times a step reads one thing of the streams
// (a message, a subject's state, a consumer) before the step fails.
const readAttempts = 4

// readAgain runs read, a read of the streams that changes nothing, up to
// readAttempts times while it fails (but with a message gone, which is an
// answer), pausing 0.1 s, 0.2 s, 0.3 s between: one failed read of many (a
// timeout, a leader changing) does not fail the whole step, whose retry
// reads everything again from the start (a large queue's scan, thousands
// of reads, would then seldom finish while reads fail now and then). A
// write is never retried so: a delete whose reply was lost, sent again,
// finds the message gone, which tells a mover the old consumer took it.
func (h *handOver) readAgain(ctx context.Context, read func() error) error {
	for attempt := 1; ; attempt++ {
		err := read()
		if err == nil || isGone(err) || attempt == readAttempts || ctx.Err() != nil {
			return err
		}
		if err := h.clock.Sleep(ctx, backoffBase*time.Duration(attempt)); err != nil {
			return err
		}
	}
}

// scanWalkers bounds the walks of one old queue that run at once; each
// walks a range of the queue stream's sequences (scanPerWalker messages of
// the node's at least, as the stream info counted them).
const (
	scanWalkers   = 16
	scanPerWalker = 4
)

// scanQueues reads the old queues and returns, per group, its messages
// found there (a copy this step made before on this node's own queue is
// left out: it is in place already).
//
// Each old node costs first one stream info, filtered on its queue's and
// held subjects (answered by the stream's leader, as the message reads
// are): a node whose queue holds nothing, and whose held subjects hold
// nothing of the groups, is not walked at all. Otherwise its queue is
// walked message by message (a read returns the node's next message from
// a sequence on), in up to scanWalkers ranges of sequences at once, and
// the held subjects of the groups that have some.
// limit, if not 0, is the most messages a queue may store for it to be
// read: past it, the scan fails with errScanLimit.
func (h *handOver) scanQueues(ctx context.Context, stream msgStore, byNode map[string]map[string]bool, routes map[string]kvbinding.Binding, limit int) (map[string][]queued, error) {
	byGroup := map[string][]queued{}
	for _, node := range sortedKeys(byNode) {
		groups := byNode[node]
		prefix := QueueSubjectPrefix + node + "."
		var (
			qinfo, hinfo jetstream.StreamState
		)
		reads, rctx := errgroup.WithContext(ctx)
		reads.Go(func() error {
			return h.readAgain(rctx, func() (err error) {
				qinfo, err = stream.state(rctx, prefix+">")
				return err
			})
		})
		reads.Go(func() error {
			return h.readAgain(rctx, func() (err error) {
				hinfo, err = stream.state(rctx, HeldSubjectPrefix+node+".>")
				return err
			})
		})
		if err := reads.Wait(); err != nil {
			return nil, err
		}
		waiting := 0
		for _, n := range qinfo.Subjects {
			waiting += int(n)
		}
		if limit > 0 && waiting > limit {
			return nil, errScanLimit
		}
		var msgs []*jetstream.RawStreamMsg
		if waiting > 0 {
			var err error
			msgs, err = h.walkSubject(ctx, stream, prefix+">", qinfo.FirstSeq, qinfo.LastSeq, waiting)
			if err != nil {
				return nil, err
			}
		}
		for _, m := range msgs {
			g, invalid := GroupOf(m.Header, h.groupHeader)
			if invalid != "" || !groups[g] {
				continue
			}
			is, err := strconv.ParseUint(m.Header.Get(HeaderIngressSeq), 10, 64)
			if err != nil {
				continue
			}
			if h.ownStep(node, m, routes[g]) {
				// A copy an earlier attempt of this step made: in place
				// already, behind the earlier ones.
				continue
			}
			byGroup[g] = append(byGroup[g], queued{msg: m, from: node, ingressSeq: is, group: g})
		}
		// What the old node held back of these groups (fairshare.go):
		// later than what its queue holds of them, never delivered.
		heldSubjects := make([]string, 0, len(hinfo.Subjects))
		for subj, n := range hinfo.Subjects {
			if n > 0 {
				heldSubjects = append(heldSubjects, subj)
			}
		}
		for _, g := range sortedKeys(groups) {
			key, err := kvbinding.Key(g)
			if err != nil {
				continue
			}
			keyPrefix := HeldSubjectPrefix + node + "." + key + "."
			if !slices.ContainsFunc(heldSubjects, func(subj string) bool { return strings.HasPrefix(subj, keyPrefix) }) {
				continue
			}
			held, err := h.walkSubject(ctx, stream, HeldFilter(node, key), hinfo.FirstSeq, hinfo.LastSeq, 1)
			if err != nil {
				return nil, err
			}
			for _, m := range held {
				is, err := strconv.ParseUint(m.Header.Get(HeaderIngressSeq), 10, 64)
				if err != nil {
					continue
				}
				if h.ownStep(node, m, routes[g]) || m.Header.Get(headerStaged) != "" {
					// Staged by this step, or by an earlier taker (stage.go):
					// the catch-up's, in its turn. A staging can have gaps (a
					// taker that stopped part of the way): moved now, its
					// copies would go ahead of messages the catch-up routes
					// after them, and seem to say that everything before them
					// was routed (movedThrough).
					continue
				}
				byGroup[g] = append(byGroup[g], queued{msg: m, from: node, ingressSeq: is, group: g, held: true})
			}
		}
	}
	return byGroup, nil
}

// ownStep reports whether m, found on node's queue or held subject, was
// stored by this node's drain step of its group under route (a copy, or
// a staged catch-up): this node takes the group over in route's epoch and
// m carries that epoch. What a node routed under its binding is not its
// step's (markClean looks at this node's own queue too).
func (h *handOver) ownStep(node string, m *jetstream.RawStreamMsg, route kvbinding.Binding) bool {
	return node == h.node && route.Node == h.node && route.Phase() == kvbinding.PhaseDraining &&
		m.Header.Get(HeaderEpoch) == strconv.FormatUint(route.Epoch, 10)
}

// walkSubject returns the messages of stream on filter with sequences in
// [first, last], in order, reading one message per request (the next on
// filter from a sequence). n is about how many there are: the range is
// split into up to scanWalkers parts, of scanPerWalker of them at least,
// walked at once.
func (h *handOver) walkSubject(ctx context.Context, stream msgStore, filter string, first, last uint64, n int) ([]*jetstream.RawStreamMsg, error) {
	if first == 0 || last < first {
		return nil, nil
	}
	parts := uint64(max(1, min(scanWalkers, n/scanPerWalker)))
	if span := last - first + 1; parts > span {
		parts = span
	}
	width := (last - first + 1) / parts
	found := make([][]*jetstream.RawStreamMsg, parts)
	walks, wctx := errgroup.WithContext(ctx)
	for i := range parts {
		lo, hi := first+i*width, first+(i+1)*width-1
		if i == parts-1 {
			hi = last
		}
		walks.Go(func() error {
			for seq := lo; seq <= hi; {
				var m *jetstream.RawStreamMsg
				err := h.readAgain(wctx, func() (err error) {
					m, err = stream.next(wctx, seq, filter)
					return err
				})
				if isGone(err) {
					return nil
				}
				if err != nil {
					return err
				}
				if m.Sequence > hi {
					return nil
				}
				found[i] = append(found[i], m)
				seq = m.Sequence + 1
			}
			return nil
		})
	}
	if err := walks.Wait(); err != nil {
		return nil, err
	}
	var out []*jetstream.RawStreamMsg
	for _, f := range found {
		out = append(out, f...)
	}
	return out, nil
}

// drainPoll is how often, at most, a drain that waits for an old
// consumer looks at it again: first after drainFirstPoll, then after twice
// as long each round up to drainPoll (a consumer that acks promptly is
// seen done within milliseconds; one that takes long is not read more
// often than before); drainLookups bounds the messages it looks up each
// time.
const (
	drainPoll      = 100 * time.Millisecond
	drainFirstPoll = 10 * time.Millisecond
	drainLookups   = 256
)

// awaitConsumers waits, group by group, until no message of the group is
// delivered and unacked on an old queue whose consumer is alive and
// acknowledging (planDrain), and calls start for each group then, with
// what to move. It reads each old queue's consumer each round (rounds
// drainFirstPoll apart, then twice as far each time up to drainPoll), and
// looks whether an awaited message is still there only after its consumer
// made progress. views holds the readings taken before the queues were
// read (moveFound): the first round uses them instead of reading again.
func (h *handOver) awaitConsumers(ctx context.Context, stream msgStore, byNode map[string]map[string]bool,
	views map[string]consumerView, routes map[string]kvbinding.Binding, plans map[string][]drainMsg, start func(string, drainPlan)) error {
	if views == nil {
		views = map[string]consumerView{}
	}
	checked := map[string]time.Time{} // per group: when its awaited messages were last looked at
	logged := map[string]bool{}
	poll := drainFirstPoll
	nodes := sortedKeys(byNode)
	for round, first := 0, true; len(plans) > 0; round, first = round+1, false {
		if !first {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-after(h.clock, poll):
			}
			poll = min(2*poll, drainPoll)
		}
		for _, node := range nodes {
			if _, ok := views[node]; ok && first {
				continue // read just before the queues were
			}
			var read consumerView
			if err := h.readAgain(ctx, func() (err error) {
				read, err = h.readConsumer(ctx, node)
				return err
			}); err != nil {
				return err
			}
			views[node] = views[node].observe(read, h.clock.Now())
		}
		now := h.clock.Now()
		// Looking at messages costs a request each: at most
		// drainLookups a round, spread over the groups: each round starts
		// one group further on.
		budget := drainLookups
		groups := sortedKeys(plans)
		for i := range groups {
			g := groups[(i+round)%len(groups)]
			msgs := plans[g]
			route := routes[g]
			if !h.current(g, route.Revision) {
				return errSuperseded
			}
			// Look whether the awaited messages are still there, in order,
			// up to the first one that is: acks come mostly in delivery
			// order, and this is asked again after the next progress.
			for i := range msgs {
				m := &msgs[i]
				v := views[m.node]
				if fateOf(*m, v, now) != fateAwait {
					continue
				}
				if !v.progress.After(checked[g]) || budget == 0 {
					break
				}
				budget--
				_, err := h.getAgain(ctx, stream, m.seq)
				if err != nil && !isGone(err) {
					return err
				}
				if m.gone = isGone(err); !m.gone {
					break
				}
				progressOf(ctx).add(1) // done by the old consumer
			}
			if budget > 0 {
				checked[g] = now
			}
			plan := planDrain(msgs, views, now)
			if !plan.ready {
				if !logged[g] {
					logged[g] = true
					h.log.Debug("hand-over waits for the old consumer to ack what it was delivered", "group", logagg.Short(g),
						"messages", plan.awaited, "node", route.Node, "drain", route.Drain, "revision", route.Revision)
				}
				continue
			}
			// Every group's plan is logged with the readings it was taken
			// from: a message moved that its old consumer then processed
			// is told apart from one the readings missed.
			if h.log.Enabled(ctx, slog.LevelDebug) {
				attrs := []any{"group", logagg.Short(g), "revision", route.Revision, "waited", logged[g], "lapsed", plan.lapsed, "to_move", len(plan.move)}
				if len(plan.move) > 0 {
					attrs = append(attrs, "first_seq", plan.move[0].seq, "last_seq", plan.move[len(plan.move)-1].seq)
				}
				for _, node := range nodes {
					attrs = append(attrs, views[node].logAttr(node, now))
				}
				h.log.Debug("hand-over: the old consumer is done with the group", attrs...)
			}
			// What the old consumer acked without this drain looking is
			// done too (the progress counts every message found).
			acked := 0
			for _, m := range msgs {
				if !m.gone && fateOf(m, views[m.node], now) == fateDone {
					acked++
				}
			}
			progressOf(ctx).add(acked)
			delete(plans, g)
			start(g, plan)
		}
	}
	return nil
}

// readConsumer reads what a drain needs of node's queue consumer.
func (h *handOver) readConsumer(ctx context.Context, node string) (consumerView, error) {
	info, err := h.io.consumer(ctx, node)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return consumerView{}, nil
	}
	if err != nil {
		return consumerView{}, err
	}
	wait := info.Config.AckWait
	if wait <= 0 {
		wait = DefaultQueueAckWait
	}
	v := consumerView{exists: true, delivered: info.Delivered.Stream, ackFloor: info.AckFloor.Stream,
		pending: info.NumAckPending, ackWait: wait, paused: info.Paused, pauseLeft: info.PauseRemaining}
	if c := info.Cluster; c != nil && c.LeaderSince != nil && !info.TimeStamp.IsZero() &&
		c.LeaderSince.Sub(info.Created) > firstLeaderWithin {
		// Both times are the servers': the leader's age, not a comparison
		// of this process's clock with theirs. The consumer's first leader
		// (elected as it was created) had no predecessor.
		if age := info.TimeStamp.Sub(*c.LeaderSince); age < wait {
			v.unsure = h.clock.Now().Add(wait - age)
		}
	}
	return v, nil
}

// firstLeaderWithin: a consumer leader elected this soon after the
// consumer was created is its first.
const firstLeaderWithin = 5 * time.Second

// moveGroup copies one group's found messages to this node's queue in
// order and deletes the originals.
//
// Every copy carries the id movedID(the original's queue sequence), the
// same whoever makes it: a mover that stopped between its copy and the
// original's deletion (crashed, paused, cut off) leaves both behind, and
// a successor's copy of that original is then a duplicate of the first
// (the queue stream answers with the first copy's sequence):
//   - that copy is one of found, later (it was stored after its
//     original): the original is deleted, the copy moved in its turn;
//   - it is this node's own (an earlier attempt of this step): the
//     original is deleted;
//   - it is on another node's queue and gone (its consumer processed it):
//     the original is deleted, nothing moved;
//   - it is on another node's queue and stored, landed after the scan:
//     it is moved here (takeLateCopy), then the original deleted.
//
// A message found stored twice (two entries of one ingress message) is
// stored here once: the second entry is deleted, not copied again.
//
// A mover deletes an original or withdraws a copy only while it holds
// the group (its record current, its liveness sure: not fenced): a stale
// mover that resumes leaves what it copied to the successor, which finds
// both and moves the message once.
func (h *handOver) moveGroup(ctx context.Context, stream msgStore, found []queued, route kvbinding.Binding) (moved int, through uint64, err error) {
	epochHdr := []string{strconv.FormatUint(route.Epoch, 10)}
	later := make(map[uint64]bool, len(found))
	for _, q := range found {
		later[q.msg.Sequence] = true
	}
	copies := map[uint64]uint64{} // ingress sequence -> the copy this call stored
	for _, q := range found {
		if !h.current(q.group, route.Revision) {
			return moved, through, errSuperseded
		}
		copySeq, twice := copies[q.ingressSeq]
		if !twice {
			out := &nats.Msg{
				Subject: QueueSubject(h.node, q.ingressSubject()),
				Header:  make(nats.Header, len(q.msg.Header)+2), Data: q.msg.Data,
			}
			for k, v := range q.msg.Header {
				out.Header[k] = v
			}
			// Stored by an atomic batch, it carries that batch's headers:
			// alone it is no batch's part. A staged copy's mark stays on
			// the held subject.
			dropBatchHeaders(out.Header)
			delete(out.Header, headerStaged)
			out.Header.Set(jetstream.MsgIDHeader, movedID(q.msg.Sequence))
			out.Header.Set(HeaderMovedFrom, q.from)
			if q.lapsed {
				out.Header.Set(HeaderDeliveredBefore, q.from)
			}
			out.Header.Set(jetstream.ExpectedStreamHeader, QueueStream)
			out.Header[HeaderEpoch] = epochHdr
			ack, err := h.publishSync(ctx, out, func() bool { return h.current(q.group, route.Revision) })
			if err != nil {
				return moved, through, err
			}
			copySeq = ack.Sequence
			if ack.Duplicate && later[copySeq] {
				// Another mover's copy, found too: moved in its turn.
				if err := h.deleteOriginal(ctx, stream, q, route); err != nil && !isGone(err) {
					return moved, through, err
				}
				continue
			}
			if ack.Duplicate {
				mine, err := h.otherCopy(ctx, stream, q, route, out, copySeq)
				if err != nil {
					return moved, through, err
				}
				if !mine {
					if err := h.deleteOriginal(ctx, stream, q, route); err != nil && !isGone(err) {
						return moved, through, err
					}
					continue
				}
			}
			copies[q.ingressSeq] = copySeq
			through = q.ingressSeq // its copy is on this node's queue
		}
		if err := h.deleteOriginal(ctx, stream, q, route); err != nil {
			if !isGone(err) {
				return moved, through, err
			}
			// The old consumer acked the original after all (a lapsed
			// message: it came back after its ack wait): the copy would
			// deliver the message twice. Take the copy back.
			if err := h.mayDelete(q.group, route); err != nil {
				return moved, through, err
			}
			if err := stream.delete(ctx, copySeq); err != nil && !isGone(err) {
				return moved, through, err
			}
			h.log.Info("a moved message was acked on its old queue meanwhile; its copy was withdrawn",
				"group", q.group, "ingress_seq", q.ingressSeq, "from", q.from, "queue_seq", q.msg.Sequence, "held", q.held, "copy_seq", copySeq)
			continue
		}
		if !twice {
			moved++
			progressOf(ctx).add(1)
		}
	}
	return moved, through, nil
}

// otherCopy handles a copy of q's original that a move found stored
// already at seq, not among the messages it moves: mine reports whether
// it is this node's own (an earlier attempt's, in place). A copy on
// another node's queue or held subject that is still stored was made by
// a mover that stopped before deleting the original, and landed after
// this drain looked there: it is moved here (takeLateCopy) before the
// original is deleted. One that is gone was processed by its consumer.
func (h *handOver) otherCopy(ctx context.Context, stream msgStore, q queued, route kvbinding.Binding, sent *nats.Msg, seq uint64) (mine bool, err error) {
	m, err := h.getAgain(ctx, stream, seq)
	if isGone(err) {
		h.log.Info("a message to move was copied by an earlier mover, whose copy was processed; the original is deleted",
			"group", logagg.Short(q.group), "ingress_seq", q.ingressSeq, "from", q.from, "copy_seq", seq)
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if node, _, ok := queueOwner(m.Subject); ok && node == h.node {
		return true, nil
	}
	// Not by a stale mover (its publish answered after a pause, say): the
	// copy may be its successor's.
	if err := h.mayDelete(q.group, route); err != nil {
		return false, err
	}
	return false, h.takeLateCopy(ctx, stream, q.group, route, sent, seq)
}

// deleteOriginal deletes the original of a moved message, if this node
// still holds its group (mayDelete).
func (h *handOver) deleteOriginal(ctx context.Context, stream msgStore, q queued, route kvbinding.Binding) error {
	if err := h.mayDelete(q.group, route); err != nil {
		return err
	}
	return stream.delete(ctx, q.msg.Sequence)
}

// mayDelete reports why this node may not delete a message of group it
// moves under route now: errFencedNow when its liveness may have lapsed
// (a successor may be draining the same queues), errSuperseded when the
// record moved on.
func (h *handOver) mayDelete(group string, route kvbinding.Binding) error {
	if h.fencedNow() {
		return errFencedNow
	}
	if !h.current(group, route.Revision) {
		return errSuperseded
	}
	return nil
}

// errSuperseded stops a takeover step whose record moved past the revision
// it works for: the record names who takes the next step (a successor
// drains this node's queue too).
var errSuperseded = errors.New("grouping: the record moved past the step's revision")

// current reports whether group's record, as this node sees it, is still
// at revision rev.
func (h *handOver) current(group string, rev uint64) bool {
	route, ok := h.lookup(group)
	return ok && route.Revision == rev
}

// movedID is the message id of a copy of the queue stream's message at
// seq (its original), made by a drain, a catch-up of a staged copy or a
// lane's move of a late copy: whoever makes it (moveGroup).
func movedID(seq uint64) string {
	return "moved:" + strconv.FormatUint(seq, 10)
}

// drainPause is how long one pause a draining node takes lasts; it renews
// it every third of that while it drains. The pause lapses by itself after
// the drain (the handler resumes the queue when no record needs it paused).
const drainPause = 10 * time.Second

// holdPaused keeps node's queue consumer paused until ctx ends, renewing
// the pause after first, then every third of drainPause.
func (h *handOver) holdPaused(ctx context.Context, node string, first time.Duration) {
	t := h.clock.NewTimer(max(first, 0))
	defer t.Stop()
	for fired(ctx, t) {
		h.pauseQueue(ctx, node)
		t.Reset(drainPause / 3)
	}
}

// pauseQueue pauses node's queue consumer for drainPause.
func (h *handOver) pauseQueue(ctx context.Context, node string) {
	if err := h.io.pause(ctx, node, h.clock.Now().Add(drainPause)); err != nil &&
		ctx.Err() == nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		h.log.Debug("cannot renew the pause of a queue being drained", "node", node, "err", err)
	}
}

// isGone reports whether a message get or delete failed only because the
// message is gone already (acked by its consumer meanwhile).
func isGone(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true
	}
	var apiErr *jetstream.APIError
	// 10037: message not found; 10057: message deletion unsuccessful
	// (no message found); 10043: sequence not found (a replicated
	// stream's answer to deleting a message gone already, seen in the
	// nemesis: "description=sequence 5190 not found").
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeMessageNotFound || apiErr.ErrorCode == 10057 || apiErr.ErrorCode == 10043) {
		return true
	}
	// Stream.DeleteMsg flattens the server's error into text ("message
	// deletion unsuccessful: nats: API error: code=500 err_code=10057
	// description=no message found"): the API error is not wrapped.
	if !errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		return false
	}
	text := err.Error()
	return strings.Contains(text, "no message found") || strings.Contains(text, "err_code=10043")
}

// catchUp routes, from the ingress, the groups' messages from their fence
// up to where this node's lanes take over: messages this node skipped
// while another node owned the group. A message the group's drain found
// on another queue, or any before it, was routed already and is skipped.
func (h *handOver) catchUp(ctx context.Context, routes map[string]kvbinding.Binding) (map[string]int, error) {
	// A group staged by a drain step this process does not remember (it
	// restarted since) is staged again first: its staged copies are found
	// by their ids (stage.go).
	restage := map[string]kvbinding.Binding{}
	for g, route := range routes {
		if h.needsStaging(g, route) {
			restage[g] = route
		}
	}
	if len(restage) > 0 {
		if err := h.stage(ctx, restage); err != nil {
			return nil, err
		}
	}
	type span struct{ from, until uint64 }
	spans := map[string]span{}
	staged := map[string]*stagedSpan{}
	var lo, hi uint64
	lost := h.lostThrough(ctx, routes)
	for g := range routes {
		spans[g] = span{until: h.takeoverFrom(g)}
	}
	h.duties.mu.Lock()
	for g, s := range spans {
		s.from, s.until = catchUpSpan(routes[g], s.until, h.duties.movedThrough[g], max(h.duties.caught[g], lost[g]))
		spans[g] = s
		if st := h.duties.staged[g]; st != nil && st.epoch == routes[g].Epoch {
			staged[g] = st
		}
	}
	h.duties.mu.Unlock()
	// A step is a message to publish from the ingress, (msg nil) a staged
	// copy to move, or (late not 0) the old node's copy its staging found
	// (stagedSpan.routed), moved here should it still be stored.
	type step struct {
		msg    *nats.Msg
		seq    uint64
		staged stagedCopy
		late   uint64
	}
	byGroup := map[string][]step{}
	for g, s := range spans {
		if s.from >= s.until {
			continue
		}
		if st := staged[g]; st != nil && st.whole && st.from <= s.from {
			// Its staging knows the whole span (what the lane did not hold
			// when it was staged; the lane holds what came since): no
			// second ingress read.
			seqs := stagedSeqs(st, s.from, s.until)
			for is, at := range st.routed {
				if at != 0 && is >= s.from && is < s.until {
					seqs = append(seqs, is)
				}
			}
			slices.Sort(seqs)
			for _, seq := range slices.Compact(seqs) {
				if c, ok := st.copies[seq]; ok {
					byGroup[g] = append(byGroup[g], step{seq: seq, staged: c})
				} else if at := st.routed[seq]; at != 0 {
					byGroup[g] = append(byGroup[g], step{seq: seq, late: at})
				} else {
					byGroup[g] = append(byGroup[g], step{seq: seq, msg: st.rest[seq]})
				}
			}
			continue
		}
		if lo == 0 || s.from < lo {
			lo = s.from
		}
		hi = max(hi, s.until)
	}
	if len(byGroup) > 0 || lo != 0 {
		h.log.Debug("hand-over catch-up: spans known from their staging, spans read from the ingress", "staged", len(byGroup), "read", lo != 0,
			"from_seq", lo, "until_seq", hi)
	}
	stream, err := h.io.queue(ctx)
	if err != nil {
		return nil, err
	}
	for _, g := range sortedKeys(staged) {
		if err := h.dropStaged(ctx, stream, g, staged[g], spans[g].from); err != nil {
			return nil, err
		}
	}
	caught := map[string]int{}
	if lo == 0 && len(byGroup) == 0 {
		return caught, nil
	}
	var pins map[string]kvbinding.Checkpoint
	if lo != 0 {
		pins = h.pinnedCheckpoints(ctx, routes)
	}
	err = h.readIngressSpan(ctx, lo, hi, func(seq uint64, msg jetstream.Msg) {
		g, invalid := h.classify(msg.Headers(), msg.Subject())
		s, ok := spans[g]
		if !ok || seq < s.from || seq >= s.until {
			return
		}
		if c, ok := pins[g]; ok && c.Done(seq) {
			return // the old node finished it (Binding.Ckpt)
		}
		if st := staged[g]; st != nil && st.whole && st.from <= s.from {
			return // taken from its staging above
		}
		if st := staged[g]; st != nil && invalid == "" && seq < st.until {
			if c, ok := st.copies[seq]; ok {
				byGroup[g] = append(byGroup[g], step{seq: seq, staged: c})
				return
			}
			if at, ok := st.routed[seq]; ok {
				// The old node routed it: the window said so.
				if at != 0 {
					byGroup[g] = append(byGroup[g], step{seq: seq, late: at})
				}
				return
			}
		}
		out := prepare(seq, msg.Headers(), msg.Data())
		if invalid != "" {
			// Taking the ungrouped routing binding over: dead-letter what
			// cannot be grouped, as the lane would have.
			out = h.toDeadLetter(out, msg.Subject(), seq, invalid, false)
			byGroup[g] = append(byGroup[g], step{msg: out, seq: seq})
			return
		}
		dest := h.node
		if g == "" {
			dest = h.ungroupedDestination()
		}
		out.Subject = QueueSubject(dest, msg.Subject())
		out.Header.Set(jetstream.ExpectedStreamHeader, QueueStream)
		out.Header[HeaderEpoch] = []string{strconv.FormatUint(routes[g].Epoch, 10)}
		byGroup[g] = append(byGroup[g], step{msg: out, seq: seq})
	})
	if err != nil {
		return nil, err
	}
	found := 0
	for _, steps := range byGroup {
		found += len(steps)
	}
	progressOf(ctx).found(found)
	var lates []uint64
	for _, g := range sortedKeys(byGroup) {
		for _, st := range byGroup[g] {
			if st.late != 0 {
				lates = append(lates, st.late)
			}
		}
	}
	stored, err := h.stillStored(ctx, stream, lates)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	work, wctx := errgroup.WithContext(ctx)
	work.SetLimit(128)
	for _, g := range sortedKeys(byGroup) {
		steps := byGroup[g]
		work.Go(func() (err error) {
			n := 0
			// through: the last of the group's messages stored, in order.
			// Kept as the group's part ends (as caught, which the step's
			// retry starts after), whether it failed or not: the step
			// fails when any group's part does, and what this group
			// stored is on the queue, where, once consumed, only the
			// duplicate window would drop it again, which a server restart
			// loses (the hand-over world, seed 234: a group's part done,
			// another's failed, and the retry stored the first's message 1
			// again behind its 11).
			var through uint64
			defer func() {
				if through > 0 {
					h.duties.mu.Lock()
					h.duties.caught[g] = max(h.duties.caught[g], through)
					h.duties.mu.Unlock()
				}
			}()
			// A staged copy is deleted once its queue copy is stored, beside
			// the next publishes (unstage).
			unstaging, uctx := errgroup.WithContext(wctx)
			unstaging.SetLimit(32)
			defer func() { _ = unstaging.Wait() }()
			for _, st := range steps {
				if !h.current(g, routes[g].Revision) {
					return errSuperseded
				}
				if st.late != 0 {
					// The old node's copy, seen by the staging while the
					// drain ran: normally moved by the drain; one that
					// landed after the drain looked is moved here now, in
					// its turn, while the old queue is still paused (the
					// handler keeps it paused until the catch-up ends).
					if stored[st.late] {
						sent := &nats.Msg{Header: nats.Header{HeaderIngressSeq: []string{strconv.FormatUint(st.seq, 10)}}}
						if err := h.takeLateCopy(wctx, stream, g, routes[g], sent, st.late); err != nil {
							return err
						}
					}
					through = st.seq
					continue
				}
				if st.msg == nil && st.staged.msg == nil {
					moved, err := h.moveStaged(wctx, stream, g, routes[g], st.staged.at, st.seq)
					if err != nil {
						return err
					}
					h.duties.mu.Lock()
					delete(staged[g].copies, st.seq)
					h.duties.mu.Unlock()
					through = st.seq
					if moved {
						n++
					}
					continue
				}
				if st.msg == nil {
					if _, err := h.publishSync(wctx, h.queueCopy(st.staged.msg, st.staged.at), func() bool { return h.current(g, routes[g].Revision) }); err != nil {
						return err
					}
					through = st.seq
					unstaging.Go(func() error { return h.unstage(uctx, stream, staged[g], st.staged.at, st.seq) })
					n++
					progressOf(ctx).add(1)
					continue
				}
				m := st.msg
				ack, err := h.publishSync(wctx, m, func() bool { return h.current(g, routes[g].Revision) })
				if err != nil {
					return err
				}
				if ack.Duplicate && g != "" && ack.Stream == QueueStream {
					if err := h.takeLateCopy(wctx, stream, g, routes[g], m, ack.Sequence); err != nil {
						return err
					}
				}
				through = st.seq
				n++
				progressOf(ctx).add(1)
			}
			if err := unstaging.Wait(); err != nil {
				return err
			}
			mu.Lock()
			caught[g] = n
			mu.Unlock()
			return nil
		})
	}
	if err := work.Wait(); err != nil {
		return nil, err
	}
	h.duties.mu.Lock()
	for g, s := range spans {
		if s.until > 0 {
			h.duties.caught[g] = max(h.duties.caught[g], s.until-1)
		}
		// Forgotten once the catch-up is done, not before: a retry of a
		// catch-up that failed starts after it too (the hand-over world,
		// seed 1388: the retry started again at the record's FromSeq and
		// stored a second time, behind their copies, messages the drain
		// had moved, once a server restart had lost the queue stream's
		// duplicate window).
		delete(h.duties.movedThrough, g)
	}
	h.duties.mu.Unlock()
	return caught, nil
}

// stillStored returns which of the queue-stream sequences seqs are still
// stored, reading several at once.
func (h *handOver) stillStored(ctx context.Context, stream msgStore, seqs []uint64) (map[uint64]bool, error) {
	var mu sync.Mutex
	stored := map[uint64]bool{}
	work, wctx := errgroup.WithContext(ctx)
	work.SetLimit(32)
	for _, seq := range seqs {
		work.Go(func() error {
			_, err := h.getAgain(wctx, stream, seq)
			if isGone(err) {
				return nil
			}
			if err != nil {
				return err
			}
			mu.Lock()
			stored[seq] = true
			mu.Unlock()
			return nil
		})
	}
	return stored, work.Wait()
}

// pinnedCheckpoints returns, for the groups of routes whose record pins the
// checkpoint of the node they are taken from (Binding.Ckpt: an evacuation
// took the record's start from it), that checkpoint. A catch-up does not
// route again what it says the old node finished: the checkpoint's start
// is its oldest unfinished message, which one slow group holds back for
// every group of the node, and the queue stream's duplicate window, which
// drops the rest, may have lost the ids of messages consumed meanwhile (a
// server restart). A revision the bucket no longer holds (the old node came
// back and saved another, which may count as finished messages it skipped
// as no longer its own) pins nothing.
func (h *handOver) pinnedCheckpoints(ctx context.Context, routes map[string]kvbinding.Binding) map[string]kvbinding.Checkpoint {
	if h.loadCheckpointAt == nil {
		return nil
	}
	type at struct {
		node string
		rev  uint64
	}
	read := map[at]*kvbinding.Checkpoint{}
	pins := map[string]kvbinding.Checkpoint{}
	for _, g := range sortedKeys(routes) {
		route := routes[g]
		if route.Ckpt == 0 || route.PrevNode == "" {
			continue
		}
		k := at{route.PrevNode, route.Ckpt}
		c, done := read[k]
		if !done {
			got, ok, err := h.loadCheckpointAt(ctx, k.node, k.rev)
			switch {
			case err != nil:
				// Unreadable (an older node's permissions, a transient
				// failure): the take-over routes again from the start,
				// as before checkpoints were pinned; the window drops
				// what it still knows.
				h.log.Info("hand-over: the old node's checkpoint cannot be read; the take-over routes from its start",
					"node", k.node, "revision", k.rev, "err", err)
			case ok:
				c = &got
			}
			read[k] = c
			h.log.Debug("hand-over: the old node's checkpoint the take-over starts from", "node", k.node, "revision", k.rev,
				"found", c != nil)
		}
		if c != nil {
			pins[g] = *c
		}
	}
	return pins
}

// takeLateCopy is called when the queue stream took a catch-up publish of
// group's message sent for a duplicate of a copy stored at seq. A copy on
// this node's queue is an earlier attempt's; one on its held subject is a
// staged copy this process forgot, moved onto the queue. One on another node's queue
// (or held subject) was published by the group's previous owner and
// landed late: held by a partitioned link and delivered once it healed,
// after the drain looked there (docs/protocol.md, "Remaining windows").
// Its consumer would process it behind what this node routes next, so it
// is moved here now, as the drain moves (waiting while that consumer holds
// it unacked), before the group's next message is routed.
func (h *handOver) takeLateCopy(ctx context.Context, stream msgStore, group string, route kvbinding.Binding, sent *nats.Msg, seq uint64) error {
	m, err := h.getAgain(ctx, stream, seq)
	if isGone(err) {
		return nil // acked (or moved) already
	}
	if err != nil {
		return err
	}
	from, held, ok := queueOwner(m.Subject)
	if !ok || m.Header.Get(HeaderIngressSeq) != sent.Header.Get(HeaderIngressSeq) {
		return nil
	}
	is, err := strconv.ParseUint(m.Header.Get(HeaderIngressSeq), 10, 64)
	if err != nil {
		return nil
	}
	if from == h.node && !held {
		return nil // an earlier attempt's copy, in place
	}
	if held && (from == h.node || m.Header.Get(headerStaged) != "") {
		// A staged copy: this node's, staged by a drain step this process
		// no longer remembers (it restarted, and the drain's retry found
		// nothing left to move, so nothing was staged again), or an
		// earlier taker's that did not finish (a drain leaves those to the
		// catch-up). No consumer reads a held subject: it is moved onto
		// the queue now, in its turn.
		h.log.Debug("hand-over: a staged copy found by its id, moved onto the queue in its turn", "group", logagg.Short(group),
			"ingress_seq", is, "queue_seq", seq, "staged_by", from)
		_, _, err := h.moveGroup(ctx, stream, []queued{{msg: m, from: from, ingressSeq: is, group: group, held: true}}, route)
		return err
	}
	h.warn.late.Warn(group, "ingress_seq", is, "queue_seq", seq, "from", from, "held", held, "revision", route.Revision)
	q := queued{msg: m, from: from, ingressSeq: is, group: group, held: held}
	_, err = h.moveFound(ctx, stream, map[string]map[string]bool{from: {group: true}}, map[string]kvbinding.Binding{group: route},
		func(context.Context) (map[string][]queued, error) { return map[string][]queued{group: {q}}, nil }, nil, false)
	return err
}

// queueOwner returns the node whose queue (or held subject, held true)
// the queue stream's subject belongs to.
func queueOwner(subject string) (node string, held, ok bool) {
	rest, ok := strings.CutPrefix(subject, QueueSubjectPrefix)
	if !ok {
		if rest, ok = strings.CutPrefix(subject, HeldSubjectPrefix); !ok {
			return "", false, false
		}
		held = true
	}
	node, _, ok = strings.Cut(rest, ".")
	return node, held, ok && node != ""
}

// readIngress calls fn for every ingress message with a sequence in
// [lo, hi), in order. It asks for exactly what is left (a fetch for more
// than the stream holds waits for its whole expiry), and recreates its
// consumer from where it got to when the cluster loses it.
func (h *handOver) readIngress(ctx context.Context, lo, hi uint64, fn func(seq uint64, msg jetstream.Msg)) error {
	next := lo
	var cons jetstream.Consumer
	for attempt := 1; next < hi; {
		if cons == nil {
			var err error
			// One attempt at each Fetch's re-creation of the server's
			// consumer: nats.go's default retries for ever, without a
			// context, and so never returns once the connection is closed.
			// This loop retries, and ends with ctx.
			cons, err = h.io.ingress(ctx, next)
			if err != nil {
				if ctx.Err() != nil || attempt >= 20 {
					return err
				}
				attempt++
				h.log.Debug("catch-up: ingress consumer not created; retrying", "err", err, "from", next)
				if err := h.clock.Sleep(ctx, backoffBase*time.Duration(attempt)); err != nil {
					return err
				}
				continue
			}
		}
		batch, err := cons.Fetch(int(min(hi-next, 512)), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			// Recreated from next after a pause (the Fetch made one attempt
			// at its server consumer): a cluster electing a leader answers
			// at once, and is not asked again at once.
			cons = nil
			attempt++
			h.log.Debug("catch-up: ingress not read; reading again", "err", err, "from", next, "attempt", attempt)
			if err := h.clock.Sleep(ctx, backoffBase*time.Duration(min(attempt, 20))); err != nil {
				return err
			}
			continue
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			d, ok := jsack.Parse(msg.Reply())
			seq := d.StreamSeq
			if !ok {
				meta, err := msg.Metadata()
				if err != nil {
					continue
				}
				seq = meta.Sequence.Stream
			}
			if seq >= hi {
				return nil
			}
			next = seq + 1
			fn(seq, msg)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			cons = nil
			attempt++
			if attempt > 20 {
				return err
			}
			continue
		}
		if n == 0 {
			// Nothing came within the wait: the stream holds nothing more
			// of the span (its messages deleted), or its leader was slow or
			// changing. Ending the read then would report the span routed
			// without the messages it holds (nemesis, two busy loops
			// beside: 207 messages of a group never routed).
			ended, err := h.ingressEndsBefore(ctx, next, hi)
			if err == nil && ended {
				return nil
			}
			cons = nil
			attempt++
			if attempt > 20 {
				return fmt.Errorf("catch-up: the ingress delivered nothing from %d, and holds messages before %d (%v)", next, hi, err)
			}
			h.log.Debug("catch-up: the ingress delivered nothing yet; reading again", "from", next, "until", hi, "err", err, "attempt", attempt)
			if err := h.clock.Sleep(ctx, backoffBase*time.Duration(min(attempt, 20))); err != nil {
				return err
			}
		}
	}
	return nil
}

// ingressEndsBefore reports whether the ingress stream holds no message
// from next up to hi (deleted, or never written), by reading the first
// message it holds from next on. The read goes to the stream's leader; a
// deposed one that never stored the span would say it ended, which ends
// the read as it did before this check.
func (h *handOver) ingressEndsBefore(ctx context.Context, next, hi uint64) (bool, error) {
	st, err := h.io.side(ctx, IngressStream)
	if err != nil {
		return false, err
	}
	var m *jetstream.RawStreamMsg
	err = h.readAgain(ctx, func() (err error) {
		m, err = st.next(ctx, next, ">")
		return err
	})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return m.Sequence >= hi, nil
}

// publishSync publishes one message and waits for its ack, retrying until
// ctx ends (same Nats-Msg-Id, so a retry never duplicates). Each attempt
// waits while this node is fenced (its liveness record may have lapsed),
// then checks still: a step whose record moved on meanwhile stops with
// errSuperseded instead of publishing.
func (h *handOver) publishSync(ctx context.Context, m *nats.Msg, still func() bool) (*jetstream.PubAck, error) {
	for {
		if err := h.waitUnfenced(ctx); err != nil {
			return nil, err
		}
		if !still() {
			return nil, errSuperseded
		}
		pctx, cancel := h.clock.WithTimeout(ctx, 5*time.Second)
		ack, err := h.io.publish(pctx, m)
		cancel()
		if err == nil {
			if ack.Stream == QueueStream {
				h.stored(ack.Sequence, m.Header.Get(jetstream.MsgIDHeader))
			}
			return ack, nil // a duplicate's ack names the first copy
		}
		if ctx.Err() != nil {
			return nil, err
		}
		if h.warn.publish != nil {
			h.warn.publish.Warn(m.Header.Get(jetstream.MsgIDHeader), "subject", m.Subject, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-after(h.clock, backoffBase):
		}
	}
}

// waitUnfenced returns once this node may publish (its liveness record is
// sure to exist, and it caught up after a lapse), or ctx's error.
func (h *handOver) waitUnfenced(ctx context.Context) error {
	for {
		if !h.fencedNow() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-after(h.clock, 20*time.Millisecond):
		}
	}
}
