// Package demo runs grouprouter end to end in one process, with no NATS
// needed: a 3-server JetStream cluster on loopback, three router nodes,
// producers and consumers, a node killed halfway and brought back, a live
// view of it, and a summary that checks that every message arrived
// exactly once and in order per group. It is 'grouprouter demo'.
package demo
