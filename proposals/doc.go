// Package proposals owns the grouping decision protocol: the proposal and
// reply messages on SubjectPropose, the pure decision rule (Decide), the
// LOCAL handler that answers proposals and writes bindings before it
// replies, the client REMOTE (and LOCAL) nodes use to propose, and the
// events published on grouping.events.<kind>.
//
// Wire format (JSON, one request may carry many proposals):
//
//	request: {"v":1,"proposer":"n1","proposals":[{"group":"order-42","node":"n2","from_seq":17}]}
//	reply:   {"v":1,"handler":"my-grouping-handler/n0","decisions":[
//	           {"group":"order-42","outcome":"accepted","binding":{...},"revision":5}]}
//
// An outcome is "accepted" (the proposed node was bound), "rejected" (the
// binding that stands is returned: an existing one, or a better node the
// handler bound instead) or "failed" (nothing was written; retry later).
// The group "" names the routing binding for messages without a group id.
package proposals
