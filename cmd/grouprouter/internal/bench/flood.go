package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/router"
)

// wlFlood is the flood workload (issue: bounded by default): a group bound
// beforehand is published at a steady pace (the probe) while the
// producers publish a flood of distinct new group ids as fast as they
// can. It compares the probe's latency during the flood with its latency
// alone, and reports the node's peak RSS against the documented bound.
const wlFlood = "flood"

// defaultFlood is the flood's number of new groups (--flood).
const defaultFlood = 1_000_000

// floodProbeRate is the probe group's pace (msgs/s), and floodProbeAlone
// how long it runs alone for its baseline.
const (
	floodProbeRate  = 200
	floodProbeAlone = 5 * time.Second
)

// floodRSSBound is the documented bound on a node's peak RSS at the
// default settings for ids of up to 64 bytes (docs/operations.md,
// "Memory"): the groups' cache at its limit, the held and the spilled
// messages at theirs, the runtime's overhead on all of it.
const floodRSSBound = 1536 << 20

// floodRun is what the flood workload measured.
type floodRun struct {
	alone, during percentiles // the probe group's latency
	m             measure     // the flood itself
	spilled       int         // the most messages the node held spilled, as sampled
	relay         *floodRun   // the same flood through the relay (the router's run only)
	deadLettered  int64       // flood messages dead-lettered (past the group limit)
}

// floodIDs returns the groupFunc of the flood: distinct 64-byte ids.
func floodIDs() groupFunc { return burstIDs("flood-", 64) }

// floodPhase runs the flood workload through the relay (the baseline:
// what any in-order reader of the ingress sees of a flood), then on a
// fresh router node.
func (b *bencher) floodPhase(ctx context.Context, e *env, sr *serverResults, profile string) error {
	b.phase("flood of %d new groups beside a bound group at %d msgs/s: relay, then router", b.cfg.Flood, floodProbeRate)
	relay, err := b.floodOn(ctx, e, true, "")
	if err != nil {
		return err
	}
	fr, err := b.floodOn(ctx, e, false, profile)
	if err != nil {
		return err
	}
	fr.relay = &relay
	sr.flood = &fr
	return nil
}

// floodOn runs the flood through the relay, or through a fresh router node.
func (b *bencher) floodOn(ctx context.Context, e *env, viaRelay bool, profile string) (floodRun, error) {
	if err := b.resetRouting(ctx, e); err != nil {
		return floodRun{}, err
	}
	args := loneRouterArgs(e)
	if !b.cfg.FloodSpill {
		args = append(args, "--max-spilled-bytes", "-1")
	}
	name := "router n0 (flood)"
	if viaRelay {
		var err error
		if args, err = b.relayArgs(ctx, e); err != nil {
			return floodRun{}, err
		}
		name = "relay (flood)"
	}
	if profile != "" {
		args = append(args, "--cpuprofile", profileName(profile, "flood"), "--memprofile", profileName(profile, "flood-heap"))
	}
	k, err := startChild(b.prefix, args, name, &countingWriter{w: b.stderr, limit: 16 << 10})
	if err != nil {
		return floodRun{}, err
	}
	fr, runErr := b.flood(ctx, e, k, !viaRelay)
	stopErr := b.stopAll([]*child{k})
	if runErr != nil {
		return fr, runErr
	}
	if stopErr != nil {
		return fr, stopErr
	}
	b.logf("flood via %s: %d groups delivered in %.2fs; probe p50/p99 alone %v/%v, during %v/%v; spilled up to %d; peak RSS %.1f MiB",
		name, fr.m.N, fr.m.Elapsed.Seconds(), fr.alone.P50, fr.alone.P99, fr.during.P50, fr.during.P99, fr.spilled, mib(float64(fr.m.RSS)))
	return fr, nil
}

func (b *bencher) flood(ctx context.Context, e *env, k *child, isRouter bool) (floodRun, error) {
	var fr floodRun
	if _, err := k.next(ctx, "ready", 60*time.Second); err != nil {
		return fr, err
	}
	if err := e.sink.consume(ctx, "n0"); err != nil {
		return fr, err
	}
	if isRouter {
		if err := waitRegistry(ctx, e.js, []string{"n0"}, 1, 20*time.Second); err != nil {
			return fr, err
		}
	}
	// Bind the probe group, then measure it alone.
	b.runID++
	probe := newRun(b.runID, 0, true, "")
	probe.want = -1 // never done
	e.sink.probe.Store(probe)
	defer e.sink.probe.Store(nil)
	pc, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	var probeErr error
	go func() {
		defer wg.Done()
		probeErr = b.publishProbe(pc, e, probe.id)
	}()
	defer func() { cancel(); wg.Wait() }()
	time.Sleep(floodProbeAlone)
	fr.alone = probe.cut()

	// The flood, the probe going on.
	sample, stopSample := context.WithCancel(ctx)
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sample.Done():
				return
			case <-t.C:
				if !isRouter {
					continue
				}
				if rep, err := k.stats(sample); err == nil {
					fr.spilled = max(fr.spilled, rep.Spilled)
				}
			}
		}
	}()
	// Past the group limit a flood group is dead-lettered: done too.
	var dead atomic.Int64
	stopDead, err := e.sink.countDeadLetters(ctx, &dead)
	if err != nil {
		stopSample()
		sampler.Wait()
		return fr, err
	}
	m, err := b.measureRun(ctx, e, []*child{k}, runSpec{label: "flood", n: b.cfg.Flood, rate: b.cfg.FloodRate, groups: floodIDs()})
	stopDead()
	fr.deadLettered = dead.Load()
	stopSample()
	sampler.Wait()
	if err != nil {
		return fr, err
	}
	fr.m = m
	fr.during = probe.cut()
	cancel()
	wg.Wait()
	if probeErr != nil && ctx.Err() == nil && !strings.Contains(probeErr.Error(), "context canceled") {
		return fr, fmt.Errorf("flood probe: %w", probeErr)
	}
	return fr, nil
}

// publishProbe publishes the probe group at floodProbeRate until ctx ends,
// each message waiting for its PubAck (one group: one at a time anyway).
func (b *bencher) publishProbe(ctx context.Context, e *env, id uint32) error {
	js := e.prod.js[0]
	every := time.Second / floodProbeRate
	next := time.Now()
	for ctx.Err() == nil {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		next = next.Add(every)
		body := make([]byte, e.prod.payload)
		binary.LittleEndian.PutUint32(body[offRun:], id)
		binary.LittleEndian.PutUint64(body[offTime:], uint64(time.Now().UnixNano()))
		msg := &nats.Msg{Subject: benchSubject, Header: nats.Header{router.DefaultGroupHeader: []string{"flood-probe"}}, Data: body}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := js.PublishMsg(pctx, msg)
		cancel()
		if err != nil && ctx.Err() == nil {
			return err
		}
	}
	return nil
}

// cut returns the percentiles of the latencies observed so far and starts
// a new sample.
func (r *run) cut() percentiles {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := percentilesOf(r.lat)
	r.lat = r.lat[:0]
	return p
}

// floodRows turns the flood run into rows.
func (sr *serverResults) floodRows(rb *rowBuilder) {
	fr := sr.flood
	if fr == nil {
		return
	}
	m := fr.m
	rb.add(wlFlood, 1, fmt.Sprintf("%d new groups: all routed after", m.N), m.Elapsed.Seconds(), unitSec).noise(m.Foreign)
	rb.add(wlFlood, 1, "bound group's latency p50 alone", ms(fr.alone.P50), unitMs)
	rb.add(wlFlood, 1, "bound group's latency p99 alone", ms(fr.alone.P99), unitMs)
	r := rb.add(wlFlood, 1, "bound group's latency p50 during the flood", ms(fr.during.P50), unitMs).noise(m.Foreign).vs("alone", ms(fr.alone.P50))
	atMost(r, 2)
	r = rb.add(wlFlood, 1, "bound group's latency p99 during the flood", ms(fr.during.P99), unitMs).noise(m.Foreign).vs("alone", ms(fr.alone.P99))
	atMost(r, 2)
	if rl := fr.relay; rl != nil {
		rb.add(wlFlood, 1, "flood delivered after, vs the relay", m.Elapsed.Seconds(), unitSec).noise(m.Foreign).
			vs("relay", rl.m.Elapsed.Seconds()).noise(rl.m.Foreign)
		rb.add(wlFlood, 1, "bound group's latency p50 during the flood, vs the relay's", ms(fr.during.P50), unitMs).noise(m.Foreign).
			vs("relay", ms(rl.during.P50)).noise(rl.m.Foreign)
		rb.add(wlFlood, 1, "bound group's latency p99 during the flood, vs the relay's", ms(fr.during.P99), unitMs).noise(m.Foreign).
			vs("relay", ms(rl.during.P99)).noise(rl.m.Foreign)
	}
	rb.add(wlFlood, 1, "messages spilled at most (sampled)", float64(fr.spilled), unitCount)
	rb.add(wlFlood, 1, "messages dead-lettered (the group limit)", float64(fr.deadLettered), unitCount)
	r = rb.add(wlFlood, 1, "node peak RSS", mib(float64(m.RSS)), unitMiB).noise(m.Foreign)
	r.Target = fmt.Sprintf("<= %d MiB", floodRSSBound>>20)
	under := m.RSS <= floodRSSBound
	r.Met = &under
}

// countDeadLetters counts, as delivered messages of the current run, the
// run's messages that reach the dead-letter stream (a flood past the
// group limit), and adds them to n, until the returned function is
// called.
func (s *sink) countDeadLetters(ctx context.Context, n *atomic.Int64) (func(), error) {
	cons, err := s.js.OrderedConsumer(ctx, router.DeadLetterStream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return nil, err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		body := m.Data()
		if r := s.cur.Load(); r != nil && len(body) >= minBody && binary.LittleEndian.Uint32(body[offRun:]) == r.id {
			n.Add(1)
			r.observe(time.Now().UnixNano(), body)
		}
	})
	if err != nil {
		return nil, err
	}
	return cc.Stop, nil
}
