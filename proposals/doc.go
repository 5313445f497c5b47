// Package proposals owns the grouping decision protocol: the proposal and
// reply messages on SubjectPropose, the pure decision rule (Decide), the
// LOCAL handler that answers proposals and writes bindings before it
// replies, the client REMOTE (and LOCAL) nodes use to propose, and the
// events published on grouping.events.<kind> (each with a unique id, a
// UUID version 7; the router keeps them in stream GROUPING_EVENTS).
//
// Wire format (JSON, version 2, one request may carry up to 1,024 proposals):
//
//	request: {"v":2,"proposer":"n1","proposals":[{"group":"order-42","node":"n2","from_seq":17},
//	           {"group":"order-43","node":"n2","from_seq":18}]}
//	reply:   {"v":2,"handler":"my-grouping-handler/n0","decided_at":"2026-11-30T05:31:14.314Z","decisions":[
//	           {"group":"order-42","outcome":"accepted","revision":5},
//	           {"group":"order-43","outcome":"rejected","binding":{...},"revision":3}]}
//
// An accepted decision whose binding is exactly the proposal (bound to the
// proposed node from from_seq, decided by handler at decided_at for the
// proposer) carries only its revision; any other binding travels whole.
// Both sides encode and decode without reflection when the message is in
// the shape they write, and fall back to encoding/json otherwise (the fast
// paths are fuzzed against it). A version other than 2 is refused.
//
// An outcome is "accepted" (the proposed node was bound), "rejected" (the
// binding that stands is returned: an existing one, or a better node the
// handler bound instead) or "failed" (nothing was written; retry later).
// The group "" names the routing binding for messages without a group id.
package proposals
