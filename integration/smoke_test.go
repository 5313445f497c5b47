package integration

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/router"
)

func TestSingleNodeRoutesGroupsInOrder(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	n0 := startNode(t, s.URL(), testConfig("n0", router.Local))
	var c collector
	startConsumer(t, s.URL(), "n0", &c)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0"}, []string{"n0"})
	js, _ := jetstream.New(nc)
	want := map[string][]string{"a": bodies("a", 10), "b": bodies("b", 10)}
	publish(t, js, "jms.orders", "a", want["a"]...)
	publish(t, js, "jms.orders", "b", want["b"]...)
	got := c.waitCount(t, 20, 20*time.Second)
	where := checkGrouping(t, got, want)
	if where["a"] != "n0" || where["b"] != "n0" {
		t.Fatalf("groups at %v, want n0", where)
	}
	_ = n0
}
