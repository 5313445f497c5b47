package router

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/scripttest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// TestEngineScripts drives the lane engine with the scripts under
// testdata/engine (package scripttest: commands, "----", what they gave).
// Every command that hands the engine an input prints the actions the
// engine asks of its shells, one a line. Commands:
//
//	engine node=n1        a new engine of node n1 (live: n1 and n2, each with a consumer)
//	live n1+ n2           the live nodes (+: has a queue consumer)
//	record G none         group G has no record
//	record G STATE k=v... G's record: node, prev, from, through, step, drain (a,b), rev, epoch
//	ingest G SEQ...       messages of G at those ingress sequences, read
//	changed G             G's record changed (as the cache tells)
//	asks                  the asks due, one a line
//	reply G OUTCOME rev=N the handler's answer for G to the last asks
//	ack G SEQ [qseq=N]    the queue stored G's message SEQ (published before)
//	alive until=D         the liveness record surely exists until D after the start
//	tick                  the timers fire (what is due runs)
//	resume next=N pending=A-B  the checkpoint the node resumes from
//	position              the first ingress sequence not yet resolved
//	takeover-from G       where a takeover of G starts routing from
//	lanes                 the groups with a lane
//
// Any command takes after=D: it happens D (a duration) after the start.
// Run with -rewrite to regenerate the outputs.
func TestEngineScripts(t *testing.T) {
	scripttest.RunDir(t, "testdata/engine", func() func(string) ([]string, error) { return (&engineScript{}).run })
}

// engineScript is what a script has set up so far.
type engineScript struct {
	e    *engine
	recs mapRecords
	// asks: the last asks printed; pubs: the publishes printed and not
	// acknowledged yet, by group and sequence.
	asks []sentAsk
	pubs map[string]action
}

func (s *engineScript) run(cmd string) ([]string, error) {
	name, bare, kv := scripttest.Fields(cmd)
	num := func(k string) uint64 {
		n, _ := strconv.ParseUint(kv[k], 10, 64)
		return n
	}
	if name != "engine" && s.e == nil {
		return nil, fmt.Errorf("no engine yet (engine node=N)")
	}
	now := testNow
	if d, err := time.ParseDuration(kv["after"]); err == nil {
		now = now.Add(d)
	}
	switch name {
	case "engine":
		s.recs, s.pubs = mapRecords{}, map[string]action{}
		s.e = newTestEngine(kv["node"], s.recs)
		return nil, nil
	case "live":
		live := map[string]proposals.NodeState{}
		for _, a := range bare {
			id, has := strings.CutSuffix(a, "+")
			live[id] = proposals.NodeState{HasConsumer: has}
		}
		s.e.step(inLive{state: live}, now)
		return s.actions(), nil
	case "record":
		if len(bare) < 2 {
			return nil, fmt.Errorf("record GROUP STATE|none k=v...")
		}
		if bare[1] == "none" {
			delete(s.recs, bare[0])
			return nil, nil
		}
		b := kvbinding.Binding{Group: bare[0], State: kvbinding.State(bare[1]), Node: kv["node"], PrevNode: kv["prev"],
			FromSeq: num("from"), ThroughSeq: num("through"), Step: kvbinding.Step(kv["step"]), Revision: num("rev"), Epoch: num("epoch")}
		if d := kv["drain"]; d != "" {
			b.Drain = strings.Split(d, ",")
		}
		s.recs[bare[0]] = b
		return nil, nil
	case "ingest":
		for _, a := range bare[1:] {
			seq, err := strconv.ParseUint(a, 10, 64)
			if err != nil {
				return nil, err
			}
			s.e.step(inMsg{group: bare[0], m: &msgRec{seq: seq}}, now)
		}
		return s.actions(), nil
	case "changed":
		s.e.step(inChanged{refs: []string{bare[0]}}, now)
		return s.actions(), nil
	case "asks":
		s.asks = s.e.askBatch(10, now)
		var out []string
		for _, a := range s.asks {
			op := a.p.Op
			if op == "" {
				op = proposals.OpBind
			}
			line := fmt.Sprintf("ask %s %s seq=%d", op, a.p.Group, a.p.Seq)
			if a.p.Node != "" {
				line += " node=" + a.p.Node
			}
			if a.p.Rev != 0 {
				line += fmt.Sprintf(" rev=%d", a.p.Rev)
			}
			out = append(out, line)
		}
		if len(out) == 0 {
			out = []string{"no ask"}
		}
		return out, nil
	case "reply":
		if len(bare) < 2 {
			return nil, fmt.Errorf("reply GROUP OUTCOME rev=N")
		}
		var ds []proposals.Decision
		for _, a := range s.asks {
			if a.p.Group == bare[0] {
				ds = append(ds, proposals.Decision{Group: bare[0], Outcome: proposals.Outcome(bare[1]), Revision: num("rev")})
			}
		}
		if len(ds) == 0 {
			return nil, fmt.Errorf("no ask of %s to reply to", bare[0])
		}
		s.e.step(inReplied{batch: s.asks, ds: ds}, now)
		return s.actions(), nil
	case "ack":
		key := bare[0] + "/" + bare[1]
		a, ok := s.pubs[key]
		if !ok {
			return nil, fmt.Errorf("no publish of %s printed", key)
		}
		delete(s.pubs, key)
		o := a.outcome()
		o.seq = num("qseq")
		s.e.step(inOutcomes{batch: []outcome{o}}, now)
		return s.actions(), nil
	case "alive":
		d, err := time.ParseDuration(kv["until"])
		if err != nil {
			return nil, fmt.Errorf("alive until=DURATION: %v", err)
		}
		s.e.step(inAlive{until: testNow.Add(d)}, now)
		return s.actions(), nil
	case "tick":
		s.e.step(inTick{}, now)
		return s.actions(), nil
	case "resume":
		c := kvbinding.Checkpoint{Next: num("next")}
		if p := kv["pending"]; p != "" {
			lo, hi, _ := strings.Cut(p, "-")
			a, _ := strconv.ParseUint(lo, 10, 64)
			b, _ := strconv.ParseUint(hi, 10, 64)
			c.Pending = [][2]uint64{{a, b}}
		}
		s.e.step(inBegin{resume: resumePoint{ckpt: c}}, now)
		return nil, nil
	case "position":
		return []string{"position " + strconv.FormatUint(s.e.position(), 10)}, nil
	case "takeover-from":
		return []string{"takeover from " + strconv.FormatUint(s.e.takeoverFrom(bare[0]), 10)}, nil
	case "lanes":
		var gs []string
		for g := range s.e.lanes {
			gs = append(gs, g)
		}
		sort.Strings(gs)
		if len(gs) == 0 {
			return []string{"no lane"}, nil
		}
		return []string{"lanes " + strings.Join(gs, " ")}, nil
	}
	return nil, fmt.Errorf("unknown command %q", name)
}

// actions takes the engine's actions and writes one line each;
// publishes are kept for ack.
func (s *engineScript) actions() []string {
	var out []string
	for _, a := range s.e.take() {
		group := a.group
		var line string
		switch a.kind {
		case actPublish:
			s.pubs[group+"/"+strconv.FormatUint(a.msg.seq, 10)] = a
			line = fmt.Sprintf("publish %s seq=%d node=%s", group, a.msg.seq, a.node)
			if len(a.epoch) == 1 {
				line += " epoch=" + a.epoch[0]
			}
			if a.held {
				line += " held"
			}
			if a.dlq {
				line += fmt.Sprintf(" dead-letter %q", a.reason)
			}
		case actBatch:
			seqs := make([]string, len(a.batch))
			for i, m := range a.batch {
				seqs[i] = strconv.FormatUint(m.seq, 10)
			}
			line = fmt.Sprintf("batch %s seqs=%s node=%s", group, strings.Join(seqs, ","), a.node)
		case actAsk:
			line = "wake the asker"
		case actDuty:
			line = fmt.Sprintf("duty %s %s rev=%d", group, dutyNames[a.duty], a.rev)
		case actRetry:
			line = fmt.Sprintf("due in %v", a.at.Sub(testNow))
		case actFailure:
			line = "failure " + group
		case actDeadLettered:
			line = fmt.Sprintf("dead-lettered %s count=%d", group, a.count)
		case actDecided:
			line = "decided " + group
		case actWindow:
			line = fmt.Sprintf("window %d", a.count)
		case actHold:
			line = fmt.Sprintf("hold %s on=%v count=%d", group, a.on, a.count)
		case actFairWake:
			line = "wake the fair shell"
		default:
			line = fmt.Sprintf("action %d", a.kind)
		}
		out = append(out, line)
	}
	return out
}

var dutyNames = map[proposals.Duty]string{proposals.DutyNone: "none", proposals.DutyFence: "fence", proposals.DutyDrain: "drain",
	proposals.DutyCatchUp: "catchup"}
