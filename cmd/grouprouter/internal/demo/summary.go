package demo

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/grouprouter/grouprouter/proposals"
)

// Summary is what a demo run found.
type Summary struct {
	// Duration is how long the producers published; Took how long until
	// the last message was processed.
	Duration, Took time.Duration
	Groups         int
	// Published counts the messages whose PubAck arrived; PublishErrors
	// the attempts that failed and were made again (same message id, so
	// stored once). Unconfirmed counts the publishes never confirmed when
	// the producers stopped (they may be stored: not expected, not
	// counted missing), UnconfirmedArrived those of them processed.
	Published, PublishErrors        int
	Unconfirmed, UnconfirmedArrived int
	// Processed counts the deliveries the consumers processed, duplicates
	// included.
	Processed int
	// Duplicates: messages processed again; Missing: confirmed messages
	// never processed; OutOfOrder: messages processed after a later one of
	// their group; Unexpected: deliveries of messages never published.
	Duplicates, Missing, OutOfOrder, Unexpected int
	// Examples are the first problems, "g017: #12 again (on n0's queue)".
	Examples []string
	// Moves are the move events by reason; Handoffs the hand-overs
	// completed; Timeouts the proposals that got no decision in time.
	Moves              map[string]int
	Handoffs, Timeouts int
	// Killed: n2 was killed, with KilledGroups groups; FlowAgain says, for
	// each of those that got a message after the kill, how long after the
	// kill its first such message was processed (sorted); NotFlowing
	// counts those still waiting at the end.
	Killed       bool
	KilledGroups int
	FlowAgain    []time.Duration
	NotFlowing   int
	// MovedBack counts the groups rebalancing moved to n2 once it
	// returned.
	MovedBack int
	// Joined: n3 joined the running cluster (JoinedAfter in); JoinedGot
	// counts the groups rebalancing moved to it.
	Joined      bool
	JoinedAfter time.Duration
	JoinedGot   int
	// GroupsPerNode at the end; MaxHeld the most messages a node held
	// undecided; MaxUnsettled the most groups in a hand-over at once.
	GroupsPerNode         map[string]int
	MaxHeld, MaxUnsettled int
}

// OK reports whether every confirmed message was processed exactly once
// and in order within its group.
func (s Summary) OK() bool {
	return s.Duplicates == 0 && s.Missing == 0 && s.OutOfOrder == 0 && s.Unexpected == 0
}

// summary sums the run up.
func (d *run) summary() Summary {
	c := d.l.verdict()
	kinds, _, _ := d.w.events()
	s := Summary{
		Duration: d.cfg.Duration, Took: d.l.lastProcessed().Sub(d.start), Groups: len(d.groups),
		Published: c.Published, PublishErrors: d.prod.publishErrors(), Unconfirmed: c.Unconfirmed, UnconfirmedArrived: c.UnconfArrived,
		Processed: c.Processed, Duplicates: c.Duplicates, Missing: c.Missing, OutOfOrder: c.OutOfOrder, Unexpected: c.Unexpected,
		Examples: c.Examples, Moves: d.w.moveReasons(), Handoffs: kinds[proposals.EventHandoff], Timeouts: kinds[proposals.EventTimeout],
		Killed: !d.killAt.IsZero(), KilledGroups: d.killed,
		Joined: !d.joinedAt.IsZero(), JoinedGot: d.w.rebalanced("n3"),
		GroupsPerNode: d.w.cache.Counts(), MaxHeld: d.maxHeld, MaxUnsettled: d.maxUnsettled,
	}
	s.FlowAgain, s.NotFlowing = d.l.flowAgain()
	if s.Joined {
		s.JoinedAfter = d.joinedAt.Sub(d.start)
	}
	if !d.backAt.IsZero() {
		s.MovedBack = d.w.rebalanced("n2") - d.backBefore
	}
	return s
}

// Write prints the summary.
func (s Summary) Write(w io.Writer) error {
	var b strings.Builder
	row := func(name, format string, args ...any) {
		fmt.Fprintf(&b, "  %-12s %s\n", name, fmt.Sprintf(format, args...))
	}
	b.WriteString("\nSummary\n")
	row("ran", "%v of publishing; %v until the last message was processed", s.Duration.Round(100*time.Millisecond), s.Took.Round(100*time.Millisecond))
	pub := fmt.Sprintf("%d messages over %d groups, each confirmed by JetStream", s.Published, s.Groups)
	if s.PublishErrors > 0 {
		pub += fmt.Sprintf(" (%d attempts failed and were made again, with the same message id)", s.PublishErrors)
	}
	row("published", "%s", pub)
	if s.Unconfirmed > 0 {
		row("", "%d publishes were not confirmed when the producers stopped (%d of them arrived)", s.Unconfirmed, s.UnconfirmedArrived)
	}
	if s.OK() {
		row("processed", "%d by the consumers: every message exactly once, in order within its group", s.Processed)
	} else {
		row("processed", "%d by the consumers: %d duplicates, %d missing, %d out of order, %d never published",
			s.Processed, s.Duplicates, s.Missing, s.OutOfOrder, s.Unexpected)
		for _, e := range s.Examples {
			row("", "%s", e)
		}
	}
	total := 0
	var why []string
	for _, r := range sortedKeys(s.Moves) {
		total += s.Moves[r]
		why = append(why, fmt.Sprintf("%d %s", s.Moves[r], r))
	}
	if total == 0 {
		row("moves", "none")
	} else {
		row("moves", "%d (%s); %d hand-overs done", total, strings.Join(why, ", "), s.Handoffs)
	}
	if s.Killed {
		flow := "none of them got a message after the kill"
		if n := len(s.FlowAgain); n > 0 {
			flow = fmt.Sprintf("they flowed again %.1fs after the kill (median; the last %.1fs; node grace %v from its last heartbeat)",
				s.FlowAgain[n/2].Seconds(), s.FlowAgain[n-1].Seconds(), nodeGrace)
		}
		if s.NotFlowing > 0 {
			flow += fmt.Sprintf("; %d did not", s.NotFlowing)
		}
		row("n2 killed", "halfway, with %d groups: %s", s.KilledGroups, flow)
		if s.MovedBack > 0 {
			row("n2 back", "%d groups moved back to it by rebalancing", s.MovedBack)
		}
	}
	if s.Joined {
		row("n3 joined", "%.1fs in: rebalancing moved %d groups to it, idle ones first", s.JoinedAfter.Seconds(), s.JoinedGot)
	}
	var per []string
	for _, n := range sortedKeys(s.GroupsPerNode) {
		per = append(per, fmt.Sprintf("%s %d", n, s.GroupsPerNode[n]))
	}
	row("at the end", "groups per node: %s", strings.Join(per, ", "))
	row("at most", "%d message%s held by a node (undecided, or behind its group's previous publish); %d group%s in a hand-over at once",
		s.MaxHeld, plural(s.MaxHeld), s.MaxUnsettled, plural(s.MaxUnsettled))
	if s.Timeouts > 0 {
		row("timeouts", "%d proposals got no decision in time (retried; nothing was routed ungrouped)", s.Timeouts)
	}
	if s.OK() {
		row("result", "OK: every message arrived exactly once and in order per group")
	} else {
		row("result", "FAILED: see 'processed' above")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
