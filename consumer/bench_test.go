package consumer_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

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
		lanesRate = runLanes(b, q, groups*per, "", concurrency, work)

		// The serial loop, on the same queue.
		seq = fill(b, q, serialMsgs, 1, seq)
		c, err := q.js.Consumer(context.Background(), router.QueueStream, router.QueueConsumer(node))
		if err != nil {
			b.Fatal(err)
		}
		var n atomic.Int64
		serialDone := make(chan struct{})
		began := time.Now()
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
		elapsed := time.Since(began)
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

// runLanes consumes the queue with a handler of work until healthy
// messages are processed (those of group poison, if set, always fail and
// are parked), and returns the healthy messages' rate.
func runLanes(b *testing.B, q *queue, healthy int, poison string, concurrency int, work time.Duration) float64 {
	b.Helper()
	var done atomic.Int64
	allDone := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	reg := prometheus.NewRegistry()
	began := time.Now()
	go func() {
		errc <- consumer.Consume(ctx, q.js, node, func(_ context.Context, m *consumer.Message) error {
			time.Sleep(work)
			if m.Group == poison {
				return errors.New("poison")
			}
			if done.Add(1) == int64(healthy) {
				close(allDone)
			}
			return nil
		}, consumer.WithConcurrency(concurrency), consumer.WithRegisterer(reg),
			consumer.WithMaxAttempts(5), consumer.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	}()
	select {
	case <-allDone:
	case <-time.After(2 * time.Minute):
		b.Fatalf("%d of %d healthy messages processed within 2 minutes", done.Load(), healthy)
	}
	elapsed := time.Since(began)
	if poison != "" {
		// The poisoned group's messages all parked before stopping.
		deadline := time.Now().Add(time.Minute)
		for q.left() != 0 {
			if time.Now().After(deadline) {
				b.Fatal("poisoned group not parked within a minute")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	cancel()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	if poison != "" {
		// Release the group for the next run.
		kv, err := q.js.KeyValue(context.Background(), consumer.ParkedBucket)
		if err == nil {
			err = kv.Delete(context.Background(), "r."+poison)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	return float64(healthy) / elapsed.Seconds()
}

// BenchmarkPoison: one group of 1,000 whose messages always fail, at 5 ms
// a message and 64 at once; the healthy groups' rate against a run
// without poison in the same benchmark (target: ratio >= 0.95).
func BenchmarkPoison(b *testing.B) {
	const (
		groups      = 1000
		per         = 12
		concurrency = 64
		work        = 5 * time.Millisecond
	)
	q := newQueue(b, true, 30*time.Second)
	seq := uint64(1)
	var clean, poisoned float64
	for b.Loop() {
		seq = fill(b, q, groups, per, seq)
		clean = runLanes(b, q, groups*per, "", concurrency, work)
		seq = fill(b, q, groups, per, seq)
		poisoned = runLanes(b, q, (groups-1)*per, "g0", concurrency, work)
	}
	b.ReportMetric(clean, "clean-msgs/s")
	b.ReportMetric(poisoned, "healthy-msgs/s")
	b.ReportMetric(poisoned/clean, "healthy-ratio")
}
