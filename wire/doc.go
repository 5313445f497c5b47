// Package wire is grouprouter's wire contract: the names of the JetStream
// streams, subjects, consumers and buckets that the router (package
// router) and the client library (package consumer) share, the headers the
// router sets on the messages it republishes, and the group-id rules
// (GroupOf). It imports only the standard library and nats.go, so that a
// program that consumes a node's queue does not build the router.
//
// Package router keeps its own names for everything here, as aliases.
package wire
