// Package jsack reads what JetStream writes in a delivery's reply subject,
// without allocating: a node reads it for every ingress message, every
// binding it watches and every message the bench relays.
//
// The reply subject of a delivery is
//
//	$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>
//
// or, from servers that add the domain and the account hash,
//
//	$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>[.<token>...]
//
// (nats.go's jetstream.Msg.Metadata reads the same, but splits and copies
// the subject for every message). The subject comes from the bus: Parse
// refuses anything else rather than guess.
package jsack

// Delivery is what a delivery's reply subject says.
type Delivery struct {
	// Consumer is the consumer's name: a substring of the reply subject.
	Consumer string
	// StreamSeq and ConsumerSeq are the message's stream sequence and its
	// delivery sequence on the consumer.
	StreamSeq, ConsumerSeq uint64
	// Pending is how many messages the consumer still had to deliver.
	Pending uint64
}

// maxTokens bounds the tokens read: the longest form above with a few
// tokens more to spare.
const maxTokens = 13

// Parse reads reply. It returns false when reply is not a delivery's reply
// subject in either form, or a number in it does not parse.
func Parse(reply string) (Delivery, bool) {
	var starts [maxTokens + 1]int
	n := 1
	for i := 0; i < len(reply); i++ {
		if reply[i] == '.' {
			if n == maxTokens {
				return Delivery{}, false
			}
			starts[n] = i + 1
			n++
		}
	}
	starts[n] = len(reply) + 1
	tok := func(i int) string { return reply[starts[i] : starts[i+1]-1] }
	if n < 2 || tok(0) != "$JS" || tok(1) != "ACK" {
		return Delivery{}, false
	}
	var at int // index of the consumer token
	switch {
	case n == 9:
		at = 3
	case n >= 11:
		at = 5
	default:
		return Delivery{}, false
	}
	sseq, ok1 := parseUint(tok(at + 2))
	cseq, ok2 := parseUint(tok(at + 3))
	pending, ok3 := parseUint(tok(at + 5))
	if !ok1 || !ok2 || !ok3 || tok(at) == "" {
		return Delivery{}, false
	}
	return Delivery{Consumer: tok(at), StreamSeq: sseq, ConsumerSeq: cseq, Pending: pending}, true
}

// parseUint parses a decimal uint64 of at most 19 digits (all that fit).
func parseUint(s string) (uint64, bool) {
	if len(s) == 0 || len(s) > 19 {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v, true
}
