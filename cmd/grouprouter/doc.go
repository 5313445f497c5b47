// Command grouprouter runs a node of the grouprouter, which routes every
// message of one group (the Group-Id header) to one node's queue, in order,
// as the clustered grouping handlers of Artemis/HornetQ do, on NATS
// JetStream.
//
// Usage:
//
//	grouprouter run [--config FILE] [CONNECTION] [--node ID]
//	                [--type LOCAL|REMOTE] [--address ADDR] [--timeout 5s]
//	                [--name NAME] [--group-header Group-Id] [--local-first]
//	                [--max-attempts N] [--replicas N] [--queue-mode pinned|plain]
//	                [--group-timeout DURATION] [--reaper-period 30s]
//	                [--node-grace 15s] [--rebind-after 30s] [--events-max-age 24h]
//	                [--rebalance=true|false] [--rebalance-tolerance 1]
//	                [--rebalance-rate 4] [--rebalance-cool-down 30s]
//	                [--log-level debug|info|warn|error] [--log-json]
//	                [--listen HOST:PORT] [--store-dir DIR] [--server-config FILE]
//	                [--sync always|DURATION]
//	                [--http HOST:PORT]
//	grouprouter bindings [CONNECTION] [--all] [--json]
//	grouprouter groups [CONNECTION] [--node ID] [--state STATE] [--json]
//	                   [--group-header Group-Id]
//	grouprouter where [CONNECTION] [--json] [--group-header Group-Id] GROUP|--ungrouped
//	grouprouter nodes [CONNECTION] [--name NAME] [--json]
//	grouprouter events [CONNECTION] [--follow] [--group GROUP] [--kind KIND]
//	                   [--since DURATION] [--json]
//	grouprouter publish [CONNECTION] [--group GROUP] [--group-header Group-Id]
//	                    [--header NAME:VALUE]... SUBJECT [BODY]
//	grouprouter consume [CONNECTION] [--node ID] [--count N] [--json]
//	                    [--no-ack] [--group-header Group-Id]
//	grouprouter move [CONNECTION] [--timeout 10s] [--json] [--wait] GROUP NODE
//	grouprouter unbind [CONNECTION] [--timeout 10s] [--json] [--wait] GROUP
//	grouprouter permissions --nodes ID[,ID...] --handlers ID[,ID...]
//	                        [--address ADDR] [--name NAME]
//	                        [--inbox-prefix _INBOX] [--js-domain DOMAIN]
//	grouprouter demo [--duration 30s] [--groups 200] [--rate 200] [--no-kill]
//
// CONNECTION is what every command takes to reach NATS, as the nats CLI
// names it: --nats URL[,URL...] (NATS_URL), --user and --password
// (NATS_USER, NATS_PASSWORD), --creds FILE (NATS_CREDS), --nkey FILE
// (NATS_NKEY), --tlscert, --tlskey and --tlsca FILE (NATS_CERT, NATS_KEY,
// NATS_CA), --tlsfirst, --context NAME (NATS_CONTEXT: a saved nats context,
// $XDG_CONFIG_HOME/nats/context/NAME.json), --inbox-prefix PREFIX and
// --js-domain DOMAIN. A flag on the command line beats its variable, which
// beats the context; the credentials come whole from the first of them
// that names any. Without servers to join, run starts the embedded server;
// the client commands default to nats://127.0.0.1:4222. No secret is
// printed; a password on the command line (it shows in ps) draws a
// warning. See docs/connections.md.
//
// permissions prints a nats-server authorization block with one user per
// role (see docs/permissions.md).
//
// Durations (--timeout and the group lifecycle flags) are Go durations
// like 5s or bare integers of milliseconds like 5000.
//
// run reads the <grouping-handler> element of --config (found anywhere in
// the XML document, as printed in the Artemis/HornetQ documentation;
// <timeout>, <group-timeout> and <reaper-period> are milliseconds), lets
// explicit flags override it and defaults fill the rest, validates the
// result before touching the network, and runs the node until SIGINT or
// SIGTERM. Without servers to join it starts an embedded JetStream
// nats-server on --listen (default 127.0.0.1:4222) that stores its data
// under --store-dir (default: the user's data directory + /grouprouter),
// configured by the nats-server file --server-config if given (its users,
// TLS, ...; --listen and --store-dir override it); listening beyond
// loopback without authentication is refused. --sync (default always) is
// its fsync policy: always writes every message to disk before its PubAck;
// a DURATION flushes in the background that often, so that an OS crash or
// a power loss loses what was acknowledged since the last flush; a
// sync_interval in --server-config stands unless --sync is given. run waits for NATS as long
// as it takes: started before its server or with its cluster, it logs what
// it waits for and goes on when NATS answers; refused credentials, a
// denied permission, JetStream disabled for the account or a conflicting
// stream end it at once with one line.
//
// The group lifecycle: --group-timeout (the Artemis group-timeout; default
// never, as -1 or 0) expires a binding after no message of its group for
// that long, looked for every --reaper-period (default 30s; it must be > 0
// when a group timeout is set); the group's next message gets a new
// binding. The file's <group-timeout> and <reaper-period> (milliseconds,
// -1 = never) set them too; flags override the file. The active LOCAL
// handler moves the groups of a node gone for --node-grace (default 15s;
// keep it well under the queue stream's 2 minute duplicate window) to live
// nodes, and those of a node whose queue has had no consumer for
// --rebind-after (default 30s; negative = never) while another node's
// queue has one, waiting messages included, in order. With --rebalance
// (the default) it also moves groups, idle ones first, at most
// --rebalance-rate per tick, from nodes above their share (groups / nodes
// whose queue has a consumer) plus --rebalance-tolerance to nodes below
// it, never a group moved within --rebalance-cool-down.
//
// --queue-mode says how the node's queue (the durable consumer
// grouping-node-<node> on stream GROUPING_QUEUE) is set up: pinned (the
// default) gives it the priority group "grouping" with one pinned puller
// at a time, so further consumer processes wait as standbys; plain creates
// it without a priority group, for clients that cannot pull with one (then
// run one consumer process per node).
//
// --events-max-age is how long the stream GROUPING_EVENTS keeps events
// (it also keeps at most 256 MiB), when this node creates it.
//
// --http (off by default) serves, on one address: /metrics (Prometheus
// text format, docs/metrics.md), /healthz (200 while the process runs),
// /readyz (200 once the binding cache is loaded while NATS is connected and
// the ingress is read; else 503 with the reason on one line), the status
// page / (refreshing itself) and /status.json.
//
// bindings lists the current group bindings (bound, or moving): which node
// each group is bound to and from which ingress sequence, as a table or,
// with --json, as JSON; --all adds the ended records (released,
// dead-lettered).
//
// groups lists the groups as the bucket is read (in the order of their last
// change): node, state, since when (decided_at) and why (decided by,
// proposed by, previous node, a hand-over in progress, the reason), the
// group's messages on the node queues (waiting: not delivered yet; unacked:
// delivered and still on the work queue, that is with a stream sequence at
// most the node consumer's last delivered one; the age of the oldest) and
// the messages held undecided by the routers (as their liveness records
// announce them). By default it lists bound and moving groups and any with
// messages; --state selects bound, moving, released, dead-lettered,
// unbound (no record) or all; --node lists a node's groups and reads only
// its queue. where shows the same for one GROUP, queue by queue and router
// by router; where --ungrouped for the routing binding of the messages
// without a group id (listed as "(ungrouped)").
//
// publish publishes one message as a producer does, with --group in the
// group header, and prints the ingress sequence of its PubAck.
//
// events prints the events kept in stream GROUPING_EVENTS, one line each
// or, with --json, each as stored (with its unique id, a UUID version 7);
// it stops at the last one stored when it started unless --follow is
// given. --kind filters on the server, --group in the command, --since
// starts that long ago.
//
// nodes lists the live nodes as they last announced themselves (type,
// whether a consumer pulls from the queue, routing position, held, routed,
// decision-error and dead-lettered counts, last heartbeat) and which node
// holds the LOCAL handler lease of --name, as a table or, with --json, as
// JSON.
//
// move asks the active LOCAL handler to move GROUP to NODE: it writes a
// "moving" record, and the node the group is bound to hands the group over
// with its waiting messages, in order; NODE must be alive and, when some
// node's queue has a consumer, have one too. unbind ends GROUP's binding
// the same way (the node releases it; its next message gets a new
// binding). GROUP is taken verbatim: any UTF-8, spaces and dots included.
// Both print the record written (with --json as JSON) and return at once;
// 'grouprouter bindings' shows when the hand-over is done. With --wait they
// poll the record until it is (bound to NODE with the takeover finished,
// or released), at most --timeout, and print the final record; meanwhile
// they show the step and, following the new node's progress events, the
// messages moved off the old queues and routed from the ingress so far
// (one line rewritten on a terminal, a line per change otherwise). An unknown
// group, an ineligible node, a group being moved already, no LOCAL handler
// answering or a timeout exit 1.
//
// consume pulls from a node's queue as an application does (with the
// priority group when the queue is pinned), prints each message as a line
// "<ingress-seq> <group-id or -> <subject> <body>" or, with --json, as one
// JSON object per line, and acknowledges it after printing (unless
// --no-ack). It stops after --count messages, or at SIGINT/SIGTERM with
// --count 0. Started before the node's router, it says so once and waits
// for the consumer the router creates (as work does).
//
// demo runs everything in this process, with no NATS needed: a 3-server
// JetStream cluster on loopback, nodes n0 (LOCAL), n1 (LOCAL backup) and
// n2 (REMOTE), producers and a consumer per node; halfway n2 is killed,
// later it comes back and groups are moved back to it. It shows a live
// view (redrawn in place on a terminal, plain lines otherwise) and ends
// with a summary that checks that every message arrived exactly once and
// in order per group; exit 1 if not (see docs/demo.md).
//
// Exit codes: 0 success (also for -h), 1 a runtime failure (cannot connect,
// credentials refused, port in use, router error), 2 a usage or
// configuration error (also an embedded server that would listen beyond
// loopback without authentication).
package main
