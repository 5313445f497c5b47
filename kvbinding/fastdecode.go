package kvbinding

import (
	"math"
	"time"

	"github.com/grouprouter/grouprouter/internal/jsonx"
)

// fastBinding decodes the fields of a binding value that the cache keeps
// (group, state, node, from_seq, through_seq, prev_node, step, drain), without
// reflection: a warm start decodes every record of the bucket, and
// encoding/json was most of its time. It returns false for anything it
// does not handle plainly (escaped strings, unexpected types), and the
// caller then decodes with UnmarshalBinding.
func fastBinding(data []byte) (Binding, bool) {
	b, ok := decodeBinding(data, false)
	return b, ok && b.Validate() == nil
}

// decodeBinding decodes a whole binding value without reflection; with all
// set it keeps every field, else only those the cache needs.
func decodeBinding(data []byte, all bool) (Binding, bool) {
	d := jsonx.Scanner{Data: data}
	b, ok := scanBinding(&d, all)
	return b, ok && d.End()
}

// ScanJSON reads one binding object from d, as DecodeJSON does, for a
// decoder of a message that embeds bindings. It returns false when the
// object is not plain; the caller then decodes the whole message with
// encoding/json.
func ScanJSON(d *jsonx.Scanner) (Binding, bool) { return scanBinding(d, true) }

func scanBinding(d *jsonx.Scanner, all bool) (Binding, bool) {
	var b Binding
	ok := d.Object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "record", "v":
			ok = scanTag(d, key, recordBinding)
		case "group":
			b.Group, ok = d.Str()
		case "state":
			var s string
			s, ok = d.Str()
			b.State = State(s)
		case "node":
			b.Node, ok = d.Str()
		case "prev_node":
			b.PrevNode, ok = d.Str()
		case "from_seq":
			b.FromSeq, ok = d.Uint()
		case "through_seq":
			b.ThroughSeq, ok = d.Uint()
		case "step":
			var s string
			s, ok = d.Str()
			b.Step = Step(s)
		case "decided_at":
			var at time.Time
			if at, ok = d.Time(); ok && all {
				b.DecidedAt = at
			}
		case "decided_by":
			b.DecidedBy, ok = d.Str()
		case "proposed_by":
			b.ProposedBy, ok = d.Str()
		case "reason":
			b.Reason, ok = d.Str()
		case "routed":
			b.Routed, ok = d.Uint()
		case "ckpt":
			b.Ckpt, ok = d.Uint()
		case "epoch":
			b.Epoch, ok = d.Uint()
		case "drain":
			b.Drain, ok = d.Strings()
		}
		return ok
	})
	return b, ok
}

// fastLive decodes a liveness record without reflection, as decodeLive
// would: every node decodes every node's heartbeat. It returns false for
// anything it does not handle plainly (an untyped or unknown record, a
// field it does not know, escaped strings, negative numbers, the held
// group lists), and the caller then decodes with encoding/json.
func fastLive(data []byte) (NodeInfo, bool) {
	var info NodeInfo
	var record, version bool
	d := jsonx.Scanner{Data: data}
	ok := d.Object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "record":
			record = scanTag(&d, key, recordLive)
			ok = record
		case "v":
			version = scanTag(&d, key, recordLive)
			ok = version
		case "node":
			info.Node, ok = d.Str()
		case "instance":
			info.Instance, ok = d.Str()
		case "host":
			info.Host, ok = d.Str()
		case "type":
			info.Type, ok = d.Str()
		case "handler":
			info.Handler, ok = d.Str()
		case "pid":
			info.PID, ok = d.Int()
		case "has_consumer":
			info.HasConsumer, ok = d.Bool()
		case "busy_more":
			info.BusyMore, ok = d.Bool()
		case "started":
			info.Started, ok = strictTime(&d)
		case "heartbeat":
			info.Heartbeat, ok = strictTime(&d)
		case "every":
			info.Every, ok = duration(&d)
		case "ttl":
			info.TTL, ok = duration(&d)
		case "held":
			info.Held, ok = d.Int()
		case "waiting_groups":
			info.WaitingGroups, ok = d.Int()
		case "held_back_groups":
			info.HeldBackGroups, ok = d.Int()
		case "position":
			info.Position, ok = d.Uint()
		case "routed":
			info.Routed, ok = d.Uint()
		case "decision_errors":
			info.DecisionErrors, ok = d.Uint()
		case "dead_lettered":
			info.DeadLettered, ok = d.Uint()
		case "queue_pending":
			info.QueuePending, ok = d.Uint()
		case "queue_unacked":
			info.QueueUnacked, ok = d.Uint()
		case "busy":
			info.Busy, ok = d.Strings()
		case "retrying":
			info.Retrying, ok = d.Strings()
		}
		return ok
	})
	return info, ok && record && version && d.End()
}

// scanTag reads the value of a record's "record" or "v" key (key) and
// reports whether it names kind, or a version this release reads.
func scanTag(d *jsonx.Scanner, key []byte, kind string) bool {
	if string(key) == "record" {
		s, ok := d.Str()
		return ok && s == kind
	}
	v, ok := d.Int()
	return ok && v >= 1 && v <= RecordVersion+1
}

// strictTime reads a time as time.Time's UnmarshalJSON does (RFC 3339,
// strictly).
func strictTime(d *jsonx.Scanner) (time.Time, bool) {
	s, ok := d.Str()
	if !ok {
		return time.Time{}, false
	}
	var t time.Time
	return t, t.UnmarshalText([]byte(s)) == nil
}

// duration reads a non-negative time.Duration (nanoseconds).
func duration(d *jsonx.Scanner) (time.Duration, bool) {
	n, ok := d.Uint()
	if !ok || n > math.MaxInt64 {
		return 0, false
	}
	return time.Duration(n), true
}
