package router

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// sideReads runs the reads of stored messages a lane waits for outside the
// engine, each in a goroutine of its own: a spilled message's body
// (fetchSpilled) and the stored copy of a lane publish the queue stream
// called a duplicate (laneDuplicate). Each kind has its own bound on the
// reads in flight (the others wait in their goroutines); close cancels
// what runs and waits for it, so that none outlives Run.
type sideReads struct {
	js jetstream.JetStream
	// spilled and late are the slots of the two kinds (maxFetches,
	// maxLateChecks).
	spilled, late chan struct{}

	mu     sync.Mutex // guards closed and wg.Add
	closed bool
	wg     sync.WaitGroup
	ctx    context.Context // cancelled by close
	cancel context.CancelFunc

	// handles: stream handles looked up once, by name (store).
	handlesMu sync.Mutex
	handles   map[string]jetstream.Stream
}

func newSideReads(js jetstream.JetStream) *sideReads {
	s := &sideReads{
		js:      js,
		spilled: make(chan struct{}, maxFetches),
		late:    make(chan struct{}, maxLateChecks),
		handles: map[string]jetstream.Stream{},
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// run runs read in a goroutine of its own once a slot is free, with a
// context that close cancels. It never blocks, and reports false instead
// when the node is stopping.
func (s *sideReads) run(slots chan struct{}, read func(ctx context.Context)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		slots <- struct{}{}
		defer func() { <-slots }()
		read(s.ctx)
	}()
	return true
}

// close cancels the reads still going (their publishes are dropped) and
// waits for them.
func (s *sideReads) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

// store returns the stored messages of the stream name, its handle looked
// up once (a handle is the stream's name and the client: it outlives
// leader changes).
func (s *sideReads) store(ctx context.Context, name string) (msgStore, error) {
	s.handlesMu.Lock()
	defer s.handlesMu.Unlock()
	if st := s.handles[name]; st != nil {
		return jsStore{st}, nil
	}
	st, err := s.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	s.handles[name] = st
	return jsStore{st}, nil
}
