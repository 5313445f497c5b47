package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// liveRecord reads node's liveness record straight from the bucket.
func liveRecord(js jetstream.JetStream, node string) (kvbinding.NodeInfo, uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, kvbinding.DefaultNodesBucket)
	if err != nil {
		return kvbinding.NodeInfo{}, 0, err
	}
	e, err := kv.Get(ctx, kvbinding.LiveKey(node))
	if err != nil {
		return kvbinding.NodeInfo{}, 0, err
	}
	var info kvbinding.NodeInfo
	if err := json.Unmarshal(e.Value(), &info); err != nil {
		return kvbinding.NodeInfo{}, 0, err
	}
	return info, e.Revision(), nil
}

// A node killed (a crash: no checkpoint saved, no liveness record
// withdrawn, no lease released) and started again at once, while its old
// liveness record is still there, is not taken for a second process: it
// routes again (the target, within 5 s of its restart, is logged,
// not asserted: a loaded machine stretches any wall-clock figure), with
// the default heartbeat (the old record lives 3 s).
func TestNodeRestartAfterCrashRoutesAgain(t *testing.T) {
	t.Parallel() // see doc.go
	c := natstest.RunCluster(t, 3)
	cfg := testConfig("n1", router.Local)
	cfg.Heartbeat = router.DefaultHeartbeat
	cfg.LeaseTTL = router.DefaultLeaseTTL
	n1 := startNode(t, c.Servers[0].URL(), cfg)
	var col collector
	startConsumer(t, c.Servers[1].URL(), "n1", &col)
	js := jetStream(t, c.Servers[2].URL())
	publish(t, js, "jms.orders", "g1", "before")
	col.waitGroup(t, "g1", 1, 20*time.Second)
	old, _, err := liveRecord(js, "n1")
	if err != nil {
		t.Fatal(err)
	}

	n1.kill()
	// The crashed process's record outlives it: the restart finds it.
	if info, _, err := liveRecord(js, "n1"); err != nil || info.Instance != old.Instance {
		t.Fatalf("the crashed node's liveness record is gone already (%v, %+v): the test would not check a restart over it", err, info)
	}
	restarted := time.Now()
	n1.launch()
	publish(t, js, "jms.orders", "g1", "after")
	publish(t, js, "jms.orders", "g2", "new")
	natstest.Eventually(t, 30*time.Second, func() error {
		select {
		case err := <-n1.done:
			t.Fatalf("restarted node stopped: %v", err)
		default:
		}
		if n := len(col.all()); n < 3 {
			return fmt.Errorf("%d of 3 messages delivered", n)
		}
		return nil
	})
	t.Logf("routing again %v after the restart (old record's TTL %v)", time.Since(restarted).Round(time.Millisecond), 3*cfg.Heartbeat)
	info, _, err := liveRecord(js, "n1")
	if err != nil || info.Instance == old.Instance || info.Instance == "" {
		t.Errorf("liveness record after the restart: %+v, %v (old instance %s)", info, err, old.Instance)
	}
	checkGrouping(t, col.all(), map[string][]string{"g1": {"before", "after"}, "g2": {"new"}})
}

// A node started over the record of a crashed predecessor that its
// registry still holds after the start-up check found it not renewed
// within its TTL (here it never expires; a real one expires a moment
// later on one server than another) keeps running and routes: a record the
// check found gone is not another process. Before, the node stopped at
// once ("another process that started earlier runs this node id"): the
// restarted node of TestArtemis12BackupHandlerTakesOver did so in 1 of 20
// runs under load, and its groups' messages waited (43 of 47 delivered).
func TestNodeStartsOverACrashedPredecessorsRecord(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	js := jetStream(t, s.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := kvbinding.OpenRegistry(ctx, js, kvbinding.RegistryConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	crashed := kvbinding.NodeInfo{Node: "n1", Instance: "crashed", Host: "vm", PID: 1, Type: "LOCAL",
		Started: now.Add(-time.Minute), Heartbeat: now, Every: 100 * time.Millisecond}
	if err := reg.Announce(ctx, crashed, time.Hour); err != nil {
		t.Fatal(err)
	}
	n1 := startNode(t, s.URL(), testConfig("n1", router.Local))
	var col collector
	startConsumer(t, s.URL(), "n1", &col)
	publish(t, js, "jms.orders", "g", "m1")
	col.waitCount(t, 1, 20*time.Second)
	select {
	case err := <-n1.done:
		n1.cancel = nil
		t.Fatalf("the node stopped: %v", err)
	default:
	}
}

// Two processes started at the same moment under one node id: both may
// find the id free, but exactly one keeps it (the other is refused at
// start, or, if both announced, the later starter stops); the one that
// stays routes and announces alone.
func TestDuplicateNodeIDStartedTogether(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	// Streams and buckets first, so that both start the same way.
	startNode(t, s.URL(), testConfig("n0", router.Local))
	a := &node{t: t, id: "n1", cfg: testConfig("n1", router.Remote), url: s.URL()}
	b := &node{t: t, id: "n1", cfg: testConfig("n1", router.Remote), url: s.URL()}
	a.launch()
	b.launch()

	var lost, kept *node
	var lostErr error
	natstest.Eventually(t, 20*time.Second, func() error {
		select {
		case lostErr = <-a.done:
			lost, kept = a, b
		case lostErr = <-b.done:
			lost, kept = b, a
		default:
			return errors.New("both processes still run under n1")
		}
		return nil
	})
	lost.cancel()
	lost.cancel = nil // Run returned; nothing to stop
	lost.nc.Close()
	var inUse *router.NodeIDInUseError
	if !errors.As(lostErr, &inUse) || inUse.Node != "n1" {
		t.Fatalf("the stopped process returned %v, want a *NodeIDInUseError for n1", lostErr)
	}
	t.Logf("one process gave n1 up: %v", lostErr)

	// The other keeps running, announcing alone, and routes.
	js := jetStream(t, s.URL())
	var first kvbinding.NodeInfo
	var firstRev uint64
	natstest.Eventually(t, 10*time.Second, func() error {
		info, rev, err := liveRecord(js, "n1")
		if err != nil {
			return err
		}
		if first.Instance == "" {
			first, firstRev = info, rev
		}
		if info.Instance != first.Instance {
			first, firstRev = info, rev // the loser's last announcement was read: start again
			return fmt.Errorf("liveness record changed hands to %s", info.Instance)
		}
		if rev < firstRev+5 {
			return fmt.Errorf("liveness record at revision %d, waiting for 5 renewals past %d", rev, firstRev)
		}
		return nil
	})
	if inUse.Other.Instance != "" && inUse.Other.Instance != first.Instance {
		t.Errorf("the loser named instance %s, but %s runs n1", inUse.Other.Instance, first.Instance)
	}
	select {
	case err := <-kept.done:
		t.Fatalf("the other process stopped too: %v", err)
	default:
	}
	var col collector
	startConsumer(t, s.URL(), "n1", &col)
	waitEligible(t, s.Connect(), []string{"n0", "n1"}, []string{"n1"})
	publish(t, js, "jms.orders", "g", "m1", "m2")
	checkGrouping(t, col.waitCount(t, 2, 20*time.Second), map[string][]string{"g": {"m1", "m2"}})
}

// The liveness record is input: a value that is not a node's JSON, or one
// naming another node, under a node's key neither crashes nor holds back
// the start-up check: the node starts and announces over it.
func TestNodeStartsOverForeignLiveRecord(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	js := jetStream(t, s.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kvbinding.OpenRegistry(ctx, js, kvbinding.RegistryConfig{}, nil); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, kvbinding.DefaultNodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range []string{"\x00\xffnot json", `{"node":"intruder","instance":"x","every":3600000000000}`} {
		id := fmt.Sprintf("n%d", i+1)
		if _, err := kv.Put(ctx, kvbinding.LiveKey(id), []byte(v)); err != nil {
			t.Fatal(err)
		}
		n := startNode(t, s.URL(), testConfig(id, router.Local))
		natstest.Eventually(t, 10*time.Second, func() error {
			info, _, err := liveRecord(js, id)
			if err != nil {
				return err
			}
			if info.Node != id || info.Instance == "" {
				return fmt.Errorf("record of %s: %+v", id, info)
			}
			return nil
		})
		n.stop()
	}
}
