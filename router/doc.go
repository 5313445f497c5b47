// Package router is a grouprouter node: it reads the ingress stream in
// order, routes every message of a group bound to this node onto the node's
// queue subject (grouping.queue.<node>.<subject>) in ingress order, holds the
// messages of unbound groups while a proposal is decided, and runs the LOCAL
// handler when the node is of type LOCAL.
//
// Every node reads the whole ingress stream with its own ordered consumer
// from its checkpoint; at each ingress sequence, a group's binding names
// the one node that routes it, so a group's messages are republished by
// exactly one node, in order. Publishes of one group are strictly
// sequential (the next waits for the previous PubAck, and a failed publish
// is retried with the same Nats-Msg-Id), so no fault can reorder a group on
// its queue; different groups are pipelined.
package router
