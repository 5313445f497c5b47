package wire_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/grouprouter/grouprouter/wire"
)

// TestNames pins the names every deployed router and consumer agree on:
// changing one breaks the wire contract between releases.
func TestNames(t *testing.T) {
	for got, want := range map[string]string{
		wire.QueueStream:                    "GROUPING_QUEUE",
		wire.QueueSubject("n1", "orders.a"): "grouping.queue.n1.orders.a",
		wire.QueueFilter("n1"):              "grouping.queue.n1.>",
		wire.QueueConsumer("n1"):            "grouping-node-n1",
		wire.PriorityGroup:                  "grouping",
		wire.HeaderIngressSeq:               "Grouping-Ingress-Seq",
		wire.HeaderEpoch:                    "Grouping-Epoch",
		wire.HeaderGroupSeq:                 "Group-Seq",
		wire.HeaderDeliveredBefore:          "Grouping-Delivered-Before",
		wire.DefaultGroupHeader:             "Group-Id",
		wire.ParkedStream:                   "GROUPING_PARKED",
		wire.ParkedSubjectPrefix:            "grouping.parked.",
		wire.ParkedBucket:                   "grouping-parked",
		wire.HeaderParkReason:               "Grouping-Park-Reason",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	if c := wire.ParkedBucketConfig(3); c.Name != "KV_"+wire.ParkedBucket || c.Replicas != 3 || c.AllowRollup || !c.DenyPurge {
		t.Errorf("parked bucket config %+v: want KV_%s, 3 replicas, no roll-ups, no purges", c, wire.ParkedBucket)
	}
}

func TestGroupOf(t *testing.T) {
	for _, c := range []struct {
		name           string
		h              nats.Header
		group, invalid string
	}{
		{"none", nats.Header{}, "", ""},
		{"plain", nats.Header{"Group-Id": {"g1"}}, "g1", ""},
		{"other case", nats.Header{"group-id": {"g1"}}, "g1", ""},
		{"same twice", nats.Header{"Group-Id": {"g1"}, "GROUP-ID": {"g1"}}, "g1", ""},
		{"different twice", nats.Header{"Group-Id": {"g1", "g2"}}, "", "present more than once"},
		{"empty", nats.Header{"Group-Id": {""}}, "", "empty"},
		{"too long", nats.Header{"Group-Id": {strings.Repeat("x", wire.MaxGroupIDLen+1)}}, "", "at most 1024"},
		{"not UTF-8", nats.Header{"Group-Id": {"\xff"}}, "", "UTF-8"},
	} {
		g, inv := wire.GroupOf(c.h, wire.DefaultGroupHeader)
		if g != c.group || (c.invalid == "") != (inv == "") || !strings.Contains(inv, c.invalid) {
			t.Errorf("%s: GroupOf = %q, %q; want %q, containing %q", c.name, g, inv, c.group, c.invalid)
		}
	}
	if err := wire.ValidateGroupID(""); !errors.Is(err, wire.ErrInvalidGroupID) {
		t.Errorf("ValidateGroupID(\"\") = %v, want ErrInvalidGroupID", err)
	}
}

func TestValidHeaderName(t *testing.T) {
	for h, want := range map[string]bool{"Group-Id": true, "X_Tenant.Key": true, "": false, "a b": false, "a:b": false, "é": false} {
		if got := wire.ValidHeaderName(h); got != want {
			t.Errorf("ValidHeaderName(%q) = %v, want %v", h, got, want)
		}
	}
}
