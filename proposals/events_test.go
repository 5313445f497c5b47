package proposals

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestProgressEventJSON: the fields of progress events are written as
// encoding/json writes them, and read back.
func TestProgressEventJSON(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 5, time.UTC)
	for _, e := range []Event{
		{ID: "x", Kind: EventProgress, Group: "g", Node: "n2", PrevNode: "n1", By: "n2", At: at, Step: "drain", Count: 120, Total: 400, Groups: 1},
		{ID: "y", Kind: EventProgress, Node: "n0", By: "n0", At: at, Step: "catchup", Count: 3000, Total: 3000, Groups: 66, Reason: "done"},
		{ID: "z", Kind: EventProgress, Node: "n0", By: "n0", At: at, Step: "drain", Groups: 2}, // nothing counted yet
	} {
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(e); err != nil {
			t.Fatal(err)
		}
		got := e.AppendJSON(nil)
		if string(got) != strings.TrimSuffix(want.String(), "\n") {
			t.Errorf("AppendJSON = %s\nencoding/json %s", got, want.String())
		}
		var back Event
		if err := json.Unmarshal(got, &back); err != nil || back != e {
			t.Errorf("read back %+v (%v), want %+v", back, err, e)
		}
	}
}
