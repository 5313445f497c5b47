// Command grouprouter runs a node of the grouprouter, which routes every
// message of one group (the Group-Id header) to one node's queue, in order,
// as the clustered grouping handlers of Artemis/HornetQ do, on NATS
// JetStream.
//
// Usage:
//
//	grouprouter run [--config FILE] [--nats URL[,URL...]] [--node ID]
//	                [--type LOCAL|REMOTE] [--address ADDR] [--timeout 5s]
//	                [--name NAME] [--group-header Group-Id] [--local-first]
//	                [--max-attempts N] [--replicas N]
//	                [--log-level debug|info|warn|error] [--log-json]
//	                [--listen HOST:PORT] [--store-dir DIR]
//	grouprouter bindings [--nats URL] [--json]
//
// run reads the <grouping-handler> element of --config (found anywhere in
// the XML document, as printed in the Artemis/HornetQ documentation;
// <timeout>, <group-timeout> and <reaper-period> are milliseconds), lets
// explicit flags override it and defaults fill the rest, validates the
// result before touching the network, and runs the node until SIGINT or
// SIGTERM. Without --nats it starts an embedded JetStream nats-server on
// --listen (default 127.0.0.1:4222) that stores its data under --store-dir
// (default: the user's data directory + /grouprouter).
//
// bindings lists the group bindings: which node each group is bound to and
// from which ingress sequence, as a table or, with --json, as JSON.
//
// Exit codes: 0 success (also for -h), 1 a runtime failure (cannot connect,
// port in use, router error), 2 a usage or configuration error.
package main
