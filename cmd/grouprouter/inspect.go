package main

// What the groups and where subcommands share: reading the node queues and
// the routers' held groups, and one group's row.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/grouprouter/grouprouter/internal/jsonx"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// stateUnbound is the state shown for a group without a binding record
// whose messages are held undecided or still on a queue.
const stateUnbound = "unbound"

// queueCount is what one group (or one group on one node) has on queues.
type queueCount struct {
	waiting int       // not delivered to a consumer yet
	unacked int       // delivered, not acknowledged
	oldest  time.Time // stored time of the oldest of them; zero if none
}

func (q *queueCount) add(m queueMsg) {
	if m.delivered {
		q.unacked++
	} else {
		q.waiting++
	}
	if q.oldest.IsZero() || m.stored.Before(q.oldest) {
		q.oldest = m.stored
	}
}

func (q *queueCount) merge(o queueCount) {
	q.waiting += o.waiting
	q.unacked += o.unacked
	if !o.oldest.IsZero() && (q.oldest.IsZero() || o.oldest.Before(q.oldest)) {
		q.oldest = o.oldest
	}
}

// queueMsg is what the inspection reads of a message on a node's queue.
type queueMsg struct {
	node, group string
	stored      time.Time
	// delivered: its stream sequence is at most the node's consumer's
	// last delivered one. Acked messages are gone (GROUPING_QUEUE is a
	// work-queue stream), so a delivered message still there is unacked.
	delivered bool
}

// Reading the queues. GROUPING_QUEUE is a work-queue stream, where the
// server allows no other consumer on a node's subjects than the node's own
// (an ordered consumer is refused: error 10084, and a second explicit-ack
// one would overlap: 10100), so messages are read with the stream's get
// API, next message by subject. That is one request per message, so the
// sequence range is cut into chunks read by queueScanWorkers requests in
// flight.
const (
	queueScanWorkers  = 16
	queueScanChunks   = 1024 // at most, per filter
	queueScanMinChunk = 256  // sequences
)

// scanQueues reads the messages present on the queues of nodes (of every
// node when nodes is empty), from the stream's first sequence to its last
// when the scan starts, and calls fn for each, one call at a time, in no
// particular order. A missing queue stream has no messages.
func scanQueues(ctx context.Context, js jetstream.JetStream, groupHeader string, nodes []string, fn func(queueMsg)) error {
	stream, err := js.Stream(ctx, router.QueueStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("queue stream: %w", err)
	}
	// The consumers first: a message delivered after this counts as
	// waiting, never a waiting one as delivered.
	delivered := map[string]uint64{}
	consumers := stream.ListConsumers(ctx)
	for ci := range consumers.Info() {
		if node, ok := strings.CutPrefix(ci.Name, router.QueueConsumerPrefix); ok {
			delivered[node] = ci.Delivered.Stream
		}
	}
	if err := consumers.Err(); err != nil {
		return fmt.Errorf("queue consumers: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("queue stream: %w", err)
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	if info.State.Msgs == 0 || last < first {
		return nil
	}
	filters := []string{router.QueueSubjectPrefix + ">"}
	if len(nodes) > 0 {
		filters = filters[:0]
		for _, n := range nodes {
			filters = append(filters, router.QueueFilter(n))
		}
	}
	size := max(queueScanMinChunk, (last-first+1+queueScanChunks-1)/queueScanChunks)
	type chunk struct {
		filter   string
		from, to uint64
	}
	chunks := make(chan chunk)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(chunks)
		for _, f := range filters {
			for from := first; from <= last; from += size {
				select {
				case chunks <- chunk{f, from, min(last, from+size-1)}:
				case <-gctx.Done():
					return nil
				}
			}
		}
		return nil
	})
	var mu sync.Mutex
	for range queueScanWorkers {
		g.Go(func() error {
			for c := range chunks {
				for seq := c.from; seq <= c.to; {
					m, err := stream.GetMsg(gctx, seq, jetstream.WithGetMsgSubject(c.filter))
					if errors.Is(err, jetstream.ErrMsgNotFound) {
						break
					}
					if err != nil {
						return fmt.Errorf("read queue message %d: %w", seq, err)
					}
					if m.Sequence > c.to || m.Sequence < seq {
						break
					}
					seq = m.Sequence + 1
					rest, ok := strings.CutPrefix(m.Subject, router.QueueSubjectPrefix)
					node, _, ok2 := strings.Cut(rest, ".")
					if !ok || !ok2 {
						continue
					}
					group, _ := router.GroupOf(m.Header, groupHeader)
					mu.Lock()
					fn(queueMsg{node: node, group: group, stored: m.Time, delivered: m.Sequence <= delivered[node]})
					mu.Unlock()
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// heldOn is one router holding a group's messages undecided.
type heldOn struct {
	node string
	kvbinding.HeldGroup
}

// heldGroups reads the live nodes' announcements: the groups each holds
// undecided (each node lists at most kvbinding.MaxWaitingListed). It
// returns them by group, nodes sorted, and the live nodes.
func heldGroups(ctx context.Context, js jetstream.JetStream) (map[string][]heldOn, []kvbinding.NodeInfo, error) {
	held := map[string][]heldOn{}
	if _, err := js.KeyValue(ctx, kvbinding.DefaultNodesBucket); errors.Is(err, jetstream.ErrBucketNotFound) {
		return held, nil, nil
	}
	reg, err := kvbinding.OpenRegistry(ctx, js, kvbinding.RegistryConfig{}, nil)
	if err != nil {
		return nil, nil, err
	}
	nodes, err := reg.ListNodes(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("list nodes: %w", err)
	}
	slices.SortFunc(nodes, func(a, b kvbinding.NodeInfo) int { return strings.Compare(a.Node, b.Node) })
	for _, n := range nodes {
		for _, h := range n.Waiting {
			held[h.Group] = append(held[h.Group], heldOn{node: n.Node, HeldGroup: h})
		}
	}
	return held, nodes, nil
}

// maxHeld is how many of a group's messages are held undecided: every
// router reads the whole ingress and holds the same ones, so the most any
// one holds, not the sum.
func maxHeld(on []heldOn) int {
	n := 0
	for _, h := range on {
		n = max(n, h.Count)
	}
	return n
}

// heldBackCounts reads how many messages wait on the nodes' held subjects
// (groups held back for their share of a queue's window), matching filter
// (router.HeldFilter), by group key (kvbinding.Key) and node: one request
// of the queue stream's per-subject counts.
func heldBackCounts(ctx context.Context, js jetstream.JetStream, filter string) (map[string]map[string]int, error) {
	out := map[string]map[string]int{}
	s, err := js.Stream(ctx, router.QueueStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, err
	}
	for subj, n := range info.State.Subjects {
		t := strings.SplitN(strings.TrimPrefix(subj, router.HeldSubjectPrefix), ".", 4)
		if len(t) != 4 {
			continue
		}
		key := t[1] + "." + t[2]
		if out[key] == nil {
			out[key] = map[string]int{}
		}
		out[key][t[0]] += int(n)
	}
	return out, nil
}

// sumHeldBack is a group's held-back messages on every node.
func sumHeldBack(byNode map[string]int) int {
	n := 0
	for _, c := range byNode {
		n += c
	}
	return n
}

// groupRow is one group as groups and where show it.
type groupRow struct {
	b    kvbinding.Binding // State "" when the group has no record
	q    queueCount
	held int
	// heldBack: its messages waiting on a node's held subject.
	heldBack int
}

func (r *groupRow) state() string {
	if !r.b.Stored() {
		return stateUnbound
	}
	return string(r.b.State)
}

// appendJSON appends the row as a JSON object without its closing brace:
// the stored record's fields (as 'bindings --json'), then revision,
// waiting, unacked, oldest (when something is on a queue) and held.
func (r *groupRow) appendJSON(buf []byte) []byte {
	if r.b.Stored() {
		buf = r.b.AppendJSON(buf)
		buf = buf[:len(buf)-1] // reopen it
		buf = jsonx.AppendField(buf, "revision", false)
		buf = jsonx.AppendUint(buf, r.b.Revision)
	} else {
		buf = append(buf, `{"group":`...)
		buf = jsonx.AppendString(buf, r.b.Group)
		buf = append(buf, `,"state":"`+stateUnbound+`"`...)
	}
	buf = jsonx.AppendField(buf, "waiting", false)
	buf = strconv.AppendInt(buf, int64(r.q.waiting), 10)
	buf = jsonx.AppendField(buf, "unacked", false)
	buf = strconv.AppendInt(buf, int64(r.q.unacked), 10)
	if !r.q.oldest.IsZero() {
		buf = jsonx.AppendField(buf, "oldest", false)
		buf = appendJSONTime(buf, r.q.oldest)
	}
	buf = jsonx.AppendField(buf, "held", false)
	buf = strconv.AppendInt(buf, int64(r.held), 10)
	buf = jsonx.AppendField(buf, "held_back", false)
	return strconv.AppendInt(buf, int64(r.heldBack), 10)
}

func appendJSONTime(buf []byte, t time.Time) []byte {
	buf = append(buf, '"')
	buf = t.UTC().AppendFormat(buf, time.RFC3339Nano)
	return append(buf, '"')
}

// nodeColumn is the NODE cell: the node, or old->new while moving.
func (r *groupRow) nodeColumn() string {
	if r.b.Phase() == kvbinding.PhaseMoving {
		return orDash(r.b.PrevNode) + "->" + orDash(r.b.Node)
	}
	return orDash(r.b.Node)
}

// why says, shortly, what led to the record and what is in progress.
func (r *groupRow) why() string {
	b := &r.b
	var parts []string
	if b.ProposedBy != "" {
		parts = append(parts, "proposed by "+orDash(b.ProposedBy))
	}
	phase := b.Phase()
	switch {
	case phase == kvbinding.PhaseMoving && b.Node == "":
		parts = append(parts, "unbinding: "+orDash(b.PrevNode)+" hands it back")
	case phase == kvbinding.PhaseMoving:
		parts = append(parts, "moving: "+orDash(b.PrevNode)+" hands it over")
	case phase == kvbinding.PhaseReleased:
		parts = append(parts, "released by "+orDash(b.PrevNode)+" after seq "+strconv.FormatUint(b.ThroughSeq, 10))
	case phase == kvbinding.PhaseDeadLettered:
		parts = append(parts, "dead-lettered through seq "+strconv.FormatUint(b.ThroughSeq, 10))
	case b.PrevNode != "":
		parts = append(parts, "from "+orDash(b.PrevNode))
	}
	switch phase {
	case kvbinding.PhaseDraining:
		parts = append(parts, "hand-over in progress, draining "+strings.Join(b.Drain, ","))
	case kvbinding.PhaseCatchingUp:
		parts = append(parts, "hand-over in progress, catching up from seq "+strconv.FormatUint(b.FromSeq, 10))
	}
	if b.Reason != "" {
		parts = append(parts, strconv.Quote(b.Reason))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}

// age renders how long ago t was: "-" for the zero time, milliseconds
// under a second, else whole seconds.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := max(now.Sub(t), 0)
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// formatTime renders a table time ("-" for the zero time).
func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(timeLayout)
}
