package bench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
)

// wlBurst is the burst workload: a burst of new groups, one message each,
// published by one producer as fast as async publish allows, once with
// short ids and once with long ones, each on a fresh node.
const wlBurst = "burst"

// defaultBurst is the number of new groups of each burst run (--burst).
const defaultBurst = 200_000

// burstIDLens are the group id lengths the burst workload compares: the
// first is the baseline of the others.
var burstIDLens = [...]int{64, 1000}

// burstRun is what one burst run measured.
type burstRun struct {
	idLen     int
	m         measure
	failed    uint64 // failed decision attempts (the node's counter)
	proposals uint64 // proposals the node sent
	logBytes  int64  // bytes the node wrote on stderr while it ran
}

// burstIDs returns the groupFunc of a burst of distinct ids of exactly
// idLen bytes, all starting with prefix (plain characters: the KV key of a
// short one is "r." + id).
func burstIDs(prefix string, idLen int) groupFunc {
	pad := strings.Repeat("x", max(idLen-len(prefix)-10, 0))
	return func(i int) (string, bool) {
		return prefix + pad + fmt.Sprintf("-%09d", i), true
	}
}

// countingWriter counts the bytes written to it and passes on the first
// limit of them (a node that logs a line per failed attempt would
// otherwise flood the bench's own output).
type countingWriter struct {
	mu    sync.Mutex
	w     io.Writer
	limit int64
	n     int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.limit - c.n; room > 0 {
		_, _ = c.w.Write(p[:min(int64(len(p)), room)])
		if int64(len(p)) > room {
			fmt.Fprintf(c.w, "\nbench: (the rest of this node's log is counted, not shown)\n")
		}
	}
	c.n += int64(len(p))
	return len(p), nil
}

func (c *countingWriter) count() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// burstPhase runs the burst workload: for each id length a fresh node
// (so that its peak RSS is the run's own), cfg.Burst new groups.
func (b *bencher) burstPhase(ctx context.Context, e *env, sr *serverResults, profile string) error {
	b.phase("burst of %d new groups, ids of %v bytes", b.cfg.Burst, burstIDLens)
	one := &producer{js: e.prod.js[:1], payload: e.prod.payload}
	for _, idLen := range burstIDLens {
		if err := b.resetRouting(ctx, e); err != nil {
			return err
		}
		logw := &countingWriter{w: b.stderr, limit: 16 << 10}
		args := loneRouterArgs(e)
		if profile != "" {
			args = append(args, "--cpuprofile", profileName(profile, "burst"+strconv.Itoa(idLen)),
				"--memprofile", profileName(profile, "burst"+strconv.Itoa(idLen)+"-heap"))
		}
		k, err := startChild(b.prefix, args, "router n0 (burst)", logw)
		if err != nil {
			return err
		}
		run := func() (burstRun, error) {
			if _, err := k.next(ctx, "ready", 60*time.Second); err != nil {
				return burstRun{}, err
			}
			if err := e.sink.consume(ctx, "n0"); err != nil {
				return burstRun{}, err
			}
			if err := waitRegistry(ctx, e.js, []string{"n0"}, 1, 20*time.Second); err != nil {
				return burstRun{}, err
			}
			before, err := k.stats(ctx)
			if err != nil {
				return burstRun{}, err
			}
			logBefore := logw.count()
			pref := "burst-" + strconv.Itoa(idLen) + "-"
			saved := e.prod
			e.prod = one
			m, err := b.measureRun(ctx, e, []*child{k}, runSpec{label: fmt.Sprintf("burst %d-byte ids", idLen), n: b.cfg.Burst,
				groupPrefix: pref, groups: burstIDs(pref, idLen), newGroups: b.cfg.Burst})
			e.prod = saved
			if err != nil {
				return burstRun{}, err
			}
			after, err := k.stats(ctx)
			if err != nil {
				return burstRun{}, err
			}
			return burstRun{idLen: idLen, m: m, failed: after.DecisionErrors - before.DecisionErrors,
				proposals: after.Proposals - before.Proposals, logBytes: logw.count() - logBefore}, nil
		}
		br, runErr := run()
		stopErr := b.stopAll([]*child{k})
		if runErr != nil {
			return runErr
		}
		if stopErr != nil {
			return stopErr
		}
		b.logf("burst %d-byte ids: %d groups routed in %.2fs, %d failed attempts of %d proposals, log %d bytes, peak RSS %.1f MiB",
			idLen, br.m.N, br.m.Elapsed.Seconds(), br.failed, br.proposals, br.logBytes, mib(float64(br.m.RSS)))
		sr.burst = append(sr.burst, br)
	}
	return nil
}

// burstRows turns the burst runs into rows: each length against the first
// (the short ids) and against the same run's watched KV creates.
func (sr *serverResults) burstRows(rb *rowBuilder) {
	if len(sr.burst) == 0 {
		return
	}
	base := sr.burst[0]
	for _, br := range sr.burst {
		tag := fmt.Sprintf("%d-byte ids", br.idLen)
		m := br.m
		r := rb.add(wlBurst, 1, tag+": all routed after", m.Elapsed.Seconds(), unitSec).noise(m.Foreign)
		if br.idLen != base.idLen {
			r.vs(fmt.Sprintf("%d-byte ids", base.idLen), base.m.Elapsed.Seconds()).noise(base.m.Foreign)
			atMost(r, 1.5)
		}
		rate := 0.0
		if m.Elapsed > 0 {
			rate = float64(m.N) / m.Elapsed.Seconds()
		}
		if sr.kvWatched.V > 0 {
			rb.add(wlBurst, 1, tag+": new groups routed/s vs watched KV creates", rate, unitDecisions).noise(m.Foreign).
				vs("kv-watched", sr.kvWatched.V).noise(sr.kvWatched.Foreign)
		}
		pct := 0.0
		if m.N > 0 {
			pct = 100 * float64(br.failed) / float64(m.N)
		}
		r = rb.add(wlBurst, 1, tag+": failed attempts per new group ("+strconv.FormatUint(br.failed, 10)+")", pct, unitPercent)
		r.Target = "< 1 %"
		ok := pct < 1
		r.Met = &ok
		r = rb.add(wlBurst, 1, tag+": node log written", float64(br.logBytes)/1024, unitKiB)
		r.Target = "< 1 MB"
		small := br.logBytes < 1_000_000
		r.Met = &small
		r = rb.add(wlBurst, 1, tag+": node peak RSS", mib(float64(m.RSS)), unitMiB).noise(m.Foreign)
		if br.idLen != base.idLen {
			r.vs(fmt.Sprintf("%d-byte ids", base.idLen), mib(float64(base.m.RSS)))
			atMost(r, 1.5)
		}
	}
}

// unitKiB: kibibytes (the node's log).
const unitKiB = "KiB"

// atMost sets a target of at most x times the baseline.
func atMost(r *Row, x float64) *Row {
	r.Target = "<= " + strconv.FormatFloat(x, 'f', -1, 64) + "x"
	met := r.Ratio <= x
	r.Met = &met
	return r
}
