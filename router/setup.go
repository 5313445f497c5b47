package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/grouprouter/grouprouter/internal/jspub"
	natsretry "github.com/grouprouter/grouprouter/internal/retry"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// Pacing of the setup steps' retries.
const (
	// setupAttemptMin bounds the first setupShortAttempts attempts of a
	// setup step, setupAttemptMax the later ones. A JetStream request sent
	// while the cluster has no meta leader, or a creation racing another
	// node's, may get no answer at all (the servers say "leaderless" only
	// 10 s after they start), so an attempt's timeout is how late a node
	// may notice the cluster it waited for (measured: a 10 s first attempt
	// made three nodes started with their cluster ready after 10 s, 2 s
	// attempts after 2.5 to 7 s, as the cluster formed). A creation that
	// timed out on the client goes on on the servers and the next attempt
	// finds what it made; later attempts are longer for a cluster that
	// answers slowly.
	setupAttemptMin    = 2 * time.Second
	setupAttemptMax    = 5 * time.Second
	setupShortAttempts = 5
	// setupLogEvery is the least time between two "still waiting" lines of
	// one step: a node waiting for its cluster says so without flooding.
	setupLogEvery = 15 * time.Second
	// setupBackoffMin and setupBackoffMax bound the pause between attempts.
	setupBackoffMin = 100 * time.Millisecond
	setupBackoffMax = 5 * time.Second
	// clusterFormingWait is how long a LOCAL node in a cluster that
	// cannot place three replicas yet waits for it to form before it
	// creates the streams with one replica (auto replicas only).
	clusterFormingWait = 10 * time.Second
)

// setup runs the node's setup steps, each waiting for NATS as long as ctx
// lasts, up to the node being ready (Ready closed). It returns the node's
// queue consumer and release, which stops what setup started (the cache
// and registry watches, the queue publisher, the store's). On an error
// setup has released it all already.
func (r *Router) setup(ctx context.Context) (queueCons jetstream.Consumer, release func(), err error) {
	var undo []func()
	stop := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	if err := r.waitConnected(ctx); err != nil {
		return nil, nil, err
	}
	replicas := r.cfg.Replicas
	forming, fallback := time.Now(), false
	if err := r.setupStep(ctx, "streams", func(ctx context.Context) error {
		want := Replicas(r.nc, r.cfg.Replicas)
		if fallback {
			want = 1
		}
		err := ensureStreams(ctx, r.js, r.cfg, want)
		if err != nil && r.cfg.Replicas == 0 && want > 1 && cannotPlace(err) {
			// Auto replicas in a cluster that cannot place three: one
			// still forming (wait for it), or one of fewer servers.
			if time.Since(forming) < clusterFormingWait {
				return fmt.Errorf("waiting for the cluster to place 3 replicas (auto): %v", err)
			}
			fallback = true
			r.log.Warn("auto replicas: the cluster cannot place 3 replicas; the streams and buckets this node creates get 1",
				"cluster", r.nc.ConnectedClusterName(), "err", err, "hint", "--replicas sets it")
			err = ensureStreams(ctx, r.js, r.cfg, 1)
		}
		if err != nil {
			return err
		}
		if r.cfg.Replicas > 0 {
			return nil
		}
		// The buckets get the streams' replicas, whoever created them.
		s, err := r.js.Stream(ctx, IngressStream)
		if err != nil {
			return err
		}
		replicas = max(s.CachedInfo().Config.Replicas, 1)
		return nil
	}); err != nil {
		return nil, nil, err
	}
	r.replicas = replicas
	if err := r.setupStep(ctx, "bindings bucket", func(ctx context.Context) (err error) {
		r.store, err = kvbinding.OpenStore(ctx, r.js, kvbinding.StoreConfig{Replicas: replicas, MaxBytes: r.cfg.BindingsMaxBytes})
		return err
	}); err != nil {
		return nil, nil, err
	}
	undo = append(undo, r.store.Close)
	if err := r.setupStep(ctx, "node registry bucket", func(ctx context.Context) (err error) {
		r.reg, err = kvbinding.OpenRegistry(ctx, r.js, kvbinding.RegistryConfig{Replicas: replicas, Logger: r.log}, r.onLiveChange)
		return err
	}); err != nil {
		return nil, nil, err
	}
	r.live.reg = r.reg
	// Before anything this node id owns (its queue consumer, checkpoint,
	// liveness record, the handler lease) is touched: is another process
	// running under the id? (identity.go)
	if err := r.claimNodeID(ctx); err != nil {
		return nil, nil, err
	}
	r.proc.started = time.Now().UTC()
	batch, fast := r.queueBatch(ctx)
	r.out.fast = fast
	holds := r.queueHolds(ctx) // fair.go
	maxBatches := maxAtomicInFlight
	if fast {
		maxBatches = maxFastInFlight
	}
	r.cache = kvbinding.NewCache(kvbinding.CacheConfig{Notify: r.changes, Logger: r.log, OnRewind: r.bindingsRewound})
	// Records of long ids written before digest keys stay under their
	// full key: the cache knows which (kvbinding.Key).
	r.store.UseLegacyKeys(r.cache.LegacyKey)
	r.eng = newEngine(engineConfig{
		node: r.cfg.Node, maxHeldMessages: r.cfg.MaxHeldMessages, maxHeldBytes: r.cfg.MaxHeldBytes,
		maxInFlight: r.cfg.MaxInFlight, maxAttempts: r.cfg.MaxAttempts, timeout: r.cfg.Timeout,
		localFirst: r.cfg.LocalFirst, groupTimeout: r.cfg.GroupTimeout,
		maxBatch: batch, maxBatchBytes: maxBatchBytes, maxBatches: maxBatches,
		spillFrom: spillFrom(r.cfg), maxSpilledBytes: r.cfg.MaxSpilledBytes,
		groupShare: r.cfg.GroupShare, holds: holds,
	}, r.cache, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())))
	pub, err := jspub.New(r.nc, 5*time.Second, jspub.WithBatchEnd(r.out.ackBatch))
	if err != nil {
		return nil, nil, &SetupError{Step: "queue publisher", Err: err}
	}
	r.out.out = jsSender{pub, r.nc}
	undo = append(undo, pub.Close)
	r.dec.client = proposals.NewClient(r.nc, r.cfg.Node, r.cfg.Timeout)
	r.ho = r.newHandOver()

	// Background state: the binding cache, its change feed and the node
	// registry. They outlive routing (the drain at the end still reads
	// them) and stop with release. Their watches retry transient failures
	// themselves.
	bgCtx, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	bg, bgCtx := errgroup.WithContext(bgCtx)
	bg.Go(func() error { return ignoreCanceled(r.cache.Run(bgCtx, r.store)) })
	bg.Go(func() error { return ignoreCanceled(r.reg.Run(bgCtx)) })
	bg.Go(func() error { r.changeLoop(bgCtx); return nil })
	undo = append(undo, func() { stopBg(); _ = bg.Wait() })
	for _, w := range []struct {
		what  string
		ready <-chan struct{}
	}{{"binding cache load", r.cache.Ready()}, {"node registry load", r.reg.Ready()}} {
		if !r.waitLoaded(ctx, bgCtx.Done(), w.what, w.ready) {
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			return nil, nil, &SetupError{Step: w.what, Err: bg.Wait()}
		}
	}
	var resume resumePoint
	var floor uint64
	if err := r.setupStep(ctx, "checkpoint load", func(ctx context.Context) (err error) {
		if resume, err = r.loadResume(ctx); err != nil {
			return err
		}
		floor, err = r.loadFloor(ctx) // floor.go
		return err
	}); err != nil {
		return nil, nil, err
	}
	if resume.ckpt.Next == 0 && floor > 0 {
		r.log.Info("no checkpoint: reading the ingress from the routing floor", "floor", floor)
	}
	resume = withFloor(resume, floor)
	r.step(inBegin{resume: resume, floor: floor})
	if r.cfg.Type == Local {
		r.dec.handler = proposals.NewHandler(r.nc, r.store, r.cache, r.reg, proposals.HandlerConfig{
			Name: r.cfg.Name, Node: r.cfg.Node, LeaseTTL: r.cfg.LeaseTTL, Logger: r.cfg.Logger,
			NodeGrace: r.cfg.NodeGrace, RebindAfter: r.cfg.RebindAfter, FenceDeadline: r.cfg.FenceDeadline,
			RecordTTL: r.cfg.RecordTTL, Queues: queues{r}, InboxPrefix: r.cfg.InboxPrefix, Metrics: r.metrics.handler,
			Rebalance: r.cfg.Rebalance, MaxGroups: r.cfg.MaxGroups,
		})
	}
	unsubscribe, err := r.subscribeTakeovers()
	if err != nil {
		return nil, nil, &SetupError{Step: "handler events", Err: err}
	}
	undo = append(undo, unsubscribe)
	// The queue consumer last, right before the first announcement: an
	// application that attaches the moment it exists is announced with
	// it within the next look (the steps above can take seconds on a
	// cluster that is forming; issue 31: a node seen with its consumer
	// 2 s after the application attached).
	if err := r.setupStep(ctx, "queue consumer", func(ctx context.Context) (err error) {
		queueCons, err = ensureQueueConsumer(ctx, r.js, r.cfg.Node, r.cfg.QueueMode, r.cfg.PinnedTTL, r.cfg.QueueAckWait)
		return err
	}); err != nil {
		return nil, nil, err
	}
	if err := r.setupStep(ctx, "first announcement", func(ctx context.Context) error {
		return r.live.announce(ctx, queueCons)
	}); err != nil {
		return nil, nil, err
	}
	r.log.Info("node ready", "type", r.cfg.Type, "address", r.cfg.Address, "bindings", r.cache.Len(),
		"resume_at", resume.start(), "replicas", replicas)
	close(r.life.ready)
	return queueCons, stop, nil
}

// setupStep runs fn until it succeeds. A transient failure is retried
// after a capped, jittered exponential backoff and logged (info the first
// time, warn at most every setupLogEvery after); a permanent one returns
// a *SetupError naming the step. When ctx ends it returns ctx's error.
func (r *Router) setupStep(ctx context.Context, step string, fn func(ctx context.Context) error) error {
	b := natsretry.Backoff{Min: setupBackoffMin, Max: setupBackoffMax}
	start := time.Now()
	var logged time.Time
	for attempt := 1; ; attempt++ {
		timeout := setupAttemptMin
		if attempt > setupShortAttempts {
			timeout = setupAttemptMax
		}
		before := r.nc.LastError()
		actx, cancel := context.WithTimeout(ctx, timeout)
		err := fn(actx)
		cancel()
		if err == nil {
			if attempt > 1 {
				r.log.Info("setup step done", "step", step, "attempts", attempt, "waited", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if v := natsretry.Violation(r.nc, before); v != nil {
			// The request was refused, not lost: the server said why.
			err = fmt.Errorf("%w (%w)", v, err)
		}
		if permanent(err) {
			return &SetupError{Step: step, Err: err}
		}
		now := time.Now()
		if attempt == 1 || now.Sub(logged) >= setupLogEvery {
			level, msg := slog.LevelInfo, "waiting for NATS JetStream"
			args := []any{"step", step, "attempt", attempt, "err", err}
			if attempt > 1 {
				level, msg = slog.LevelWarn, "still waiting for NATS JetStream"
				args = append(args, "waited", now.Sub(start).Round(time.Second))
			}
			switch {
			case errors.Is(err, nats.ErrNoResponders):
				args = append(args, "hint", "JetStream did not answer: still starting, or not enabled on the server")
			case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
				args = append(args, "hint", "no answer in time: JetStream may have no meta leader yet")
			}
			r.log.Log(ctx, level, msg, args...)
			logged = now
		}
		if err := natsretry.Sleep(ctx, b.Next()); err != nil {
			return err
		}
	}
}

// permanent reports whether a setup error cannot be fixed by waiting.
func permanent(err error) bool {
	return errors.Is(err, ErrStreamConflict) || errors.Is(err, ErrConfig) || natsretry.Permanent(err)
}

// waitConnected waits until the node's connection is up (the caller may
// hand over a connection made with nats.RetryOnFailedConnect that is
// still trying its servers), logging what it waits for. It returns a
// *SetupError if the connection is closed (the client gave up, e.g. after
// the server refused the credentials twice), or ctx's error.
func (r *Router) waitConnected(ctx context.Context) error {
	if r.nc.IsConnected() {
		return nil
	}
	start := time.Now()
	var logged time.Time
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		switch {
		case r.nc.IsConnected():
			if !logged.IsZero() {
				r.log.Info("connected to NATS", "url", r.nc.ConnectedUrlRedacted(), "waited", time.Since(start).Round(time.Millisecond))
			}
			return nil
		case r.nc.IsClosed():
			cause := r.nc.LastError()
			if cause == nil {
				cause = nats.ErrConnectionClosed
			}
			return &SetupError{Step: "connect", Err: cause}
		}
		if now := time.Now(); logged.IsZero() || now.Sub(logged) >= setupLogEvery {
			args := []any{"servers", redactedServers(r.nc)}
			if err := r.nc.LastError(); err != nil {
				args = append(args, "err", err)
			}
			level := slog.LevelInfo
			if !logged.IsZero() {
				level = slog.LevelWarn
				args = append(args, "waited", now.Sub(start).Round(time.Second))
			}
			r.log.Log(ctx, level, "waiting for NATS", args...)
			logged = now
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// redactedServers lists the connection's server pool without passwords.
func redactedServers(nc *nats.Conn) string {
	list := nc.Servers()
	for i, s := range list {
		if u, err := url.Parse(s); err == nil && u.User != nil {
			list[i] = u.Redacted()
		}
	}
	return strings.Join(list, ",")
}

// waitLoaded waits until ready is closed, logging every setupLogEvery
// what it waits for. It returns false when ctx or failed ends first.
func (r *Router) waitLoaded(ctx context.Context, failed <-chan struct{}, what string, ready <-chan struct{}) bool {
	start := time.Now()
	t := time.NewTicker(setupLogEvery)
	defer t.Stop()
	for {
		select {
		case <-ready:
			return true
		case <-ctx.Done():
			return false
		case <-failed:
			return false
		case <-t.C:
			r.log.Warn("still waiting for NATS JetStream", "step", what, "waited", time.Since(start).Round(time.Second))
		}
	}
}

// newJetStream returns the node's JetStream context, in domain if set.
func newJetStream(nc *nats.Conn, domain string) (jetstream.JetStream, error) {
	if domain != "" {
		return jetstream.NewWithDomain(nc, domain)
	}
	return jetstream.New(nc)
}
