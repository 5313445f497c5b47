package router

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// The hand-over shell of handover.go over the simulated queues, step by
// step as it makes its calls: handOver.run, runSteps, drainQueues (the
// scan by GetMsg, awaitConsumers, moveGroup), catchUp and report. What to
// wait for and what to move is decided by the real planner (drainplan.go:
// consumerView.observe, fateOf, planDrain).

// addDuty is dutyQueue.add plus handOver.run's wake and 20 ms wait.
func (n *simNode) addDuty(group string, duty proposals.Duty, rev uint64) {
	w := n.w
	if j, ok := n.duties[group]; !ok || j.rev < rev {
		n.duties[group] = dutyJob{duty: duty, rev: rev}
	}
	if n.dutyWake {
		return
	}
	n.dutyWake = true
	w.after(simHandoverWait+w.between(0, time.Millisecond), func() {
		n.dutyWake = false
		if n.up() {
			n.handOverBatch()
		}
	})
}

// handOverBatch is one round of handOver.run.
func (n *simNode) handOverBatch() {
	jobs := n.duties
	n.duties = map[string]dutyJob{}
	drains, catchUps := splitDuties(jobs, n.cache.Lookup, n.id, n.eng.dutyDone)
	if len(drains) > 0 {
		n.runSteps(drains)
	}
	if len(catchUps) > 0 {
		n.runSteps(catchUps)
	}
}

// runSteps runs one batch of drain or catch-up steps and reports them.
func (n *simNode) runSteps(jobs map[string]dutyJob) {
	w := n.w
	routes := map[string]kvbinding.Binding{}
	var duty proposals.Duty
	for _, g := range sortedKeys(jobs) {
		route, ok := n.cache.Lookup(g)
		if !ok || route.Revision != jobs[g].rev || proposals.DutyOf(route, n.id) != jobs[g].duty {
			n.eng.dutyDone(g, jobs[g].rev) // handOver.runSteps: the record moved on
			delete(jobs, g)
			continue
		}
		routes[g] = route
		duty = jobs[g].duty
		n.logf("hand-over step starts: %q %s", g, simRoute(route))
	}
	op := proposals.OpCaughtUp
	if duty == proposals.DutyDrain {
		op = proposals.OpDrained
	}
	finish := func(counts map[string]int, err error) {
		if !n.up() {
			return
		}
		if err != nil {
			n.logf("hand-over step %s failed; retrying: %v", op, err)
			w.after(time.Second, func() {
				if !n.up() {
					return
				}
				for _, g := range sortedKeys(jobs) {
					n.addDuty(g, jobs[g].duty, jobs[g].rev)
				}
			})
			return
		}
		ps := make([]proposals.Proposal, 0, len(jobs))
		for _, g := range sortedKeys(jobs) {
			ps = append(ps, proposals.Proposal{Op: op, Group: g, Rev: jobs[g].rev, Count: counts[g]})
		}
		if len(ps) == 0 {
			return // every group was reported as soon as the old queues were read
		}
		n.report(ps, func(refused map[string]bool) {
			for _, g := range sortedKeys(refused) {
				n.eng.dutyDone(g, jobs[g].rev)
			}
		})
	}
	if duty == proposals.DutyDrain {
		// handOver.runSteps: the groups the old queues hold nothing of are
		// reported at once; the catch-ups of the evacuated ones they hold
		// some of are staged once the scan is over, and the step ends when
		// both the drain and the staging did.
		var (
			drained, staged, scanned bool
			counts                   map[string]int
			drainErr, stageErr       error
		)
		end := func() {
			if drained && (staged || !scanned) {
				if drainErr == nil {
					drainErr = stageErr
				}
				finish(counts, drainErr)
			}
		}
		onScan := func(none, some []string) {
			scanned = true
			evacuated, not := toStage(routes, none, some)
			for _, g := range not {
				n.notStaged(g, routes[g].Epoch)
			}
			n.stage(evacuated, func(err error) {
				staged, stageErr = true, err
				end()
			})
			if len(none) == 0 {
				return
			}
			ps := make([]proposals.Proposal, 0, len(none))
			for _, g := range none {
				ps = append(ps, proposals.Proposal{Op: op, Group: g, Rev: jobs[g].rev})
			}
			revs := map[string]uint64{}
			for _, g := range none {
				revs[g] = jobs[g].rev
				delete(jobs, g)
			}
			n.report(ps, func(refused map[string]bool) {
				for _, g := range sortedKeys(refused) {
					n.eng.dutyDone(g, revs[g])
				}
			})
		}
		n.drainQueues(routes, onScan, func(c map[string]int, err error) {
			drained, counts, drainErr = true, c, err
			end()
		})
	} else {
		n.catchUp(routes, finish)
	}
}

// report sends step reports, retried until they are answered (a report
// the handler could not decide is sent again, see sortReports), and gives
// the groups whose report was not taken.
func (n *simNode) report(ps []proposals.Proposal, done func(refused map[string]bool)) {
	attempt := 0
	refused := map[string]bool{}
	var try func()
	try = func() {
		if !n.up() {
			return
		}
		attempt++
		if n.w.tracing {
			n.logf("reports %s", simProposals(ps))
		}
		n.propose(ps, func(ds []proposals.Decision, err error) {
			if n.w.tracing {
				n.logf("answers to the report %s: %s", simProposals(ps), simDecisions(ds, err))
			}
			if !n.up() {
				return
			}
			if err == nil {
				again, notTaken := sortReports(ps, ds, func(g string) uint64 {
					route, _ := n.cache.Lookup(g)
					return route.Revision
				})
				for _, g := range notTaken {
					refused[g] = true
				}
				if len(again) == 0 {
					done(refused)
					return
				}
				ps = again
			}
			n.w.after(backoffBase*time.Duration(min(attempt, 20)), try)
		})
	}
	try()
}

// simFound is a message the drain found on another node's queue.
type simFound struct {
	e    *simEntry
	from string
	// lapsed: delivered to the old consumer and moved because it made no
	// progress for its ack wait (fateLapsed).
	lapsed bool
	// held: found on the node's held subject (a staged catch-up).
	held bool
}

// simDrain is one drainQueues call.
type simDrain struct {
	n       *simNode
	routes  map[string]kvbinding.Binding
	byNode  map[string]map[string]bool
	byGroup map[string][]simFound
	moved   map[string]int
	err     error
	done    func(map[string]int, error)
	scanned func(none, some []string) // moveFound's: the groups the old queues hold nothing of, and some of
}

func (n *simNode) drainQueues(routes map[string]kvbinding.Binding, scanned func(none, some []string), done func(map[string]int, error)) {
	finished := false
	d := &simDrain{n: n, routes: routes, byNode: map[string]map[string]bool{}, byGroup: map[string][]simFound{},
		moved: map[string]int{}, scanned: scanned}
	d.done = func(moved map[string]int, err error) {
		finished = true
		done(moved, err)
	}
	for _, g := range sortedKeys(routes) {
		for _, node := range routes[g].Drain {
			if d.byNode[node] == nil {
				d.byNode[node] = map[string]bool{}
			}
			d.byNode[node][g] = true
		}
	}
	if len(d.byNode) == 0 {
		done(d.moved, nil)
		return
	}
	nodes := sortedKeys(d.byNode)
	// handOver.holdPaused: the drainer renews the old queues' pauses while
	// it drains, also when no handler is active.
	w := n.w
	var hold func()
	hold = func() {
		if finished || !n.up() {
			return
		}
		for _, node := range nodes {
			w.hop(n.id, w.lat(), func() {
				if !finished && n.up() {
					c := w.q.consumer(node)
					c.pausedUntil = max(c.pausedUntil, w.clock+simPauseWindow)
				}
			})
		}
		w.after(simPauseWindow/3, hold)
	}
	hold()
	d.scan()
}

// scan reads the old queues by GetMsg, one message per call, from the
// stream's first to its last sequence as the stream info gave them.
func (d *simDrain) scan() {
	n, w := d.n, d.n.w
	w.hop(n.id, w.lat(), func() {
		if !n.up() {
			return
		}
		if w.chance(w.p.pOpFail) {
			d.done(nil, fmt.Errorf("stream info: %w", errSimOp))
			return
		}
		first, last := w.q.firstLast()
		// drainQueues ranges over a map: the queues are scanned in any order.
		nodes := sortedKeys(d.byNode)
		w.rng.Shuffle(len(nodes), func(i, j int) { nodes[i], nodes[j] = nodes[j], nodes[i] })
		// Each node's queue, then its held subject (scanQueues).
		type queue struct {
			name, node string
			held       bool
		}
		var queues []queue
		for _, node := range nodes {
			queues = append(queues, queue{node, node, false}, queue{simHeld(node), node, true})
		}
		var scanNode func(i int)
		scanNode = func(i int) {
			if i == len(queues) {
				d.await()
				return
			}
			qname, node, held, groups := queues[i].name, queues[i].node, queues[i].held, d.byNode[queues[i].node]
			seq := first
			var get func()
			get = func() {
				if !n.up() {
					return
				}
				if seq > last {
					scanNode(i + 1)
					return
				}
				w.hop(n.id, w.lat(), func() {
					if !n.up() {
						return
					}
					if w.chance(w.p.pOpFail) {
						d.done(nil, fmt.Errorf("get: %w", errSimOp))
						return
					}
					e := w.q.next(qname, seq)
					if e == nil {
						scanNode(i + 1)
						return
					}
					seq = e.sseq + 1
					if e.group == "" || !groups[e.group] {
						get()
						return
					}
					if route := d.routes[e.group]; node == n.id && route.Node == n.id && route.Step == kvbinding.StepDrain && e.epoch == route.Epoch {
						get() // stored by this node for the group's epoch: in place already
						return
					}
					d.byGroup[e.group] = append(d.byGroup[e.group], simFound{e: e, from: node, held: held})
					get()
				})
			}
			get()
		}
		scanNode(0)
	})
}

// await is awaitConsumers: every drainPoll it reads the old queues'
// consumers (one call each) and looks at the groups' awaited messages,
// and starts moving each group once planDrain says it is ready. The moves
// run at once (an errgroup: the first error cancels the others).
func (d *simDrain) await() {
	n, w := d.n, d.n.w
	var empty []string
	for _, g := range sortedKeys(d.routes) {
		if len(d.byGroup[g]) == 0 {
			empty = append(empty, g)
		}
	}
	if d.scanned != nil {
		var some []string
		for _, g := range sortedKeys(d.routes) {
			if len(d.byGroup[g]) > 0 {
				some = append(some, g)
			}
		}
		d.scanned(empty, some)
	}
	groups := sortedKeys(d.byGroup)
	if len(groups) == 0 {
		d.done(d.moved, nil)
		return
	}
	plans := map[string][]drainMsg{}
	for _, g := range groups {
		found := d.byGroup[g]
		slices.SortFunc(found, func(a, b simFound) int {
			if a.e.seq != b.e.seq {
				return int(a.e.seq) - int(b.e.seq)
			}
			return int(a.e.sseq) - int(b.e.sseq)
		})
		msgs := make([]drainMsg, len(found))
		for i, f := range found {
			msgs[i] = drainMsg{node: f.from, seq: f.e.sseq, ingressSeq: f.e.seq, ref: i, held: f.held}
		}
		plans[g] = msgs
	}
	nodes := sortedKeys(d.byNode)
	views := map[string]consumerView{}
	running := 0
	waiting := len(groups)
	canceled := func() bool { return d.err != nil }
	finished := func() {
		if running > 0 || (waiting > 0 && d.err == nil) {
			return
		}
		if d.err != nil {
			d.done(nil, d.err)
			return
		}
		d.done(d.moved, nil)
	}
	var poll func()
	poll = func() {
		if !n.up() || d.err != nil {
			return
		}
		w.hop(n.id, w.lat(), func() {
			if !n.up() || d.err != nil {
				return
			}
			if w.chance(w.p.pOpFail) {
				d.err = fmt.Errorf("consumer info: %w", errSimOp)
				finished()
				return
			}
			now := simTime(w.clock)
			for _, node := range nodes {
				views[node] = views[node].observe(w.q.consumer(node).view(), now)
			}
			for _, g := range sortedKeys(plans) {
				msgs := plans[g]
				if r, _ := n.cache.Lookup(g); r.Revision != d.routes[g].Revision {
					d.err = errSimSuperseded
					finished()
					return
				}
				for i := range msgs {
					msgs[i].gone = d.byGroup[g][msgs[i].ref].e.removed
				}
				plan := planDrain(msgs, views, now)
				if !plan.ready {
					continue
				}
				delete(plans, g)
				waiting--
				found := d.byGroup[g]
				todo := make([]simFound, len(plan.move))
				for i, m := range plan.move {
					todo[i] = found[m.ref]
					todo[i].lapsed = fateOf(m, views[m.node], now) == fateLapsed
				}
				if plan.lapsed > 0 {
					n.logf("drain: moving %d messages of %q its old consumer was delivered: it made no progress for its ack wait", plan.lapsed, g)
				}
				running++
				n.moveGroup(g, todo, d.routes[g], canceled, func(moved int, through uint64, err error) {
					running--
					d.moved[g] = moved
					if err == nil && len(found) > 0 {
						through = found[len(found)-1].e.seq
					}
					if through > 0 { // also when the move failed part of the way (handOver.moveFound)
						n.movedThrough[g] = max(n.movedThrough[g], through)
					}
					if err != nil && d.err == nil {
						d.err = err
					}
					finished()
				})
			}
			if waiting > 0 {
				w.after(drainPoll, poll)
			} else {
				finished()
			}
		})
	}
	poll()
}

// simTime is the virtual clock as a time.Time, for the planner.
func simTime(d time.Duration) time.Time { return time.Unix(0, 0).Add(d) }

// moveGroup is handOver.moveGroup: it copies one group's found messages to
// this node's queue in order, each with the id its original's sequence
// gives it (movedID), deletes each original once its copy is stored
// while it may (not fenced, the record current), and withdraws the copy
// of one acked meanwhile. A duplicate answer names a copy made before:
// one found (moved in its turn), this node's own, or another node's,
// gone (consumed) or moved here first (takeLateCopy, without its wait
// for that queue's consumer).
func (n *simNode) moveGroup(group string, found []simFound, route kvbinding.Binding, canceled func() bool, done func(moved int, through uint64, err error)) {
	w := n.w
	later := map[uint64]bool{}
	for _, f := range found {
		later[f.e.sseq] = true
	}
	copies := map[uint64]uint64{} // ingress sequence -> this call's copy
	moved, i := 0, 0
	var through uint64 // the last ingress sequence whose copy is on this node's queue (handOver.moveGroup)
	// mayDelete: nil when this node may delete a message it moves now.
	mayDelete := func() error {
		if n.eng.fenced(w.now()) {
			return errSimFenced
		}
		if r, _ := n.cache.Lookup(group); r.Revision != route.Revision {
			return errSimSuperseded
		}
		return nil
	}
	var next func()
	// deleteOriginal deletes f's original, then calls then with whether it
	// was gone already.
	deleteOriginal := func(f simFound, then func(gone bool)) {
		if err := mayDelete(); err != nil {
			done(moved, through, err)
			return
		}
		fail := w.chance(w.p.pOpFail)
		w.hop(n.id, w.lat(), func() {
			gone := false
			if !fail {
				gone = !w.q.deleteMsg(f.e.sseq)
				delete(n.moving, f.e.seq)
			}
			w.hop(n.id, w.lat(), func() {
				if !n.up() {
					return
				}
				if fail {
					done(moved, through, fmt.Errorf("delete: %w", errSimOp))
					return
				}
				then(gone)
			})
		})
	}
	next = func() {
		if !n.up() {
			return
		}
		if canceled() {
			done(moved, through, errSimCancel)
			return
		}
		if i == len(found) {
			done(moved, through, nil)
			return
		}
		if r, _ := n.cache.Lookup(group); r.Revision != route.Revision {
			done(moved, through, errSimSuperseded)
			return
		}
		f := found[i]
		i++
		finish := func(copySeq uint64, count bool) {
			deleteOriginal(f, func(gone bool) {
				if !gone {
					if count {
						moved++
					}
					next()
					return
				}
				// Acked on the old queue meanwhile: take the copy back.
				if err := mayDelete(); err != nil {
					done(moved, through, err)
					return
				}
				n.logf("drain: seq %d of %q was acked on %s meanwhile; withdrawing its copy", f.e.seq, group, f.from)
				w.hop(n.id, w.lat(), func() {
					w.q.deleteMsg(copySeq)
					w.hop(n.id, w.lat(), next)
				})
			})
		}
		if copySeq, twice := copies[f.e.seq]; twice {
			finish(copySeq, false) // stored twice: copied once
			return
		}
		// Should this node crash before the original is deleted, the
		// message may be on two queues (the checker names the window).
		n.moving[f.e.seq] = true
		p := simPub{node: n.id, seq: f.e.seq, group: group, id: movedID(f.e.sseq), kind: simCopy, origin: f.e,
			lapsedMove: f.lapsed, epoch: route.Epoch}
		n.publishSync(p, canceled, func(copySeq uint64, err error) {
			if err != nil {
				done(moved, through, err)
				return
			}
			c := w.q.all[copySeq-1]
			switch {
			case later[copySeq]:
				// Another mover's copy, found too: moved in its turn.
				deleteOriginal(f, func(bool) { next() })
			case c.node == n.id:
				copies[f.e.seq] = copySeq
				through = f.e.seq
				finish(copySeq, true)
			case c.removed:
				n.logf("drain: seq %d of %q was copied by an earlier mover, whose copy was consumed", f.e.seq, group)
				deleteOriginal(f, func(bool) { next() })
			default:
				// takeLateCopy: the copy landed after the scan; not by a
				// stale mover.
				if err := mayDelete(); err != nil {
					done(moved, through, err)
					return
				}
				from, held := c.node, false
				if owner, ok := strings.CutPrefix(c.node, "held:"); ok {
					from, held = owner, true
				}
				n.logf("drain: seq %d of %q has a late copy %v: moved here first", f.e.seq, group, c)
				n.moveGroup(group, []simFound{{e: c, from: from, held: held}}, route, canceled, func(_ int, _ uint64, err error) {
					if err != nil {
						done(moved, through, err)
						return
					}
					deleteOriginal(f, func(bool) { next() })
				})
			}
		})
	}
	next()
}

// catchUp routes, from the ingress, the groups' messages from their fence
// up to where the lanes take over, skipping what the drain moved.
func (n *simNode) catchUp(routes map[string]kvbinding.Binding, done func(map[string]int, error)) {
	// needsStaging: a group staged by a drain step this process does not
	// remember is staged again first.
	restage := map[string]kvbinding.Binding{}
	for _, g := range sortedKeys(routes) {
		if route := routes[g]; g != "" && route.Epoch != route.Revision && n.stagedOf(g, route.Epoch) == nil {
			restage[g] = route
		}
	}
	if len(restage) > 0 {
		n.logf("catch-up: staging again %v (this process has no memory of the drain step's)", sortedKeys(restage))
		n.stage(restage, func(err error) {
			if err != nil {
				done(nil, err)
				return
			}
			n.catchUpFrom(routes, done)
		})
		return
	}
	n.catchUpFrom(routes, done)
}

// catchUpFrom is the rest of catchUp: the staged copies are moved, the
// others routed from the ingress.
func (n *simNode) catchUpFrom(routes map[string]kvbinding.Binding, finish func(map[string]int, error)) {
	w := n.w
	// movedThrough is forgotten once the catch-up is done (handOver.catchUp).
	done := func(caught map[string]int, err error) {
		if err == nil {
			for g := range routes {
				delete(n.movedThrough, g)
			}
		}
		finish(caught, err)
	}
	type span struct{ from, until uint64 }
	spans := map[string]span{}
	moves := map[string][]*simEntry{}
	for _, g := range sortedKeys(routes) {
		var s span
		// The sim's node keeps no catch-up progress of its own (caught).
		s.from, s.until = catchUpSpan(routes[g], n.eng.takeoverFrom(g), n.movedThrough[g], 0)
		if st := n.stagedOf(g, routes[g].Epoch); st != nil && st.copies != nil {
			// Its staging knows the whole span (dropStaged for what lies
			// below its start).
			moves[g] = n.stagedMoves(st, s.from, s.until)
			continue
		}
		spans[g] = s
	}
	var lo, hi uint64
	for _, g := range sortedKeys(spans) {
		s := spans[g]
		if s.from >= s.until {
			continue
		}
		if lo == 0 || s.from < lo {
			lo = s.from
		}
		hi = max(hi, s.until)
	}
	caught := map[string]int{}
	if lo == 0 && len(moves) == 0 {
		done(caught, nil)
		return
	}
	w.hop(n.id, w.lat(), func() {
		if !n.up() {
			return
		}
		if w.chance(w.p.pOpFail) {
			done(nil, fmt.Errorf("read ingress: %w", errSimOp))
			return
		}
		byGroup := map[string][]simPub{}
		pins := w.reg.pinnedCheckpoints(routes)
		for seq := lo; lo != 0 && seq < hi && seq <= uint64(len(w.ingress)); seq++ {
			m := w.ingress[seq-1]
			s, ok := spans[m.group]
			if !ok || seq < s.from || seq >= s.until {
				continue
			}
			if c, ok := pins[m.group]; ok && c.Done(seq) {
				continue // the old node finished it
			}
			if m.invalid != "" {
				// The ungrouped binding's takeover dead-letters it (classify).
				byGroup[m.group] = append(byGroup[m.group], simPub{seq: seq, id: "dlq:" + simIngressID(seq), dlq: true, reason: m.invalid})
				continue
			}
			dest := n.id
			if m.group == "" {
				dest = n.eng.ungroupedDestination()
			}
			byGroup[m.group] = append(byGroup[m.group], simPub{node: dest, seq: seq, group: m.group, id: simIngressID(seq), kind: simCaught, epoch: routes[m.group].Epoch})
		}
		for _, g := range sortedKeys(moves) {
			for _, e := range moves[g] {
				byGroup[g] = append(byGroup[g], simPub{node: n.id, seq: e.seq, group: g, id: movedID(e.sseq), kind: simCopy, origin: e, epoch: routes[g].Epoch})
			}
		}
		groups := sortedKeys(byGroup)
		if len(groups) == 0 {
			done(caught, nil)
			return
		}
		left := len(groups)
		var failed error
		canceled := func() bool { return failed != nil }
		for _, g := range groups {
			msgs := byGroup[g]
			i := 0
			var next func()
			next = func() {
				if i == len(msgs) {
					caught[g] = len(msgs)
					left--
					if left == 0 {
						if failed != nil {
							done(nil, failed)
						} else {
							done(caught, nil)
						}
					}
					return
				}
				p := msgs[i]
				i++
				if r, _ := n.cache.Lookup(g); r.Revision != routes[g].Revision {
					if failed == nil {
						failed = errSimSuperseded
					}
					i = len(msgs)
					next()
					return
				}
				if p.origin != nil {
					n.moving[p.seq] = true // moveGroup's window
				}
				n.publishSync(p, canceled, func(sseq uint64, err error) {
					if err != nil && failed == nil {
						failed = err
					}
					if err != nil {
						i = len(msgs)
					}
					if err == nil && p.origin == nil && p.kind == simCaught {
						// takeLateCopy: a duplicate of this node's staged
						// copy (staged by a drain step this incarnation does
						// not remember) is moved onto the queue now.
						if c := w.q.all[sseq-1]; c.node == simHeld(n.id) && !c.removed && c.seq == p.seq {
							n.logf("catch-up: seq %d of %q has a staged copy %v: moved onto the queue", p.seq, g, c)
							n.moveGroup(g, []simFound{{e: c, from: n.id, held: true}}, routes[g], canceled, func(_ int, _ uint64, err error) {
								if err != nil {
									if failed == nil {
										failed = err
									}
									i = len(msgs)
								}
								next()
							})
							return
						}
					}
					if err != nil || p.origin == nil {
						next()
						return
					}
					// unstage: the staged entry goes once its copy is
					// stored (one gone already stays gone; the copy stays),
					// and is forgotten; not while this node is fenced.
					if n.eng.fenced(w.now()) {
						if failed == nil {
							failed = errSimFenced
						}
						i = len(msgs)
						next()
						return
					}
					w.hop(n.id, w.lat(), func() {
						w.q.deleteMsg(p.origin.sseq)
						delete(n.moving, p.seq)
						w.hop(n.id, w.lat(), func() {
							if !n.up() {
								return
							}
							if st := n.stagedOf(g, routes[g].Epoch); st != nil {
								delete(st.copies, p.seq)
							}
							next()
						})
					})
				})
			}
			next()
		}
	})
}
