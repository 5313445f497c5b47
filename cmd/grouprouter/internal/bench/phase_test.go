package bench

import (
	"bytes"
	"regexp"
	"testing"
	"time"
)

func TestPhaseLine(t *testing.T) {
	var buf bytes.Buffer
	b := &bencher{stderr: &buf, started: time.Now(), servers: 3}
	b.phase("router, %d node(s): %s", 3, "steady")
	if !regexp.MustCompile(`^bench +\d+\.\ds \[s3\] phase: router, 3 node\(s\): steady\n$`).MatchString(buf.String()) {
		t.Errorf("phase line %q", buf.String())
	}
}
