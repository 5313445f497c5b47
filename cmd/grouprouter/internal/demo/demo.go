package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/grouprouter/grouprouter/internal/localnats"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// ErrConfig is wrapped by the errors of Config.Validate.
var ErrConfig = errors.New("demo: invalid configuration")

// Defaults of Config.
const (
	DefaultDuration = 30 * time.Second
	DefaultGroups   = 200
	DefaultRate     = 200
)

// Config is what to run.
type Config struct {
	// Duration is how long the producers publish. Default 30s.
	Duration time.Duration
	// Groups is how many groups the messages are spread over. Default 200.
	Groups int
	// Rate is how many messages a second the producers publish together.
	// Default 200.
	Rate float64
	// NoKill runs without losing node n2.
	NoKill bool
	// Out receives the live view and the summary.
	Out io.Writer
	// Terminal says Out is a terminal: the live view is redrawn in place.
	// Otherwise it is printed as plain lines.
	Terminal bool
	// Logger receives the nodes' logs. Default: discarded.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Groups == 0 {
		c.Groups = DefaultGroups
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks the configuration as given (Run fills zero fields with
// the defaults first); errors wrap ErrConfig.
func (c Config) Validate() error {
	switch {
	case c.Duration < 2*time.Second:
		return fmt.Errorf("%w: --duration must be at least 2s, got %v", ErrConfig, c.Duration)
	case c.Groups < 1 || c.Groups > 100_000:
		return fmt.Errorf("%w: --groups must be 1 to 100000, got %d", ErrConfig, c.Groups)
	case c.Rate < 1 || c.Rate > 100_000:
		return fmt.Errorf("%w: --rate must be 1 to 100000 messages a second, got %g", ErrConfig, c.Rate)
	}
	return nil
}

const (
	refresh = 500 * time.Millisecond
	// settleTimeout bounds the wait, after the producers stopped, for the
	// last messages and hand-overs.
	settleTimeout = 60 * time.Second
	// backAfter: n2 comes back this share of the duration in (and not
	// before its groups moved).
	backAfter = 0.7
)

// Scenario states.
type state int

const (
	stSteady     state = iota // before the kill
	stKilled                  // n2 is down; its groups wait, then move
	stRestarting              // n2 is starting again
	stBack                    // n2 runs again, with no groups yet
	stDone                    // nothing more happens to the nodes
)

// run is one demo run.
type run struct {
	cfg    Config
	c      *localnats.Cluster
	nodes  []*node
	groups []string
	l      *ledger
	w      *watcher
	v      *view
	prod   *producers
	start  time.Time

	st         state
	producing  bool
	killAt     time.Time
	killed     int // groups n2 had when killed
	movedAt    time.Time
	restarted  chan error
	backAt     time.Time // n2 eligible again: rebalancing gives it groups
	backBefore int       // rebalance moves to n2 before it was started again
	// n3 joins a quarter of the way in, with its consumer: rebalancing
	// gives it its share.
	joining  chan joinResult
	joinedAt time.Time
	joinCons *queueConsumer
	ended    string // why the run ended ("": it goes on)

	// rates
	lastAt                time.Time
	lastPub, lastProc     int
	lastByNode            map[string]int
	pubRate, procRate     float64
	nodeRate              map[string]float64
	maxHeld, maxUnsettled int
}

type joinResult struct {
	cons *queueConsumer
	err  error
}

// joinAfter: n3 joins this share of the duration in.
const joinAfter = 0.25

// Run runs the demo: a 3-server JetStream cluster on loopback in this
// process (stores in a temporary directory removed at the end), three
// router nodes (n0 LOCAL on S1, n1 LOCAL backup on S2, n2 REMOTE on S3),
// producers publishing numbered messages over the groups at a steady rate
// and a consumer per node acking; halfway n2 is killed (its connection
// closed, its Run cancelled) and later started again, and groups are moved
// back to it. It shows a live view on cfg.Out and returns the summary once
// the producers stopped and every message was processed (or a minute
// passed). The summary says whether every message arrived exactly once and
// in order per group (Summary.OK). Run returns an error when the demo
// could not be set up, or ctx.Err() when ctx ended first.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return Summary{}, err
	}
	d := &run{cfg: cfg, v: &view{w: cfg.Out, terminal: cfg.Terminal}}
	d.v.title = fmt.Sprintf("grouprouter demo: 3 servers, 3 nodes, %d groups, %.0f msgs/s", cfg.Groups, cfg.Rate)
	d.v.duration = cfg.Duration
	defer d.v.finish()
	return d.run(ctx)
}

func (d *run) say(format string, args ...any) {
	fmt.Fprintf(d.cfg.Out, format+"\n", args...)
}

func (d *run) run(ctx context.Context) (Summary, error) {
	dir, err := os.MkdirTemp("", "grouprouter-demo-")
	if err != nil {
		return Summary{}, err
	}
	defer os.RemoveAll(dir)

	t0 := time.Now()
	d.say("Starting 3 NATS servers (a JetStream cluster on 127.0.0.1, random ports, stores in %s)...", dir)
	if d.c, err = localnats.Start(ctx, dir, "demo", 3); err != nil {
		return Summary{}, fmt.Errorf("demo: %w", err)
	}
	defer d.c.Close()
	tServers := time.Now()
	log := d.cfg.Logger
	d.nodes = []*node{
		newNode("n0", router.Local, 0, log),  // the active LOCAL handler
		newNode("n1", router.Local, 1, log),  // its hot backup
		newNode("n2", router.Remote, 2, log), // killed halfway
		newNode("n3", router.Remote, 0, log), // joins a quarter of the way in
	}
	defer func() {
		for _, n := range d.nodes {
			n.stop()
		}
	}()
	d.say("Starting nodes n0 (LOCAL, on S1), n1 (LOCAL backup, on S2), n2 (REMOTE, on S3); n3 (REMOTE, on S1) joins later...")
	for _, n := range d.nodes[:3] { // n0 first: a LOCAL node creates the streams and buckets
		if err := n.start(ctx, d.c); err != nil {
			return Summary{}, err
		}
	}
	tNodes := time.Now()
	if d.w, err = startWatcher(ctx, d.c); err != nil {
		return Summary{}, err
	}
	defer d.w.close()
	d.groups = make([]string, d.cfg.Groups)
	width := len(fmt.Sprint(d.cfg.Groups - 1))
	for i := range d.groups {
		d.groups[i] = fmt.Sprintf("g%0*d", max(width, 3), i)
	}
	d.l = newLedger(d.groups)
	for _, n := range d.nodes[:3] {
		cons, err := startConsumer(ctx, d.c, n, d.l)
		if err != nil {
			return Summary{}, err
		}
		defer cons.stop()
	}
	defer func() {
		if d.joinCons != nil {
			d.joinCons.stop()
		}
	}()
	tConsumers := time.Now()
	if err := d.waitEligible(ctx, d.nodes[:3]); err != nil {
		return Summary{}, err
	}
	round := func(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }
	d.say("Ready in %v (servers %v, nodes %v, consumers %v, eligible %v): every node routes and its queue has a consumer. Producers start.",
		round(time.Since(t0)), round(tServers.Sub(t0)), round(tNodes.Sub(tServers)), round(tConsumers.Sub(tNodes)), round(time.Since(tConsumers)))
	d.say("")

	d.start = time.Now()
	if d.prod, err = startProducers(d.c, d.groups, d.cfg.Rate, d.l); err != nil {
		return Summary{}, err
	}
	defer d.prod.halt()
	d.producing = true
	d.lastAt, d.lastByNode = d.start, map[string]int{}
	if d.cfg.NoKill {
		d.st = stDone
	}
	// The join and the restart run in goroutines of their own (the view
	// goes on meanwhile); they end before the nodes are stopped.
	gctx, stopSteps := context.WithCancel(ctx)
	defer func() {
		stopSteps()
		if d.restarted != nil {
			<-d.restarted
		}
		if d.joining != nil {
			if r := <-d.joining; r.cons != nil {
				d.joinCons = r.cons
			}
		}
	}()
	tick := time.NewTicker(refresh)
	defer tick.Stop()
	var settleBy time.Time
	for {
		now := time.Now()
		if d.producing && now.Sub(d.start) >= d.cfg.Duration {
			d.prod.halt()
			d.producing = false
			settleBy = time.Now().Add(settleTimeout)
		}
		d.step(gctx, now)
		if !d.producing && d.st == stDone && !d.joinedAt.IsZero() && d.rebalancedBack(now) && d.l.outstanding() == 0 && len(d.w.cache.Unsettled()) == 0 {
			d.ended = "done: every message published was processed"
		}
		if !d.producing && d.ended == "" && time.Now().After(settleBy) {
			d.ended = fmt.Sprintf("gave up waiting after %v: messages or hand-overs are still outstanding", settleTimeout)
		}
		d.v.draw(d.frame(ctx))
		if d.ended != "" {
			break
		}
		select {
		case <-ctx.Done():
			return Summary{}, ctx.Err()
		case <-tick.C:
		case err := <-d.restarted:
			d.restarted = nil
			if err != nil {
				return Summary{}, fmt.Errorf("demo: restarting n2: %w", err)
			}
			d.st = stBack
		case r := <-d.joining:
			d.joining = nil
			if r.err != nil {
				return Summary{}, fmt.Errorf("demo: starting n3: %w", r.err)
			}
			d.joinCons, d.joinedAt = r.cons, time.Now()
		}
	}
	return d.summary(), nil
}

// step moves the scenario on: the kill halfway, the restart once the
// killed node's groups flow again (and not before backAfter of the
// duration), the rebalance once it is eligible again.
func (d *run) step(ctx context.Context, now time.Time) {
	if n3 := d.nodes[3]; d.joining == nil && d.joinedAt.IsZero() && now.Sub(d.start) >= time.Duration(joinAfter*float64(d.cfg.Duration)) {
		d.joining = make(chan joinResult, 1)
		go func() {
			if err := n3.start(ctx, d.c); err != nil {
				d.joining <- joinResult{err: err}
				return
			}
			cons, err := startConsumer(ctx, d.c, n3, d.l)
			d.joining <- joinResult{cons: cons, err: err}
		}()
	}
	n2 := d.nodes[2]
	switch d.st {
	case stSteady:
		if now.Sub(d.start) >= d.cfg.Duration/2 {
			groups := d.w.cache.RefsOf(n2.id) // the demo's ids are short: each ref is the id
			d.killAt, d.killed = now, len(groups)
			d.l.markKill(now, groups)
			n2.kill()
			d.st = stKilled
		}
	case stKilled:
		if d.movedAt.IsZero() && len(d.w.cache.RefsOf(n2.id)) == 0 {
			d.movedAt = now
		}
		if _, waiting := d.l.flowAgain(); waiting > 0 && now.Sub(d.killAt) < time.Minute {
			return
		}
		if d.movedAt.IsZero() || now.Sub(d.start) < time.Duration(backAfter*float64(d.cfg.Duration)) {
			return
		}
		d.st = stRestarting
		// Counted before n2 starts again: the handler may give it groups
		// before this view finds it eligible.
		d.backBefore = d.w.rebalanced(n2.id)
		d.restarted = make(chan error, 1)
		go func() { d.restarted <- n2.start(ctx, d.c) }()
	case stBack:
		if !d.eligible(ctx, n2.id) {
			return
		}
		// From here the handler's rebalancing gives n2 groups back:
		// nothing to ask.
		d.backAt = now
		d.st = stDone
	}
}

// rebalancedBack reports whether n2, back after its kill, has been given
// groups by rebalancing (or waited long enough for them: rebalanceWait).
func (d *run) rebalancedBack(now time.Time) bool {
	if d.backAt.IsZero() {
		return d.killAt.IsZero() // no kill, nothing to wait for
	}
	return d.w.rebalanced("n2") > d.backBefore || now.Sub(d.backAt) > rebalanceWait
}

// rebalanceWait bounds the wait, at the end, for rebalancing to give n2
// groups again.
const rebalanceWait = 15 * time.Second

// waitEligible waits until the active handler's node sees every node live
// with a queue consumer.
func (d *run) waitEligible(ctx context.Context, nodes []*node) error {
	deadline := time.Now().Add(nodeReady)
	for {
		ok := true
		for _, n := range nodes {
			if !d.eligible(ctx, n.id) {
				ok = false
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: the nodes are not all live with a consumer after %v", nodeReady)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// eligible reports whether n0 sees node live with a queue consumer.
func (d *run) eligible(ctx context.Context, node string) bool {
	for _, n := range d.status(ctx).Nodes {
		if n.Node == node {
			return n.Live && n.HasConsumer
		}
	}
	return false
}

// status is n0's view of the cluster (n0 is never killed).
func (d *run) status(ctx context.Context) router.Status {
	r := d.nodes[0].router()
	if r == nil {
		return router.Status{}
	}
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return r.Status(sctx)
}

// frame gathers what the view shows now.
func (d *run) frame(ctx context.Context) frame {
	now := time.Now()
	pub, proc, byNode := d.l.counts()
	if dt := now.Sub(d.lastAt).Seconds(); dt >= 1 {
		d.pubRate, d.procRate = float64(pub-d.lastPub)/dt, float64(proc-d.lastProc)/dt
		d.nodeRate = map[string]float64{}
		for id, n := range byNode {
			d.nodeRate[id] = float64(n-d.lastByNode[id]) / dt
		}
		d.lastAt, d.lastPub, d.lastProc, d.lastByNode = now, pub, proc, byNode
	}
	kinds, fresh, progress := d.w.events()
	st := d.status(ctx)
	counts := d.w.cache.Counts()
	f := frame{
		elapsed: now.Sub(d.start), phase: d.phase(now),
		published: pub, processed: proc, pubRate: d.pubRate, procRate: d.procRate,
		moves: kinds[proposals.EventMove], handoffs: kinds[proposals.EventHandoff], timeouts: kinds[proposals.EventTimeout],
		unsettled: d.w.unsettled(), progress: progress, fresh: fresh,
	}
	unsettled := 0
	for _, n := range f.unsettled {
		unsettled += n
	}
	d.maxUnsettled = max(d.maxUnsettled, unsettled)
	for _, n := range d.nodes {
		row := nodeRow{id: n.id, typ: string(n.typ), server: fmt.Sprintf("S%d", n.server+1), state: "up",
			groups: counts[n.id], held: -1, queue: -1, procRate: d.nodeRate[n.id]}
		switch {
		case n.isKilled():
			row.state = "killed"
		case n.id == "n3" && d.joining == nil && d.joinedAt.IsZero():
			row.state = fmt.Sprintf("joins at %.1fs", (time.Duration(joinAfter * float64(d.cfg.Duration))).Seconds())
		case n.router() == nil:
			row.state = "starting"
		}
		for _, s := range st.Nodes {
			if s.Node != n.id || !s.Live || row.state != "up" {
				continue
			}
			row.role, row.held, row.queue = s.Role, s.Held, int(s.QueuePending)
			d.maxHeld = max(d.maxHeld, s.Held)
		}
		f.nodes = append(f.nodes, row)
	}
	return f
}

// phase says in a line what is going on.
func (d *run) phase(now time.Time) string {
	s := ""
	switch d.st {
	case stSteady:
		s = fmt.Sprintf("steady: every message goes to its group's node's queue, in order; n2 is killed at %.1fs", (d.cfg.Duration / 2).Seconds())
	case stKilled:
		took, waiting := d.l.flowAgain()
		switch {
		case waiting == 0 && len(took) > 0:
			s = fmt.Sprintf("n2's %d groups flow again on n0 and n1 (the last %.1fs after the kill); n2 comes back next", d.killed, took[len(took)-1].Seconds())
		case now.Sub(d.killAt) < nodeGrace:
			s = fmt.Sprintf("n2 was killed (connection closed, nothing released): its %d groups wait, in order, for the node grace (%v)", d.killed, nodeGrace)
		default:
			s = fmt.Sprintf("n2 is gone: its %d groups move to n0 and n1, which drain its queue and catch up from its checkpoint", d.killed)
		}
	case stRestarting:
		s = "n2 starts again"
	case stBack:
		s = "n2 is back, with no groups (they moved); the handler waits for its queue consumer"
	case stDone:
		s = "steady"
		if back := d.w.rebalanced("n2") - d.backBefore; !d.backAt.IsZero() {
			s = fmt.Sprintf("n2 is back: rebalancing has moved %d groups to it, idle ones first, each with its waiting messages, in order", back)
		}
	}
	if !d.joinedAt.IsZero() && now.Sub(d.joinedAt) < 3*time.Second {
		s += fmt.Sprintf(". n3 joined: rebalancing moves groups to it (%d so far), a few at a time, idle ones first", d.w.rebalanced("n3"))
	}
	switch {
	case d.ended != "":
		s = d.ended
	case !d.producing:
		s = "producers stopped; waiting for the last messages and hand-overs. " + s
	}
	return s
}

// pause waits for d and reports whether ctx is still going.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
