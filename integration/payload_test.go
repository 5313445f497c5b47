package integration

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// TestMessageAtMaxPayload: the ingress stores a message one byte under
// max_payload, which the router cannot republish once its own headers are
// added (the server refuses it for good). Before, the publish was retried
// forever and its group wedged. Now it goes to the dead-letter stream
// with the reason — without its body, since the dead-letter copy is as
// large — and the group's next messages are delivered, in order.
func TestMessageAtMaxPayload(t *testing.T) {
	t.Parallel() // see doc.go
	const maxPayload = 64 * 1024
	s := natstest.RunServerWith(t, func(o *server.Options) { o.MaxPayload = maxPayload })
	startNode(t, s.URL(), testConfig("n0", router.Local))
	var c collector
	startConsumer(t, s.URL(), "n0", &c)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0"}, []string{"n0"})
	deadEvents := watchEvents(t, nc, proposals.EventDeadLetter)
	js := jetStream(t, s.URL())

	want := map[string][]string{}
	sendBatch(t, js, "big", "before", 3, want)
	// Headers and body one byte under max_payload, as the server counts them.
	hdr := "NATS/1.0\r\nGroup-Id: big\r\n\r\n"
	body := strings.Repeat("x", maxPayload-1-len(hdr))
	m := nats.NewMsg("jms.orders")
	m.Header.Set("Group-Id", "big")
	m.Data = []byte(body)
	ack, err := js.PublishMsg(t.Context(), m)
	if err != nil {
		t.Fatalf("the ingress refused a message one byte under max_payload: %v", err)
	}
	sendBatch(t, js, "big", "after", 3, want)

	checkGrouping(t, c.waitCount(t, 6, 30*time.Second), want)
	dlq := waitStreamMsgs(t, js, router.DeadLetterStream, 1, 20*time.Second)
	if len(dlq) != 1 {
		t.Fatalf("dead-letter stream holds %d messages, want 1", len(dlq))
	}
	d := dlq[0]
	if got := d.Header.Get(router.HeaderIngressSeq); got != strconv.FormatUint(ack.Sequence, 10) {
		t.Errorf("dead letter names ingress sequence %q, want %d", got, ack.Sequence)
	}
	if got := d.Header.Get(router.HeaderBodyDropped); got != strconv.Itoa(len(body)) {
		t.Errorf("dead letter's %s = %q, want %d", router.HeaderBodyDropped, got, len(body))
	}
	if g := d.Header.Get("Group-Id"); g != "big" {
		t.Errorf("dead letter has group %q, want big", g)
	}
	if r := d.Header.Get(router.HeaderDeadReason); !strings.Contains(r, "refused by the servers") {
		t.Errorf("dead letter's reason %q does not say the servers refused it", r)
	}
	ev := deadEvents.waitGroup(t, "big", 10*time.Second)
	if ev.Count != 1 || ev.FromSeq != ack.Sequence {
		t.Errorf("deadletter event %+v, want count 1 at ingress sequence %d", ev, ack.Sequence)
	}
	// The original is where the dead letter says.
	orig, err := getMsg(t, js, router.IngressStream, ack.Sequence)
	if err != nil || len(orig.Data) != len(body) {
		t.Errorf("ingress message %d: %v (%d bytes), want the original of %d bytes", ack.Sequence, err, len(orig.Data), len(body))
	}
}

func getMsg(t testing.TB, js jetstream.JetStream, stream string, seq uint64) (*jetstream.RawStreamMsg, error) {
	t.Helper()
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		return &jetstream.RawStreamMsg{}, err
	}
	m, err := s.GetMsg(t.Context(), seq)
	if err != nil {
		return &jetstream.RawStreamMsg{}, err
	}
	return m, nil
}

// TestFullDeadLetterStreamRefuses: a dead-letter stream at its bound
// refuses new dead letters instead of evicting old ones. What waits to be
// dead-lettered is held, in order, and counted as failed publishes, while
// other groups flow; once an operator makes room, it goes in.
func TestFullDeadLetterStreamRefuses(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	cfg := testConfig("n0", router.Local)
	cfg.DeadLetterMaxBytes = 6500 // two of the dead letters below (about 2.9 KB each)
	n0 := startNode(t, s.URL(), cfg)
	var c collector
	startConsumer(t, s.URL(), "n0", &c)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0"}, []string{"n0"})
	js := jetStream(t, s.URL())

	// Group ids one byte too long: each such message is dead-lettered.
	bad := strings.Repeat("g", 1025)
	body := strings.Repeat("b", 1500)
	for i := range 4 {
		publish(t, js, "jms.orders", bad, body+strconv.Itoa(i))
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		if st := n0.r.Stats(); st.PublishErrors < 2 {
			return fmt.Errorf("%d failed publishes, want the full dead-letter stream to refuse", st.PublishErrors)
		}
		return nil
	})
	st := streamState(t, js, router.DeadLetterStream)
	if st.FirstSeq != 1 || st.Msgs != 2 {
		t.Fatalf("full dead-letter stream holds %d messages from %d; want its first 2 kept", st.Msgs, st.FirstSeq)
	}
	// Other groups flow meanwhile.
	want := map[string][]string{}
	sendBatch(t, js, "ok", "while-full", 3, want)
	checkGrouping(t, c.waitCount(t, 3, 20*time.Second), want)

	// An operator makes room: the rest goes in, in order.
	stream, err := js.Stream(t.Context(), router.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	kept := st.Msgs
	dlq := waitStreamMsgs(t, js, router.DeadLetterStream, int(4-kept), 30*time.Second)
	for i, m := range dlq {
		if want := body + strconv.Itoa(int(kept)+i); string(m.Data) != want {
			t.Errorf("dead letter %d after the purge holds %.12q…, want the message %d", i, m.Data, int(kept)+i)
		}
	}
}
