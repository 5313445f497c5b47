package consumer_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"grouprouter/consumer"
	"grouprouter/router"
)

// fill queues per messages of each of groups groups, round robin, with
// ingress seqs from first; it returns the next seq.
func fill(b *testing.B, q *queue, groups, per int, first uint64) uint64 {
	b.Helper()
	seq := first
	for range per {
		for g := range groups {
			m := nats.NewMsg(router.QueueSubject(node, "orders.x"))
			m.Header.Set("Group-Id", "g"+strconv.Itoa(g))
			m.Header.Set(router.HeaderIngressSeq, strconv.FormatUint(seq, 10))
			m.Header.Set(router.HeaderEpoch, "1")
			m.Data = []byte("body")
			if _, err := q.js.PublishMsgAsync(m); err != nil {
				b.Fatal(err)
			}
			seq++
		}
	}
	select {
	case <-q.js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("queue not filled within a minute")
	}
	return seq
}

// BenchmarkConsumeVsSerial: a 5 ms handler, 1,000 groups, 64 handlers at
// once, against the README's serial loop (nats.go Consume, one callback
// at a time, then Ack) on the same queue in the same run. It reports
// both rates, the speedup, and the efficiency speedup/64 (target >= 0.9).
func BenchmarkConsumeVsSerial(b *testing.B) {
	const (
		groups      = 1000
		per         = 12
		concurrency = 64
		work        = 5 * time.Millisecond
		serialMsgs  = 400
	)
	q := newQueue(b, true, 30*time.Second)
	seq := uint64(1)
	var lanesRate, serialRate float64
	for b.Loop() {
		// The package.
		seq = fill(b, q, groups, per, seq)
		var done atomic.Int64
		allDone := make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		began := time.Now()
		go func() {
			errc <- consumer.Consume(ctx, q.js, node, func(context.Context, *consumer.Message) error {
				time.Sleep(work)
				if done.Add(1) == groups*per {
					close(allDone)
				}
				return nil
			}, consumer.WithConcurrency(concurrency))
		}()
		<-allDone
		elapsed := time.Since(began)
		cancel()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
		lanesRate = float64(groups*per) / elapsed.Seconds()

		// The serial loop, on the same queue.
		seq = fill(b, q, serialMsgs, 1, seq)
		c, err := q.js.Consumer(context.Background(), router.QueueStream, router.QueueConsumer(node))
		if err != nil {
			b.Fatal(err)
		}
		var n atomic.Int64
		serialDone := make(chan struct{})
		began = time.Now()
		cc, err := c.Consume(func(m jetstream.Msg) {
			time.Sleep(work)
			_ = m.Ack()
			if n.Add(1) == serialMsgs {
				close(serialDone)
			}
		}, jetstream.PullPriorityGroup(router.PriorityGroup))
		if err != nil {
			b.Fatal(err)
		}
		<-serialDone
		elapsed = time.Since(began)
		cc.Stop()
		<-cc.Closed()
		serialRate = float64(serialMsgs) / elapsed.Seconds()
		// Let the next Consume take the pin at once.
		s, err := q.js.Stream(context.Background(), router.QueueStream)
		if err == nil {
			_ = s.UnpinConsumer(context.Background(), router.QueueConsumer(node), router.PriorityGroup)
		}
	}
	b.ReportMetric(lanesRate, "msgs/s")
	b.ReportMetric(serialRate, "serial-msgs/s")
	b.ReportMetric(lanesRate/serialRate, "speedup")
	b.ReportMetric(lanesRate/serialRate/concurrency, "efficiency")
}
