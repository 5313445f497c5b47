package jsack

import (
	"strconv"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		name, reply string
		want        Delivery
		ok          bool
	}{
		{"v1", "$JS.ACK.GROUPING_INGRESS.OC1.1.42.7.1700000000000000000.3", Delivery{"OC1", 42, 7, 3}, true},
		{"v2", "$JS.ACK.dom.ACCHASH.GROUPING_INGRESS.OC1.1.42.7.1700000000000000000.3.tok", Delivery{"OC1", 42, 7, 3}, true},
		{"v2 without token", "$JS.ACK.dom.ACCHASH.GROUPING_INGRESS.OC1.1.42.7.1700000000000000000.3", Delivery{"OC1", 42, 7, 3}, true},
		{"v2 no domain", "$JS.ACK._.ACCHASH.KV_b.c1.1.42.7.1700000000000000000.0", Delivery{"c1", 42, 7, 0}, true},
		{"not an ack", "_INBOX.abc.1", Delivery{}, false},
		{"a nak", "$JS.NAK.KV_b.c1.1.42.7.1700000000000000000.3", Delivery{}, false},
		{"too few tokens", "$JS.ACK.S.C.1.2", Delivery{}, false},
		{"10 tokens", "$JS.ACK.KV_b.c1.1.42.7.17.3.x", Delivery{}, false},
		{"bad stream seq", "$JS.ACK.S.C.1.x.7.1.3", Delivery{}, false},
		{"bad pending", "$JS.ACK.S.C.1.2.7.1.-3", Delivery{}, false},
		{"empty consumer", "$JS.ACK.S..1.2.7.1.3", Delivery{}, false},
		{"empty", "", Delivery{}, false},
		{"too many tokens", "$JS.ACK.a.b.c.d.e.f.g.h.i.j.k.l.m.n", Delivery{}, false},
	} {
		got, ok := Parse(tt.reply)
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: Parse(%q) = %+v, %v; want %+v, %v", tt.name, tt.reply, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseUint(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want uint64
		ok   bool
	}{{"0", 0, true}, {"18446744073709551615", 0, false}, {"1234567890123456789", 1234567890123456789, true}, {"", 0, false}, {"-1", 0, false}} {
		if got, ok := parseUint(tt.in); got != tt.want || ok != tt.ok {
			t.Errorf("parseUint(%q) = %d, %v", tt.in, got, ok)
		}
	}
}

// FuzzParse: never panics, and what it reads agrees with splitting the
// subject on dots.
func FuzzParse(f *testing.F) {
	f.Add("$JS.ACK.KV_b.c1.1.42.7.1700000000000000000.3")
	f.Add("$JS.ACK._.H.KV_b.c1.1.42.7.17.0.t")
	f.Add("$JS.ACK.S..1.2.7.1.3")
	f.Fuzz(func(t *testing.T, reply string) {
		d, ok := Parse(reply)
		if !ok {
			return
		}
		tok := strings.Split(reply, ".")
		at := 3
		if len(tok) >= 11 {
			at = 5
		}
		num := func(i int) uint64 {
			v, err := strconv.ParseUint(tok[i], 10, 64)
			if err != nil {
				t.Fatalf("Parse(%q) accepted %q as a number", reply, tok[i])
			}
			return v
		}
		want := Delivery{Consumer: tok[at], StreamSeq: num(at + 2), ConsumerSeq: num(at + 3), Pending: num(at + 5)}
		if tok[0] != "$JS" || tok[1] != "ACK" || (len(tok) != 9 && len(tok) < 11) || len(tok) > maxTokens || d != want {
			t.Fatalf("Parse(%q) = %+v, want %+v", reply, d, want)
		}
	})
}
