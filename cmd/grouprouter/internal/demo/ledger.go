package demo

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// ledger records what the producers published (numbered messages per
// group, confirmed by their PubAck) and what the consumers processed, in
// the order they processed it, and checks that every message published
// was processed exactly once and in order within its group. It is safe
// for concurrent use.
type ledger struct {
	mu     sync.Mutex
	groups []*groupLedger
	index  map[string]int

	nPublished, nProcessed int
	byNode                 map[string]int // processed per node's queue
	unknown                int            // deliveries of no demo group
	last                   time.Time      // when the last delivery was processed

	// The kill of a node: when, and from which number on each of its
	// groups' messages were published after it.
	killAt    time.Time
	killGroup map[int]int
}

// groupLedger is one group's record.
type groupLedger struct {
	name string
	// acked: messages 0..acked-1 were confirmed stored; unconfirmed is a
	// number whose publish was never confirmed (-1: none).
	acked       int
	unconfirmed int
	seen        []bool
	max         int // highest number processed (-1: none)
	dups        int
	outOfOrder  int
	examples    []string // the first problems seen
	// flowAgain: how long after the kill the group's first message
	// published after it was processed (0: not yet).
	flowAgain time.Duration
}

const maxExamples = 3

func newLedger(names []string) *ledger {
	l := &ledger{index: map[string]int{}, byNode: map[string]int{}}
	for i, g := range names {
		l.groups = append(l.groups, &groupLedger{name: g, unconfirmed: -1, max: -1})
		l.index[g] = i
	}
	return l
}

// published records that message n of group i was confirmed stored.
func (l *ledger) published(i, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.groups[i]
	if n == g.acked {
		g.acked++
		l.nPublished++
	}
}

// unconfirmed records that message n of group i may or may not be stored:
// its publish was never confirmed.
func (l *ledger) unconfirmedPublish(i, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.groups[i].unconfirmed = n
}

// processed records that a consumer of node's queue processed message n of
// group name.
func (l *ledger) processedMsg(name string, n int, node string) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	i, ok := l.index[name]
	if !ok || n < 0 {
		l.unknown++
		return
	}
	g := l.groups[i]
	l.nProcessed++
	l.last = now
	l.byNode[node]++
	for n >= len(g.seen) {
		g.seen = append(g.seen, make([]bool, len(g.seen)+16)...)
	}
	switch {
	case g.seen[n]:
		g.dups++
		g.example(fmt.Sprintf("#%d again (on %s's queue)", n, node))
	case n < g.max:
		g.outOfOrder++
		g.seen[n] = true
		g.example(fmt.Sprintf("#%d after #%d (on %s's queue)", n, g.max, node))
	default:
		g.seen[n] = true
		g.max = n
	}
	if from, ok := l.killGroup[i]; ok && n >= from && g.flowAgain == 0 {
		g.flowAgain = max(now.Sub(l.killAt), time.Nanosecond)
	}
}

func (g *groupLedger) example(s string) {
	if len(g.examples) < maxExamples {
		g.examples = append(g.examples, s)
	}
}

// markKill records a node's kill and the groups it had.
func (l *ledger) markKill(at time.Time, groups []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.killAt = at
	l.killGroup = map[int]int{}
	for _, name := range groups {
		if i, ok := l.index[name]; ok {
			g := l.groups[i]
			from := g.acked
			if g.unconfirmed >= from {
				from = g.unconfirmed + 1
			}
			l.killGroup[i] = from
		}
	}
}

// counts returns the totals so far: confirmed publishes, deliveries
// processed, and those per node.
func (l *ledger) counts() (published, processed int, byNode map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	byNode = make(map[string]int, len(l.byNode))
	for k, v := range l.byNode {
		byNode[k] = v
	}
	return l.nPublished, l.nProcessed, byNode
}

// lastProcessed returns when the last delivery was processed.
func (l *ledger) lastProcessed() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}

// outstanding counts the confirmed messages not processed yet.
func (l *ledger) outstanding() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, g := range l.groups {
		n += g.missing()
	}
	return n
}

// flowAgain returns, for the killed node's groups, how long each took to
// flow again (those that did), and how many have a message published
// since the kill that was not processed yet.
func (l *ledger) flowAgain() (took []time.Duration, waiting int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, from := range l.killGroup {
		g := l.groups[i]
		switch {
		case g.flowAgain > 0:
			took = append(took, g.flowAgain)
		case g.acked > from:
			waiting++
		}
	}
	sort.Slice(took, func(a, b int) bool { return took[a] < took[b] })
	return took, waiting
}

// missing counts the confirmed messages never processed.
func (g *groupLedger) missing() int {
	n := 0
	for i := 0; i < g.acked; i++ {
		if i >= len(g.seen) || !g.seen[i] {
			n++
		}
	}
	return n
}

// check is the ledger's verdict.
type check struct {
	Published, Processed       int
	Unconfirmed, UnconfArrived int
	Duplicates, Missing        int
	OutOfOrder, Unexpected     int
	Examples                   []string // "g017: #12 again (on n0's queue)", at most a few per group and 10 in all
}

// verdict checks every group.
func (l *ledger) verdict() check {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := check{Published: l.nPublished, Processed: l.nProcessed, Unexpected: l.unknown}
	add := func(g *groupLedger, s string) {
		if len(c.Examples) < 10 {
			c.Examples = append(c.Examples, g.name+": "+s)
		}
	}
	for _, g := range l.groups {
		c.Duplicates += g.dups
		c.OutOfOrder += g.outOfOrder
		for _, e := range g.examples {
			add(g, e)
		}
		if m := g.missing(); m > 0 {
			c.Missing += m
			first := 0
			for first < g.acked && first < len(g.seen) && g.seen[first] {
				first++
			}
			add(g, fmt.Sprintf("%d of %d never processed, the first #%d", m, g.acked, first))
		}
		if g.unconfirmed >= 0 {
			c.Unconfirmed++
			if g.unconfirmed < len(g.seen) && g.seen[g.unconfirmed] {
				c.UnconfArrived++
			}
		}
		// Processed but never published: past the confirmed ones and not
		// the unconfirmed one.
		for n := g.acked; n < len(g.seen); n++ {
			if g.seen[n] && n != g.unconfirmed {
				c.Unexpected++
				add(g, fmt.Sprintf("#%d processed but never published", n))
			}
		}
	}
	return c
}
