package router

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/jspub"
)

// sentMsgs is a sender that keeps what it is given, answering nothing.
type sentMsgs struct{ msgs []nats.Msg }

func (s *sentMsgs) Publish(m *nats.Msg, _ jspub.Callback) error {
	s.msgs = append(s.msgs, nats.Msg{Subject: m.Subject, Header: cloneHeader(m.Header), Data: m.Data})
	return nil
}

func (s *sentMsgs) PublishBatch(ms []*nats.Msg, cb jspub.Callback) error {
	for _, m := range ms {
		_ = s.Publish(m, cb)
	}
	return nil
}

func (s *sentMsgs) PublishMsg(m *nats.Msg) error { return s.Publish(m, nil) }

// A message the engine dead-letters and then routes (its dead-letter
// record was refused: the handler had bound the group meanwhile) reaches
// the queue as the ingress message it is: its own Nats-Msg-Id, which the
// queue stream deduplicates against the copy another node stored, and no
// dead-letter headers. Found by the simulation once it ran the real
// publisher: the dead-letter copy was the held message itself, rewritten,
// and the queue copy kept the "dlq:" id, so the stream stored it twice.
func TestRoutedAfterDeadLetterKeepsItsIngressID(t *testing.T) {
	sent := &sentMsgs{}
	p := &publisher{node: "n1", groupHeader: DefaultGroupHeader, out: sent, expect: []string{QueueStream}}
	hdr := nats.Header{}
	hdr.Set(DefaultGroupHeader, "g")
	payload := &held{msg: &nats.Msg{Subject: "jms.orders", Header: hdr, Data: []byte("body")}}
	msg := pubMsg{seq: 7, subject: "jms.orders", payload: payload}

	p.publish(action{kind: actPublish, group: "g", msg: msg, dlq: true, reason: "no routing decision"})
	p.publish(action{kind: actPublish, group: "g", node: "n1", msg: msg, epoch: []string{"3"}})

	if len(sent.msgs) != 2 {
		t.Fatalf("sent %d messages, want 2", len(sent.msgs))
	}
	dlq, queued := sent.msgs[0], sent.msgs[1]
	if got, want := dlq.Header.Get(jetstream.MsgIDHeader), "dlq:"+IngressStream+":7"; got != want {
		t.Errorf("dead-letter copy's id %q, want %q", got, want)
	}
	if got, want := queued.Subject, QueueSubject("n1", "jms.orders"); got != want {
		t.Errorf("queue copy's subject %q, want %q", got, want)
	}
	if got, want := queued.Header.Get(jetstream.MsgIDHeader), IngressStream+":7"; got != want {
		t.Errorf("queue copy's id %q, want %q", got, want)
	}
	for _, k := range []string{HeaderDeadReason, HeaderOrigSubject} {
		if v := queued.Header.Get(k); v != "" {
			t.Errorf("queue copy carries %s: %q", k, v)
		}
	}
	if got := queued.Header.Get(jetstream.ExpectedStreamHeader); got != QueueStream {
		t.Errorf("queue copy expects stream %q, want %q", got, QueueStream)
	}
	if string(queued.Data) != "body" || queued.Header.Get(DefaultGroupHeader) != "g" {
		t.Errorf("queue copy lost its body or group: %q %v", queued.Data, queued.Header)
	}
}
