package proposals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/grouprouter/grouprouter/internal/natstest"
)

// discover sends a micro discovery request for ServiceName ($SRV.<verb>.
// grouprouter) and returns the replies that came within a short wait, at
// most want of them (it stops waiting once it has want).
func discover(t *testing.T, nc *nats.Conn, verb micro.Verb, want int) [][]byte {
	t.Helper()
	subject, err := micro.ControlSubject(verb, ServiceName, "")
	if err != nil {
		t.Fatal(err)
	}
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	deadline := time.Now().Add(time.Second)
	for len(out) < want {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			break // no more replies within the wait: the caller polls again
		}
		out = append(out, m.Data)
	}
	return out
}

// services returns the grouprouter services that answer $SRV.INFO, keyed by
// their node metadata.
func services(t *testing.T, nc *nats.Conn, want int) map[string]micro.Info {
	t.Helper()
	out := map[string]micro.Info{}
	for _, data := range discover(t, nc, micro.InfoVerb, want) {
		var info micro.Info
		if err := json.Unmarshal(data, &info); err != nil {
			t.Fatalf("INFO reply %s: %v", data, err)
		}
		if info.Type != micro.InfoResponseType || info.Name != ServiceName {
			t.Fatalf("INFO reply of type %q, name %q", info.Type, info.Name)
		}
		out[info.Metadata["node"]] = info
	}
	return out
}

func endpointNames(info micro.Info) []string {
	var names []string
	for _, e := range info.Endpoints {
		names = append(names, e.Name)
	}
	sort.Strings(names)
	return names
}

// TestServiceDiscovery finds the handlers of two LOCAL nodes (one active,
// one standby) as a NATS micro service, by discovery as `nats micro ls`,
// `info` and `stats` do: the active one with its endpoints and request
// counts, the standby one by its metadata; once the active one stops, the
// former standby reports itself active.
func TestServiceDiscovery(t *testing.T) {
	s := natstest.RunServer(t)
	a := startHandler(t, s, "h1", liveNodes)
	b := startHandler(t, s, "h2", liveNodes)
	var active, standby *handlerEnv
	natstest.Eventually(t, 10*time.Second, func() error {
		if a.h.Active() == b.h.Active() {
			return fmt.Errorf("active: h1=%v h2=%v, want exactly one", a.h.Active(), b.h.Active())
		}
		return nil
	})
	active, standby = a, b
	if b.h.Active() {
		active, standby = b, a
	}
	activeNode, standbyNode := active.h.cfg.Node, standby.h.cfg.Node
	nc := s.Connect()

	// Traffic on every endpoint: proposals (one of them malformed), an
	// operator move, a ping.
	c := NewClient(nc, "n1", 5*time.Second)
	ds, err := c.Propose(context.Background(), []Proposal{{Group: "g1", Node: "n1", Seq: 1}, {Group: "g2", Node: "n2", Seq: 2}})
	if err != nil || len(ds) != 2 || ds[0].Outcome != Accepted {
		t.Fatalf("propose: %v, %v", ds, err)
	}
	if _, err := nc.Request(ProposeSubject("n1"), []byte("{not json"), 5*time.Second); err != nil {
		t.Fatalf("malformed proposal: %v", err)
	}
	if _, err := Move(context.Background(), nc, "g1", "n2", 5*time.Second); err != nil {
		t.Fatalf("move: %v", err)
	}
	if _, err := Move(context.Background(), nc, "no-such-group", "n2", 5*time.Second); !errors.Is(err, ErrUnknownGroup) {
		t.Fatalf("move of an unknown group: %v", err)
	}
	if m, err := nc.Request(pingSubject("h"), nil, 5*time.Second); err != nil || string(m.Data) != active.h.ID() {
		t.Fatalf("ping: %v, %v", m, err)
	}

	// PING: both are there.
	natstest.Eventually(t, 10*time.Second, func() error {
		pings := discover(t, nc, micro.PingVerb, 2)
		roles := map[string]string{}
		for _, data := range pings {
			var p micro.Ping
			if err := json.Unmarshal(data, &p); err != nil {
				return fmt.Errorf("PING reply %s: %v", data, err)
			}
			roles[p.Metadata["node"]] = p.Metadata["role"]
		}
		if len(pings) != 2 || roles[activeNode] != "active" || roles[standbyNode] != "standby" {
			return fmt.Errorf("%d PING replies, roles %v; want %s active, %s standby", len(pings), roles, activeNode, standbyNode)
		}
		return nil
	})

	// INFO: the active handler's endpoints; the standby has none.
	infos := services(t, nc, 2)
	if got := endpointNames(infos[activeNode]); !slices.Equal(got, []string{"admin", "ping", "propose"}) {
		t.Errorf("active handler's endpoints %v, want admin, ping, propose", got)
	}
	for _, e := range infos[activeNode].Endpoints {
		want := map[string]string{"propose": SubjectPropose, "admin": SubjectAdmin, "ping": pingSubject("h")}[e.Name]
		if e.Subject != want || e.QueueGroup != handlerQueue {
			t.Errorf("endpoint %s: subject %q queue %q, want %q in %q", e.Name, e.Subject, e.QueueGroup, want, handlerQueue)
		}
	}
	if sb := infos[standbyNode]; sb.Metadata["role"] != "standby" || len(sb.Endpoints) != 0 || sb.Metadata["handler"] != "h" {
		t.Errorf("standby: metadata %v, endpoints %v", sb.Metadata, sb.Endpoints)
	}

	// STATS: request counts and errors, and the workers' own figures.
	var stats micro.Stats
	for _, data := range discover(t, nc, micro.StatsVerb, 2) {
		var st micro.Stats
		if err := json.Unmarshal(data, &st); err != nil {
			t.Fatalf("STATS reply %s: %v", data, err)
		}
		if st.Metadata["node"] == activeNode {
			stats = st
		}
	}
	byName := map[string]*micro.EndpointStats{}
	for _, e := range stats.Endpoints {
		byName[e.Name] = e
	}
	if len(byName) != 3 {
		t.Fatalf("active handler's stats: %d endpoints, want 3", len(stats.Endpoints))
	}
	for name, want := range map[string]EndpointData{
		"propose": {Answered: 2, Errors: 1}, // one malformed request
		"admin":   {Answered: 2, Errors: 1}, // one unknown group
	} {
		e := byName[name]
		if e.NumRequests != int(want.Answered) {
			t.Errorf("%s: %d requests counted by micro, want %d", name, e.NumRequests, want.Answered)
		}
		var d EndpointData
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatalf("%s stats data %s: %v", name, e.Data, err)
		}
		if d.Answered != want.Answered || d.Errors != want.Errors || d.ProcessingTime <= 0 || d.AverageProcessingTime != d.ProcessingTime/time.Duration(d.Answered) {
			t.Errorf("%s stats data %+v, want %d answered, %d errors, a processing time", name, d, want.Answered, want.Errors)
		}
	}
	// Answered in place: micro's own figures (our ping, and the standby's
	// probes if any came yet).
	if e := byName["ping"]; e.NumRequests < 1 || e.ProcessingTime <= 0 {
		t.Errorf("ping: %d requests, processing time %v", e.NumRequests, e.ProcessingTime)
	}

	// The active handler stops: the former standby is the only service
	// left, and says it is active, with the endpoints.
	active.cancel()
	<-active.done
	natstest.Eventually(t, 15*time.Second, func() error {
		infos := services(t, nc, 2)
		sb, ok := infos[standbyNode]
		if len(infos) != 1 || !ok || sb.Metadata["role"] != "active" || len(sb.Endpoints) != 3 {
			return fmt.Errorf("services %v; want only %s, active with 3 endpoints", infos, standbyNode)
		}
		return nil
	})
	if !standby.h.Active() {
		t.Error("the former standby says it is active on the service but Active() is false")
	}
}
