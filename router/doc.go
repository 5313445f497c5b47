// Package router is a grouprouter node: it reads the ingress stream in
// order, routes every message of a group bound to this node onto the node's
// queue subject (grouping.queue.<node>.<subject>) in ingress order, holds the
// messages of unbound groups while the LOCAL handler decides, takes over
// the groups moved to it, and runs the LOCAL handler when the node is of
// type LOCAL.
//
// Every node reads the whole ingress stream in order from its checkpoint,
// with its own ephemeral unacked consumer (reader.go); at each ingress
// sequence, a group's binding names the one node that routes it, so a
// group's messages are republished by exactly one node, in order. Publishes of one group are strictly
// sequential (the next waits for the previous PubAck, and a failed publish
// is retried with the same Nats-Msg-Id), so no fault can reorder a group on
// its queue; different groups are pipelined.
//
// Inside, the lane engine (engine.go) holds the routing logic with no I/O
// and no clock: messages, publish outcomes, record changes and replies go
// in, publishes and asks come out. Every input goes through one door,
// engine.step, as a value (input.go); besides it the shells only pull
// their next work (asks to send, held messages to release) and read views,
// which TestShellsUseTheEngineDoor checks. Shells do the I/O: the reader
// (reader.go, ingest.go), the publisher (publish.go, batch.go), the asker
// (ask.go), the hand-over steps of moves (handover.go, stage.go,
// progress.go), the release of held-back messages (fair.go) and liveness
// and checkpoints (liveness.go, router.go). The publisher, the asker, the
// hand-over, the fair shell, liveness and the queue's store check
// (storecheck.go) are rooms: types that own their fields (and, but for the
// publisher, which works when called, a run(ctx)), and reach the engine
// and the rest of the node only through the functions Router wires into
// them. Every goroutine runs
// under Run's errgroup and has ended when Run returns.
//
// Lock order: Router.mu (which guards the engine), then the binding
// cache's lock (the engine looks records up). Nothing else is locked, and
// no I/O is done, while Router.mu is held; record changes reach the engine
// over a channel read by the router's own goroutine, never by a callback
// under a lock.
package router
