// Package bench is "grouprouter bench": a reproducible benchmark of the
// router against the limit of its design, on this machine, in one run.
//
// # Layout
//
// Main starts its own NATS in the calling process — one JetStream server
// and/or a 3-server JetStream cluster on loopback, random ports, stores in
// a temporary directory — together with the load generator (--producers
// connections, 4 by default, spread over the servers, each PublishMsgAsync
// with a Group-Id header into jms.bench, up to 4,000 PubAcks outstanding)
// and the consumers (one per node: node N's durable queue consumer pulled with
// the priority group, every message acked).
//
// Router nodes run in child processes, one process per node (as they are
// deployed; node i connects to server i mod servers), so that
// their CPU time and memory are measured apart from the servers and the
// load: the child is the command in GROUPROUTER_BENCH_CHILD (split on
// white space) or else this executable with the argument "bench-node",
// which must call NodeMain (NodeMain reads the stats requests from
// os.Stdin). n0 is LOCAL (the handler), the others REMOTE. A child prints JSON lines on
// stdout ("ready", a "stats" answer for every "stats" line on stdin,
// "exit" after draining) carrying router.Stats, its getrusage(RUSAGE_SELF)
// CPU time and peak RSS, and runtime heap figures; the parent stops it
// with SIGTERM, and a child whose stdin closes stops by itself. The relay
// baseline and the cache warm start run in child processes the same way.
//
// # What is measured
//
// On each NATS set-up, phases run one after the other on the same servers;
// before each, the ingress is purged and the bindings, the checkpoints and
// the routing floor are cleared, so each starts from the same state:
//
//   - baseline (i), the relay, first: a durable pull consumer on the
//     ingress (AckAll) whose messages are republished, asynchronously
//     pipelined (at most 1,000 awaiting their PubAck), onto
//     grouping.queue.n0.<subject> in a queue stream of limits retention
//     (the router's is a work queue) with Nats-Msg-Id from the ingress
//     sequence, the ingress acked every 64 confirmed messages and when
//     caught up — no grouping (see relay); its peak sets the rate of the
//     paced runs: half of it;
//   - with steady (unless --scaling=false), what a node spends on the
//     messages it skips: n0 and n1 read the steady state, n1 without a
//     consumer so that every group is bound to n0; the CPU time of each
//     per ingress message;
//   - the router with --nodes nodes: steady state (--groups hot groups
//     bound by a warm-up run, then --messages round-robin over them), high
//     cardinality (--decisions messages, each a new group) and Zipf
//     (--messages over --zipf-groups groups, exponent --zipf-s) and hot
//     groups (1, then 10 groups bound by a warm-up run, then --messages, at
//     most 20,000, round-robin over them: a group's backlog, published in
//     atomic batches on R3, fast-ingest ones on R1; --max-batch sets the nodes' MaxBatch, 1 to
//     compare with one message at a time);
//   - with burst (not in the default list), --burst new groups, one
//     message each, from one producer as fast as async publish allows,
//     once with 64-byte and once with 1000-byte ids, each on a fresh node
//     whose stderr (its log) is counted: time until all are routed, failed
//     decision attempts, log bytes and peak RSS, long ids against short
//     (see burst.go; a throughput run only);
//   - the steady state again with 3 nodes (unless --scaling=false);
//   - baseline (ii), raw JetStream async publish of the same messages by
//     the same producers into one stream of the same replication; half of
//     it is the write ceiling of routing (every routed message is written
//     twice, into the ingress and onto a queue), printed as a ratio;
//   - baseline (iii), raw KV Create of binding-sized values at the same
//     replication, pipelined (PublishMsgAsync to $KV.<bucket>.<key> with
//     Nats-Expected-Last-Subject-Sequence: 0) and with 32 goroutines of
//     KeyValue.Create; the faster is the baseline of decisions/s;
//   - on the first set-up, the cache warm start: --warm-start valid binding
//     records are published into grouping-bindings, then a child loads a
//     fresh kvbinding.Cache and reports the time to Ready and the heap it
//     holds (HeapInuse after GC, loaded minus empty, per binding).
//
// Every phase measures the CPU time other processes took of the machine
// (from /proc/stat minus this process and its measured children) and
// prints it with each figure: the benchmark shares its cores with them.
//
// Every workload has a throughput run (published as fast as the producer's
// async window allows; messages/s from the first publish to the last
// message consumed; decisions/s = bind events on grouping.events.bind /
// time from the first publish to the last event) and a paced latency run:
// the steady state with --nodes nodes at the relay's rate (half its peak),
// other runs at half their own peak (--rate overrides). Figures a target
// compares are the median of --repeat runs: throughput (and raw publish)
// by rate, the paced runs of the relay and of the steady state by p99.
// Latency is publish to consume: the producer writes its clock into the
// body, the consumer (same process, same clock) subtracts. Decision
// latency is the same for the first message of a new group. Router CPU per
// message is the child's CPU time over the throughput run (summed over the
// nodes) divided by the messages; memory is the largest node's HeapInuse
// and peak RSS.
//
// # Wiring and running
//
// The grouprouter command maps "bench" to Main and the hidden "bench-node"
// to NodeMain. The package's test binary does the same (see TestMain), so
// the benchmark also runs without the command:
//
//	go test -c -o /tmp/bench.test ./internal/bench
//	GROUPROUTER_BENCH_CHILD="/tmp/bench.test bench-node" /tmp/bench.test bench
//
// go test ./internal/bench runs Main once at tiny sizes; go test -bench .
// adds the hot-path benchmarks and BenchmarkSteadyState, the steady state
// and the relay with everything in the test process.
package bench
