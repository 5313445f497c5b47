package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/consumer"
)

// wlBusy is the busy-group workload (docs/consuming.md, "A busy group"):
// an application on package consumer (16 lanes) whose handler takes
// busyHandler for one group and nothing for the others. Quiet groups get a
// message each every busyEvery for busyFor, once alone and once behind a
// backlog of busyBacklog messages of the busy group published at once, and
// once beside a group whose handler hangs for busyHang on its first
// message, with as large a backlog behind it. It reports the quiet groups'
// latency in the three runs (the target: beside the backlog or the hang, a
// p99 at most twice the one alone) and the busy group's own rate against
// what its handler allows (the target: at least 0.9x).
const wlBusy = "busy"

// The busy workload's shape (the issue's: a batch import of one group).
const (
	busyBacklog = 3000
	busyHandler = 10 * time.Millisecond
	busyQuiet   = 20
	busyEvery   = 100 * time.Millisecond
	busyFor     = 20 * time.Second
	busyHang    = 60 * time.Second
)

// How a busy run loads the node beside its quiet groups.
const (
	busyAlone  = iota // nothing
	busyBehind        // the busy group's backlog
	busyHung          // a group whose handler hangs on its first message, with a backlog
)

// busyRun is what the busy workload measured.
type busyRun struct {
	alone, behind percentiles // the quiet groups' latency without, and behind, the backlog
	hung          percentiles // ... beside a group whose handler hangs
	hotRate       float64     // the busy group's messages processed per second, first to last
	hotAllowed    float64     // what its handler allows: 1 / busyHandler
	heldBack      bool        // the node held the busy group back (a hold event)
}

// busyPhase runs the quiet groups alone, behind the backlog and beside a
// hung group, each on a fresh router node.
func (b *bencher) busyPhase(ctx context.Context, e *env, sr *serverResults) error {
	b.phase("busy group: %d messages of one group at %v each, beside %d quiet groups every %v for %v: alone, behind it, then beside a group whose handler hangs %v",
		busyBacklog, busyHandler, busyQuiet, busyEvery, busyFor, busyHang)
	var br busyRun
	alone, _, _, err := b.busyOn(ctx, e, busyAlone)
	if err != nil {
		return err
	}
	behind, rate, held, err := b.busyOn(ctx, e, busyBehind)
	if err != nil {
		return err
	}
	hung, _, _, err := b.busyOn(ctx, e, busyHung)
	if err != nil {
		return err
	}
	br.alone, br.behind, br.hung, br.hotRate, br.heldBack = alone, behind, hung, rate, held
	br.hotAllowed = float64(time.Second) / float64(busyHandler)
	sr.busy = &br
	b.logf("busy group: quiet p50/p99/max alone %v/%v/%v, behind the backlog %v/%v/%v, beside a hung group %v/%v/%v; the busy group at %.0f msgs/s of %.0f its handler allows; held back: %v",
		alone.P50, alone.P99, alone.M, behind.P50, behind.P99, behind.M, hung.P50, hung.P99, hung.M, rate, br.hotAllowed, held)
	return nil
}

// busyOn runs the quiet groups on a fresh router node, beside what mode
// says. It returns the quiet groups' latency (publish to the handler's
// start), the busy group's rate, and whether the node held it back. The
// hung group is not waited for: its handler hangs past the quiet groups'
// run, and the consumer stops under it.
func (b *bencher) busyOn(ctx context.Context, e *env, mode int) (percentiles, float64, bool, error) {
	backlog := mode == busyBehind
	if err := b.resetRouting(ctx, e); err != nil {
		return percentiles{}, 0, false, err
	}
	k, err := startChild(b.prefix, loneRouterArgs(e), "router n0 (busy)", &countingWriter{w: b.stderr, limit: 16 << 10})
	if err != nil {
		return percentiles{}, 0, false, err
	}
	defer func() { _ = b.stopAll([]*child{k}) }()
	if _, err := k.next(ctx, "ready", 60*time.Second); err != nil {
		return percentiles{}, 0, false, err
	}
	var mu sync.Mutex
	sent := map[string]time.Time{}
	var lat []time.Duration
	var hotFirst, hotLast time.Time
	hot := 0
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- consumer.Consume(cctx, e.js, "n0", func(ctx context.Context, m *consumer.Message) error {
			now := time.Now()
			if m.Group == "stuck" {
				if string(m.Data) == "stuck/0" {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(busyHang):
					}
				}
				return nil
			}
			if m.Group == "hot" {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(busyHandler):
				}
				mu.Lock()
				if hot == 0 {
					hotFirst = now
				}
				hot++
				hotLast = time.Now()
				mu.Unlock()
				return nil
			}
			mu.Lock()
			if at, ok := sent[string(m.Data)]; ok {
				lat = append(lat, now.Sub(at))
			}
			mu.Unlock()
			return nil
		}, consumer.WithConcurrency(16))
	}()
	defer func() {
		stop()
		<-done
	}()
	if err := waitRegistry(ctx, e.js, []string{"n0"}, 1, 20*time.Second); err != nil {
		return percentiles{}, 0, false, err
	}
	events := make(chan struct{}, 1)
	sub, err := e.mon.Subscribe("grouping.events.hold", func(*nats.Msg) {
		select {
		case events <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return percentiles{}, 0, false, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	js := e.prod.js[0]
	if mode != busyAlone {
		group := "hot"
		if mode == busyHung {
			group = "stuck"
		}
		futures := make([]jetstream.PubAckFuture, 0, busyBacklog)
		for i := range busyBacklog {
			m := nats.NewMsg(benchAddress + ".busy")
			m.Header.Set("Group-Id", group)
			m.Data = []byte(group + "/" + strconv.Itoa(i))
			f, err := js.PublishMsgAsync(m)
			if err != nil {
				return percentiles{}, 0, false, err
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return percentiles{}, 0, false, err
			case <-ctx.Done():
				return percentiles{}, 0, false, ctx.Err()
			}
		}
	}
	quiet := 0
	for start := time.Now(); time.Since(start) < busyFor; quiet++ {
		if d := time.Until(start.Add(time.Duration(quiet) * busyEvery)); d > 0 {
			time.Sleep(d)
		}
		for g := range busyQuiet {
			body := "q" + strconv.Itoa(g) + "/" + strconv.Itoa(quiet)
			m := nats.NewMsg(benchAddress + ".busy")
			m.Header.Set("Group-Id", "q"+strconv.Itoa(g))
			m.Data = []byte(body)
			mu.Lock()
			sent[body] = time.Now()
			mu.Unlock()
			if _, err := js.PublishMsg(ctx, m); err != nil {
				return percentiles{}, 0, false, err
			}
		}
	}
	want := quiet * busyQuiet
	deadline := time.Now().Add(busyBacklog*busyHandler + time.Minute)
	for {
		mu.Lock()
		n, h := len(lat), hot
		mu.Unlock()
		if n >= want && (!backlog || h >= busyBacklog) {
			break
		}
		if time.Now().After(deadline) {
			return percentiles{}, 0, false, fmt.Errorf("busy: %d of %d quiet and %d of %d busy messages processed", n, want, h, busyBacklog)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	rate := 0.0
	if hot > 1 {
		rate = float64(hot-1) / hotLast.Sub(hotFirst).Seconds()
	}
	held := false
	select {
	case <-events:
		held = true
	default:
	}
	return percentilesOf(lat), rate, held, nil
}

// busyRows adds the busy workload's figures.
func (sr *serverResults) busyRows(rb *rowBuilder) {
	br := sr.busy
	if br == nil {
		return
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	rb.add(wlBusy, 1, "quiet groups p50, alone", ms(br.alone.P50), unitMs)
	rb.add(wlBusy, 1, "quiet groups p99, alone", ms(br.alone.P99), unitMs)
	rb.add(wlBusy, 1, "quiet groups p50, behind a busy group's backlog", ms(br.behind.P50), unitMs)
	r := rb.add(wlBusy, 1, "quiet groups p99, behind a busy group's backlog", ms(br.behind.P99), unitMs).vs("alone", ms(br.alone.P99))
	r.Target = "<= 2x alone"
	ok := br.alone.P99 > 0 && br.behind.P99 <= 2*br.alone.P99
	r.Met = &ok
	r = rb.add(wlBusy, 1, "quiet groups p99, beside a group whose handler hangs", ms(br.hung.P99), unitMs).vs("alone", ms(br.alone.P99))
	r.Target = "<= 2x alone"
	unhurt := br.alone.P99 > 0 && br.hung.P99 <= 2*br.alone.P99
	r.Met = &unhurt
	r = rb.add(wlBusy, 1, "busy group's own rate", br.hotRate, unitMsgs).vs("its handler's", br.hotAllowed)
	r.Target = ">= 0.9x its handler's"
	fast := br.hotRate >= 0.9*br.hotAllowed
	r.Met = &fast
}
