package router

import (
	"fmt"
	"slices"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// The staged catch-up (stage.go) as the simulated node makes its calls:
// the staging's ingress read and publishes onto its held subject, and the
// catch-up's moves of the staged copies.

// simStaging is stagedSpan: what a drain step's staging learned of a group
// (nil copies: the step staged nothing, notStaged).
type simStaging struct {
	epoch       uint64
	from, until uint64
	copies      map[uint64]*simEntry // ingress sequence -> its staged entry
	routed      map[uint64]bool
}

// notStaged is dutyQueue.notStaged.
func (n *simNode) notStaged(group string, epoch uint64) {
	if s := n.staged[group]; s == nil || s.epoch != epoch {
		n.staged[group] = &simStaging{epoch: epoch}
	}
}

// stagedOf is dutyQueue.stagedOf.
func (n *simNode) stagedOf(group string, epoch uint64) *simStaging {
	if s := n.staged[group]; s != nil && s.epoch == epoch {
		return s
	}
	return nil
}

// stage is handOver.stage: one ingress read, then every publish at once;
// a group whose publishes did not all return is staged again whole by the
// retry.
func (n *simNode) stage(routes map[string]kvbinding.Binding, done func(error)) {
	w := n.w
	type span struct{ from, until uint64 }
	spans := map[string]span{}
	var lo, hi uint64
	for _, g := range sortedKeys(routes) {
		if g == "" {
			continue
		}
		from, until := catchUpSpan(routes[g], n.eng.takeoverFrom(g), 0, 0)
		if s := n.stagedOf(g, routes[g].Epoch); s != nil && s.copies != nil {
			from = max(from, s.until)
		}
		if from >= until {
			continue
		}
		spans[g] = span{from, until}
		if lo == 0 || from < lo {
			lo = from
		}
		hi = max(hi, until)
	}
	if lo == 0 {
		done(nil)
		return
	}
	w.hop(n.id, w.lat(), func() {
		if !n.up() {
			return
		}
		if w.chance(w.p.pOpFail) {
			done(fmt.Errorf("read ingress: %w", errSimOp))
			return
		}
		byGroup := map[string][]simPub{}
		pins := w.reg.pinnedCheckpoints(routes)
		for seq := lo; seq < hi && seq <= uint64(len(w.ingress)); seq++ {
			m := w.ingress[seq-1]
			s, ok := spans[m.group]
			if !ok || m.invalid != "" || seq < s.from || seq >= s.until {
				continue
			}
			if c, ok := pins[m.group]; ok && c.Done(seq) {
				continue // the old node finished it
			}
			byGroup[m.group] = append(byGroup[m.group], simPub{node: simHeld(n.id), seq: seq, group: m.group, id: simIngressID(seq), kind: simStaged, epoch: routes[m.group].Epoch})
		}
		learned := map[string]*simStaging{}
		returned := map[string]int{}
		left := 0
		var failed error
		canceled := func() bool { return failed != nil }
		for _, g := range sortedKeys(spans) {
			learned[g] = &simStaging{epoch: routes[g].Epoch, from: spans[g].from, until: spans[g].until,
				copies: map[uint64]*simEntry{}, routed: map[uint64]bool{}}
			left += len(byGroup[g])
		}
		finish := func() {
			for _, g := range sortedKeys(learned) {
				s := learned[g]
				if returned[g] < len(byGroup[g]) {
					continue
				}
				if old := n.stagedOf(g, s.epoch); old != nil && old.copies != nil {
					for is, e := range s.copies {
						old.copies[is] = e
					}
					for is := range s.routed {
						old.routed[is] = true
					}
					old.until = max(old.until, s.until)
					s = old
				}
				n.staged[g] = s
			}
			n.logf("staged the catch-ups of %d groups", len(learned))
			done(failed)
		}
		if left == 0 {
			finish()
			return
		}
		for _, g := range sortedKeys(byGroup) {
			for _, p := range byGroup[g] {
				rev := routes[g].Revision
				n.publishSync(p, func() bool {
					r, _ := n.cache.Lookup(g)
					return canceled() || r.Revision != rev
				}, func(sseq uint64, err error) {
					left--
					if err == nil {
						if r, _ := n.cache.Lookup(g); r.Revision != rev {
							err = errSimSuperseded
						}
					}
					if err != nil {
						if failed == nil {
							failed = err
						}
					} else {
						// ownHeld: a duplicate's ack names the first copy.
						e := w.q.all[sseq-1]
						if !e.removed && e.node == simHeld(n.id) && e.seq == p.seq {
							learned[g].copies[p.seq] = e
							w.chk.stats.staged++
						} else {
							learned[g].routed[p.seq] = true
						}
						returned[g]++
					}
					if left == 0 {
						finish()
					}
				})
			}
		}
	})
}

// stagedMoves returns, in ingress order, the staged entries of s in
// [from, until) for the catch-up to move, and deletes (after a hop) those
// below from, as dropStaged.
func (n *simNode) stagedMoves(s *simStaging, from, until uint64) []*simEntry {
	var out []*simEntry
	seqs := make([]uint64, 0, len(s.copies))
	for is := range s.copies {
		seqs = append(seqs, is)
	}
	slices.Sort(seqs)
	for _, is := range seqs {
		e := s.copies[is]
		switch {
		case is < from:
			n.w.hop(n.id, n.w.lat(), func() { n.w.q.deleteMsg(e.sseq) })
		case is < until:
			out = append(out, e)
		}
	}
	return out
}
