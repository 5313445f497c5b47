package jspub

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
)

func TestParseAck(t *testing.T) {
	tests := []struct {
		name string
		data string
		want Ack
		err  bool
	}{
		{"plain", `{"stream":"Q","seq":42}`, Ack{Stream: "Q", Sequence: 42}, false},
		{"duplicate", `{"stream":"GROUPING_QUEUE","seq":7,"duplicate":true}`, Ack{Stream: "GROUPING_QUEUE", Sequence: 7, Duplicate: true}, false},
		{"duplicate as the servers write it", `{"stream":"GROUPING_QUEUE","seq":7,"duplicate": true}`, Ack{Stream: "GROUPING_QUEUE", Sequence: 7, Duplicate: true}, false},
		{"not a duplicate", `{"stream":"Q","seq":7,"duplicate": false}`, Ack{Stream: "Q", Sequence: 7}, false},
		{"domain", `{"stream":"Q","domain":"hub","seq":18446744073709551615}`, Ack{Stream: "Q", Sequence: 18446744073709551615}, false},
		{"error", `{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`, Ack{}, true},
		{"garbage", `nope`, Ack{}, true},
		{"no seq", `{"stream":"Q"}`, Ack{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseAck(&nats.Msg{Data: []byte(tt.data)})
			if (err != nil) != tt.err || got != tt.want {
				t.Fatalf("ParseAck(%s) = %+v, %v", tt.data, got, err)
			}
		})
	}
	_, err := ParseAck(&nats.Msg{Data: []byte(`{"error":{"code":503,"err_code":10077,"description":"x"}}`)})
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.ErrCode != 10077 {
		t.Fatalf("error reply: %v", err)
	}
	if _, err := ParseAck(&nats.Msg{Header: nats.Header{"Status": {"503"}}}); !errors.Is(err, ErrNoResponders) {
		t.Fatalf("503: %v", err)
	}
}

// FuzzParseAck: the fast path agrees with encoding/json on every input it accepts.
func FuzzParseAck(f *testing.F) {
	for _, s := range []string{`{"stream":"Q","seq":42}`, `{"stream":"Q","seq":1,"duplicate":true}`, `{"error":{}}`, `{"seq":5,"stream":"A"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, ok := parseAckFast(b)
		if !ok {
			return
		}
		var slow Ack
		if err := json.Unmarshal(b, &slow); err != nil {
			return // the fast path is lenient on malformed JSON; the server never sends it
		}
		if slow.Stream != "" && slow.Sequence != 0 && (slow.Stream != fast.Stream || slow.Sequence != fast.Sequence) {
			t.Fatalf("fast %+v != json %+v for %q", fast, slow, b)
		}
	})
}

// TestCustomInboxPrefix: with nats.CustomInboxPrefix the acks come to
// <prefix>.<id>..., so a user allowed to receive only there gets them.
func TestCustomInboxPrefix(t *testing.T) {
	srv := natstest.RunServerWith(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "app", Password: "s3cret", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"q.>", "$JS.API.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"app-inbox.>"}},
		}}}
	})
	nc := natstest.Connect(t, srv.URL(), nats.UserInfo("app", "s3cret"), nats.CustomInboxPrefix("app-inbox"))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "Q", Subjects: []string{"q.>"}}); err != nil {
		t.Fatal(err)
	}
	p, err := New(nc, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !strings.HasPrefix(p.prefix, "app-inbox.") {
		t.Errorf("reply prefix %q, want app-inbox.<id>.", p.prefix)
	}
	acked := make(chan error, 1)
	if err := p.Publish(&nats.Msg{Subject: "q.x", Data: []byte("hi")}, func(_ Ack, err error) { acked <- err }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-acked:
		if err != nil {
			t.Fatalf("ack: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("no ack")
	}
}

// testServer starts a server for the test and returns a connection to it,
// its JetStream and a context ending with the test (20 s at most).
func testServer(t *testing.T) (*nats.Conn, jetstream.JetStream, context.Context) {
	t.Helper()
	nc := natstest.RunServer(t).Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return nc, js, ctx
}

// TestBatchEnd: with WithBatchEnd, every run of callbacks is followed by a
// batch end, also when acks time out, so that outcomes collected in the
// callbacks are never left waiting.
func TestBatchEnd(t *testing.T) {
	nc, js, ctx := testServer(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "Q", Subjects: []string{"q.>"}}); err != nil {
		t.Fatal(err)
	}
	var (
		mu        sync.Mutex
		collected int
		handed    int
		ends      int
	)
	all := make(chan struct{})
	const n = 3000
	p, err := New(nc, 300*time.Millisecond, WithBatchEnd(func() {
		mu.Lock()
		defer mu.Unlock()
		ends++
		handed += collected
		collected = 0
		if handed == n+1 {
			close(all)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cb := func(_ Ack, err error) {
		mu.Lock()
		collected++
		mu.Unlock()
	}
	for i := 0; i < n; i++ {
		if err := p.Publish(&nats.Msg{Subject: "q.x", Data: []byte("x")}, cb); err != nil {
			t.Fatal(err)
		}
	}
	// One publish received but not answered: its timeout ends a batch too.
	if _, err := nc.Subscribe("silent.x", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(&nats.Msg{Subject: "silent.x", Data: []byte("x")}, cb); err != nil {
		t.Fatal(err)
	}
	select {
	case <-all:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of %d outcomes handed over in %d batch ends, %d collected and waiting", handed, n+1, ends, collected)
	}
	if ends > n {
		t.Errorf("%d batch ends for %d callbacks", ends, n+1)
	}
}

// TestPublishBatch: a fast-ingest batch is stored whole and in order; a
// batch of duplicates is a success; a batch whose middle message the
// server refuses ends there, reported as incomplete with only what came
// before it stored; a stream that does not allow batches refuses it.
func TestPublishBatch(t *testing.T) {
	nc, js, ctx := testServer(t)
	q, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "Q", Subjects: []string{"q.>"}, AllowBatchPublish: true,
		MaxMsgSize: 512, Duplicates: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PLAIN", Subjects: []string{"plain.>"}}); err != nil {
		t.Fatal(err)
	}
	p, err := New(nc, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	batch := func(subject string, ids []string, big int) (Ack, error) {
		t.Helper()
		var msgs []*nats.Msg
		for i, id := range ids {
			data := []byte(id)
			if i == big {
				data = make([]byte, 1024)
			}
			msgs = append(msgs, &nats.Msg{Subject: subject, Header: nats.Header{jetstream.MsgIDHeader: {id}}, Data: data})
		}
		type outcome struct {
			ack Ack
			err error
		}
		done := make(chan outcome, 2)
		if err := p.PublishBatch(msgs, func(a Ack, err error) { done <- outcome{a, err} }); err != nil {
			t.Fatal(err)
		}
		select {
		case o := <-done:
			return o.ack, o.err
		case <-ctx.Done():
			t.Fatalf("no outcome for the batch %v", ids)
			return Ack{}, nil
		}
	}
	stored := func() []string {
		t.Helper()
		var out []string
		info, err := q.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
			m, err := q.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, string(m.Data))
		}
		return out
	}

	ack, err := batch("q.a", []string{"1", "2", "3", "4", "5"}, -1)
	if err != nil || ack.Stream != "Q" || ack.Sequence != 5 {
		t.Fatalf("a batch of 5: %+v, %v; want stored up to sequence 5", ack, err)
	}
	if _, err := batch("q.a", []string{"4", "5"}, -1); err != nil {
		t.Fatalf("a batch of duplicates: %v", err)
	}
	_, err = batch("q.a", []string{"6", "7", "8", "9"}, 1)
	if !errors.Is(err, ErrBatchIncomplete) {
		t.Fatalf("a batch with a message over the stream's size: %v, want ErrBatchIncomplete", err)
	}
	if got, want := strings.Join(stored(), ","), "1,2,3,4,5,6"; got != want {
		t.Errorf("stream holds %s, want %s (nothing after the refused message)", got, want)
	}
	if _, err := batch("plain.a", []string{"x", "y"}, -1); err == nil {
		t.Errorf("a stream without allow_batched took a batch")
	}
	if p.Pending() != 0 {
		t.Errorf("%d outcomes still pending", p.Pending())
	}
}

// TestPublishSaysDuplicate: a publish the stream takes for a duplicate of
// its Nats-Msg-Id is a success that says so and names the first copy's
// sequence, as the servers write it (the hand-over moves a copy that
// landed late on another node's queue by it).
func TestPublishSaysDuplicate(t *testing.T) {
	nc, js, ctx := testServer(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "Q", Subjects: []string{"q.>"}, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	p, err := New(nc, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	publish := func(subject, id string) Ack {
		t.Helper()
		done := make(chan Ack, 1)
		m := &nats.Msg{Subject: subject, Header: nats.Header{jetstream.MsgIDHeader: {id}}}
		if err := p.Publish(m, func(a Ack, err error) {
			if err != nil {
				t.Errorf("publish %s: %v", id, err)
			}
			done <- a
		}); err != nil {
			t.Fatal(err)
		}
		select {
		case a := <-done:
			return a
		case <-ctx.Done():
			t.Fatalf("no outcome for %s", id)
			return Ack{}
		}
	}
	publish("q.a", "x")
	first := publish("q.b", "y")
	if first.Duplicate {
		t.Fatalf("first publish of y: %+v says duplicate", first)
	}
	if again := publish("q.c", "y"); !again.Duplicate || again.Sequence != first.Sequence {
		t.Fatalf("y again: %+v, want a duplicate of sequence %d", again, first.Sequence)
	}
}

// FuzzParseBatchReply: any reply to a batch's message decodes to one of
// its kinds without panicking; a batch ends as stored only with a stream.
func FuzzParseBatchReply(f *testing.F) {
	for _, s := range []string{`{"type":"ack","seq":0,"msgs":64}`, `{"type":"gap","last_seq":3,"seq":5}`,
		`{"type":"err","seq":2,"error":{"code":400,"err_code":10054,"description":"x"}}`,
		`{"stream":"Q","seq":9,"batch":"b","count":4}`, `{"error":{"code":503}}`, `{"type":"later"}`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		kind, ack, err := parseBatchReply(&nats.Msg{Data: b})
		if kind == batchEnd && err == nil && ack.Stream == "" {
			t.Fatalf("%q ends a batch as stored without a stream", b)
		}
		if kind != batchEnd && (ack != batchAck{}) {
			t.Fatalf("%q is not an end but carries %+v", b, ack)
		}
	})
}
