package demo

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/internal/localnats"
	"github.com/grouprouter/grouprouter/router"
)

const (
	// address is where the demo's producers publish: address.orders.
	address = "jms"
	subject = address + ".orders"
	// headerSeq numbers a group's messages from 0.
	headerSeq = "Demo-Seq"
	// lanesPerProducer: each producer publishes from this many goroutines,
	// each owning some groups and publishing them one message at a time.
	lanesPerProducer = 4
	// publishTimeout bounds one publish attempt; an attempt that fails is
	// made again with the same message id (the ingress stream stores it
	// once), until confirmed or stopRetrying after the producers stop.
	publishTimeout = 5 * time.Second
	stopRetrying   = 10 * time.Second
)

// producers publish numbered messages over the groups at a steady rate:
// one producer per server, each with lanesPerProducer lanes; lane k owns
// the groups whose index is k modulo the number of lanes, so that each
// group is published in order by one goroutine that waits for each
// PubAck before the next message of the group.
type producers struct {
	conns []*nats.Conn
	stop  chan struct{}
	wg    sync.WaitGroup
	// errors counts publish attempts that failed (and were made again).
	mu     sync.Mutex
	errors int
}

func startProducers(c *localnats.Cluster, groups []string, rate float64, l *ledger) (*producers, error) {
	p := &producers{stop: make(chan struct{})}
	lanes := min(len(c.URLs())*lanesPerProducer, len(groups))
	interval := time.Duration(float64(time.Second) * float64(lanes) / rate)
	for s := range c.URLs() {
		nc, err := c.Connect(s, "demo-producer-"+strconv.Itoa(s+1))
		if err != nil {
			p.halt()
			return nil, err
		}
		p.conns = append(p.conns, nc)
		js, err := jetstream.New(nc)
		if err != nil {
			p.halt()
			return nil, err
		}
		for k := s; k < lanes; k += len(c.URLs()) {
			var own []int
			for i := k; i < len(groups); i += lanes {
				own = append(own, i)
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.lane(js, groups, own, interval, l)
			}()
		}
	}
	return p, nil
}

// lane publishes its groups round-robin, one message every interval.
func (p *producers) lane(js jetstream.JetStream, groups []string, own []int, interval time.Duration, l *ledger) {
	next := time.Now()
	seq := make([]int, len(own))
	t := time.NewTimer(0)
	defer t.Stop()
	for k := 0; ; k++ {
		next = next.Add(interval)
		if late := time.Since(next); late > time.Second {
			next = time.Now() // fell behind (a slow publish): no burst to catch up
		}
		t.Reset(time.Until(next))
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		j := k % len(own)
		g, n := own[j], seq[j]
		if !p.publish(js, groups[g], n) {
			l.unconfirmedPublish(g, n)
			return
		}
		l.published(g, n)
		seq[j]++
	}
}

// publish stores message n of group until its PubAck arrives, and reports
// whether it did; after the producers are stopped it keeps trying for
// stopRetrying.
func (p *producers) publish(js jetstream.JetStream, group string, n int) bool {
	m := nats.NewMsg(subject)
	m.Header.Set(router.DefaultGroupHeader, group)
	m.Header.Set(headerSeq, strconv.Itoa(n))
	m.Header.Set(jetstream.MsgIDHeader, "demo:"+group+":"+strconv.Itoa(n))
	m.Data = fmt.Appendf(nil, "%s #%d", group, n)
	var giveUp time.Time
	for {
		ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
		_, err := js.PublishMsg(ctx, m)
		cancel()
		if err == nil {
			return true
		}
		p.mu.Lock()
		p.errors++
		p.mu.Unlock()
		select {
		case <-p.stop:
			if giveUp.IsZero() {
				giveUp = time.Now().Add(stopRetrying)
			}
			if time.Now().After(giveUp) {
				return false
			}
		default:
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// halt stops the producers, waits for their last publishes and closes
// their connections.
func (p *producers) halt() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.wg.Wait()
	for _, nc := range p.conns {
		nc.Close()
	}
	p.conns = nil
}

func (p *producers) publishErrors() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.errors
}

// queueConsumer consumes one node's queue as an application would, with
// package consumer: each group's messages in order, every message
// recorded in the ledger and then acked.
type queueConsumer struct {
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
}

func startConsumer(ctx context.Context, c *localnats.Cluster, n *node, l *ledger) (*queueConsumer, error) {
	nc, err := c.Connect(n.server, "demo-consumer-"+n.id)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	// The node's router creates its queue consumer; Consume needs it.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		_, err = js.Consumer(cctx, router.QueueStream, router.QueueConsumer(n.id))
		if err == nil || cctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("demo: the queue consumer of %s: %w", n.id, err)
	}
	q := &queueConsumer{nc: nc, done: make(chan struct{})}
	var runCtx context.Context
	runCtx, q.cancel = context.WithCancel(ctx)
	handle := func(_ context.Context, m *consumer.Message) error {
		seq, err := strconv.Atoi(m.Header.Get(headerSeq))
		if err != nil {
			seq = -1
		}
		l.processedMsg(m.Group, seq, n.id)
		return nil
	}
	go func() {
		defer close(q.done)
		err := consumer.Consume(runCtx, js, n.id, handle, consumer.WithDrainTimeout(2*time.Second), consumer.WithLogger(n.cfg.Logger))
		if err != nil {
			// The summary shows its messages as missing.
			n.cfg.Logger.Error("demo: the consumer stopped", "err", err)
		}
	}()
	return q, nil
}

// stop stops consuming (the messages held are handed back, the queue
// unpinned) and closes the connection.
func (q *queueConsumer) stop() {
	q.cancel()
	<-q.done
	q.nc.Close()
}
