package ops

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/consumer"
)

// The status page's parked groups: read from the parked bucket (package
// consumer) at most every parkedEvery, the first parkedShown by group id.
const (
	parkedEvery = 5 * time.Second
	parkedShown = 20
)

// parkedV is one parked group's row.
type parkedV struct {
	Group    string    `json:"group"`
	Node     string    `json:"node"`
	At       time.Time `json:"at"`
	Attempts int       `json:"attempts"`
	Reason   string    `json:"reason"`
	// Messages is how many of its messages are parked.
	Messages uint64 `json:"messages"`
	// Replay is the replay asked for ("" while it waits for an
	// operator: grouprouter retry, skip, release).
	Replay string `json:"replay,omitempty"`
}

// parkedList is what the page shows of the parked groups.
type parkedList struct {
	// Groups are the first parkedShown parked groups by id; Total how
	// many are parked.
	Groups []parkedV `json:"groups"`
	Total  int       `json:"total"`
	// Error says why the list could not be read ("" when it was); Groups
	// and Total are then the last ones read.
	Error string `json:"error,omitempty"`
	// Read is when the list was last read (zero: never).
	Read time.Time `json:"read,omitzero"`
}

// parkedReader reads the parked groups for status requests, one read at a
// time and at most every parkedEvery.
type parkedReader struct {
	nc   *nats.Conn
	mu   sync.Mutex
	last parkedList
}

// list returns the parked groups, read again if the last reading is older
// than parkedEvery.
func (p *parkedReader) list(ctx context.Context) parkedList {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.nc == nil || time.Since(p.last.Read) < parkedEvery {
		return p.last
	}
	p.last.Read = time.Now()
	js, err := jetstream.New(p.nc)
	if err != nil {
		p.last.Error = err.Error()
		return p.last
	}
	groups, total, err := consumer.ListParkedFirst(ctx, js, parkedShown)
	if err != nil {
		p.last.Error = err.Error()
		return p.last
	}
	rows := make([]parkedV, 0, len(groups))
	for _, g := range groups {
		rows = append(rows, parkedV{Group: g.Group, Node: g.Record.Node, At: g.Record.At, Attempts: g.Record.Attempts,
			Reason: g.Record.Reason, Messages: g.Messages, Replay: string(g.Record.Mode)})
	}
	p.last = parkedList{Groups: rows, Total: total, Read: p.last.Read}
	return p.last
}
