package proposals

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// BenchmarkDecisionService measures the LOCAL handler's decision throughput
// (batched proposals of new groups, each answered after its binding is
// written) against raw pipelined KV creates on the same server, in the same
// run, and reports the ratio.
func BenchmarkDecisionService(b *testing.B) {
	s := natstest.RunServer(b)
	env := startHandlerB(b, s)
	natstest.Eventually(b, 5*time.Second, func() error {
		if !env.h.Active() {
			return natstest.ErrNotYet
		}
		return nil
	})
	const batch, inFlight = maxBatchB, maxInFlightB
	n := max(b.N, 20000)
	b.ResetTimer()

	// Raw pipelined KV creates into a bucket of the same kind.
	js, _ := jetstream.New(s.Connect())
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "raw", History: 1})
	if err != nil {
		b.Fatal(err)
	}
	_ = kv
	ajs, _ := jetstream.New(s.Connect(), jetstream.WithPublishAsyncMaxPending(4096))
	// Realistic binding records, built before the clock starts.
	msgs := make([]*nats.Msg, n)
	hdr := nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"0"}}
	for i := range msgs {
		g := fmt.Sprintf("k%d", i)
		val, err := kvbinding.Binding{Group: g, State: kvbinding.StateBound, Node: "n1", FromSeq: uint64(i + 1),
			DecidedAt: time.Now().UTC(), DecidedBy: "h/h1", ProposedBy: "p"}.Marshal()
		if err != nil {
			b.Fatal(err)
		}
		key, _ := kvbinding.Key(g)
		msgs[i] = &nats.Msg{Subject: "$KV.raw." + key, Header: hdr, Data: val}
	}
	start, cpu0 := time.Now(), cpuTime()
	for _, m := range msgs {
		if _, err := ajs.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
	}
	<-ajs.PublishAsyncComplete()
	raw := float64(n) / time.Since(start).Seconds()
	rawCPU := (cpuTime() - cpu0).Seconds() / float64(n)

	// Decisions: batches of new groups, inFlight requests at a time.
	c := NewClient(s.Connect(), "p", 30*time.Second)
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	start, cpu0 = time.Now(), cpuTime()
	for off := 0; off < n; off += batch {
		ps := make([]Proposal, 0, batch)
		for i := off; i < min(off+batch, n); i++ {
			ps = append(ps, Proposal{Group: fmt.Sprintf("g%d", i), Node: "n1", Seq: uint64(i + 1)})
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			ds, err := c.Propose(context.Background(), ps)
			if err != nil {
				b.Error(err)
				return
			}
			for _, d := range ds {
				if d.Outcome != Accepted {
					b.Errorf("%s: %s %s", d.Group, d.Outcome, d.Error)
					return
				}
			}
		}()
	}
	wg.Wait()
	dec := float64(n) / time.Since(start).Seconds()
	decCPU := (cpuTime() - cpu0).Seconds() / float64(n)
	b.ReportMetric(rawCPU*1e6, "raw-cpu-µs/create")
	b.ReportMetric(decCPU*1e6, "cpu-µs/decision")
	b.ReportMetric(dec, "decisions/s")
	b.ReportMetric(raw, "raw-kv-creates/s")
	b.ReportMetric(dec/raw, "ratio")
}

// cpuTime is the CPU time this process has used (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startHandlerB(b *testing.B, s *natstest.Server) *handlerEnv {
	return startHandlerTB(b, s, "h1", liveNodes)
}

// The batching the router uses (router.maxBatch, router.maxBatchesInFlight).
const maxBatchB, maxInFlightB = MaxProposalsPerRequest, 8
