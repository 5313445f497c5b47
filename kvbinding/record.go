package kvbinding

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Every value the router stores in its buckets names its kind and its
// format's version: {"record": "<kind>", "v": <version>, ...}. A reader
// decodes a value strictly, so that JSON that is not a router record (a
// PubAck reflected onto a key, any foreign object) is invalid:
//
//   - a value of another kind is refused;
//   - a value with neither field was written by a release before records
//     were typed: it is read with no field unknown to this release;
//   - a value of this release's version or the next one is read, its
//     fields unknown to this release ignored (the next release may add
//     fields, never change one): a node of the next release runs beside
//     one of this release during a rolling upgrade;
//   - a later version is refused: upgrade one release at a time.
//
// A change that a reader of the previous release would misread takes a
// new kind, not a new version.

// RecordVersion is the version of the records this release writes.
const RecordVersion = 1

// Record kinds.
const (
	recordBinding    = "binding"
	recordCheckpoint = "checkpoint"
	recordLive       = "live"
	recordLease      = "lease"
	recordFloor      = "floor"
)

// errRecord is wrapped by the errors of decodeRecord.
var errRecord = errors.New("not a router record")

// recordTag is the kind and version every stored record starts with.
type recordTag struct {
	Record string `json:"record,omitempty"`
	V      int    `json:"v,omitempty"`
}

// encodeRecord encodes v (a pointer to a record struct) as a value of
// kind.
func encodeRecord(kind string, v any) ([]byte, error) {
	tag, err := json.Marshal(recordTag{Record: kind, V: RecordVersion})
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(body) < 2 || body[0] != '{' {
		return nil, fmt.Errorf("kvbinding: a %s record must encode as an object", kind)
	}
	if len(body) == 2 {
		return tag, nil
	}
	// {"record":...,"v":1} + ,"field":... }
	return append(tag[:len(tag)-1:len(tag)-1], append([]byte{','}, body[1:]...)...), nil
}

// decodeLive decodes a liveness record as decodeRecord does, without
// reflection when the value is plain (fastLive), else in one pass over a
// typed value instead of two: every node decodes every node's heartbeat.
func decodeLive(data []byte) (NodeInfo, error) {
	if info, ok := fastLive(data); ok {
		return info, nil
	}
	var r struct {
		recordTag
		NodeInfo
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return NodeInfo{}, fmt.Errorf("%w: %v", errRecord, err)
	}
	if r.Record == "" && r.V == 0 {
		var info NodeInfo // untyped: read strictly
		err := decodeRecord(data, recordLive, &info)
		return info, err
	}
	if err := checkTag(r.recordTag, recordLive); err != nil {
		return NodeInfo{}, err
	}
	return r.NodeInfo, nil
}

// checkTag reports why a typed value tagged tag is not a record of kind
// this release reads (nil: it is).
func checkTag(tag recordTag, kind string) error {
	switch {
	case tag.Record != kind:
		return fmt.Errorf("%w: a %q record where a %s record belongs", errRecord, tag.Record, kind)
	case tag.V < 1 || tag.V > RecordVersion+1:
		return fmt.Errorf("%w: a %s record of version %d; this release reads versions 1 to %d (upgrade one release at a time)",
			errRecord, kind, tag.V, RecordVersion+1)
	}
	return nil
}

// decodeRecord decodes data, a value of kind, into v (a pointer to its
// record struct), by the rules above.
func decodeRecord(data []byte, kind string, v any) error {
	var tag recordTag
	if err := json.Unmarshal(data, &tag); err != nil {
		return fmt.Errorf("%w: %v", errRecord, err)
	}
	switch {
	case tag.Record == "" && tag.V == 0:
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			return fmt.Errorf("%w: an untyped %s record: %v", errRecord, kind, err)
		}
		return nil
	}
	if err := checkTag(tag, kind); err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%w: %v", errRecord, err)
	}
	return nil
}
