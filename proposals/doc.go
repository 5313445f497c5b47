// Package proposals owns the life of a group's binding record and the
// protocol that drives it:
//
//   - Transition (lifecycle.go), the pure state machine that decides every
//     revision of a record (bind, move, unbind, fence, drained, caught_up,
//     release, deadletter, evacuate), with the node-choice rules beside it
//     (choose.go) and the rules a node follows (route.go: Owner, what to do
//     with a message; DutyOf, what a record asks of a node);
//   - the wire format of the requests nodes send on their own subject
//     grouping.propose.<node> (wire.go, protocol version 3) and the client
//     they send them with;
//   - the LOCAL handler (handler.go, apply.go, monitor.go, admin.go): the
//     only writer of binding records, answering as a NATS micro service
//     while it holds the handler lease, with a hot backup that takes over
//     when the lease lapses or the active handler stops answering;
//   - the events published on grouping.events.<kind>, each with a unique id
//     (a UUID version 7; the router keeps them in stream GROUPING_EVENTS).
//
// docs/protocol.md describes the messages and the record's life in full.
// Replies name revisions, never records: a node's cache learns records
// from the bindings bucket's watch only. Both sides encode and decode
// without reflection when a message is in the shape they write, and fall
// back to encoding/json otherwise (the fast paths are fuzzed against it).
// A version other than 3 is refused. The group "" names the routing
// binding for messages without a group id.
//
// The handler monitor (monitor.go) is a thin shell around a pure planner
// (plan.go: MonitorState.Plan, PlanPauses; balance.go: PlanRebalance,
// LeastLoaded), which the simulation in router/ drives as well.
//
// Lock order in the handler: the group locks (grouplock.go; a caller takes
// all its groups at once, in sorted order), then monitor.mu, then
// groupLimit.mu (limit.go), then the leaves: the binding cache's and the
// registry's locks, suspectMu, ingressLast.mu, Metrics.mu. Only the group
// locks are held across I/O: a decision holds its groups' locks from
// reading their records, through the pause of the queues it drains and its
// record writes, to its event (one decision at a time per group). No other
// lock is held across a JetStream call but Handler.advancing (rewind.go),
// which nobody waits for (TryLock). Pause and Resume are made by the
// pauser goroutine alone (pauser.go), which takes monitor.mu only between
// its calls and never a group lock; a decision waiting for its pause waits
// on a channel.
package proposals
