// Package integration runs grouprouter end to end against in-process NATS
// servers (one server, and three-server JetStream clusters on loopback):
// several router nodes, real producers and real queue consumers, with
// faults injected by stopping nodes, handlers and servers, and by holding
// the traffic of routes and links in TCP proxies.
//
// The long fault runs (the nemesis, the partition scenarios, the takeover
// of many groups, batches across faults, leader step-downs and server
// restarts under load, a node paused past its grace, new groups of a
// killed node, moves behind a slow consumer, the in-process soak, the
// active handler killed under load, lost queue writes under a running
// node), and the tests that mostly wait for a browser, a build or a
// cluster to form (the status page in a browser, the rolling upgrade,
// automatic replicas) call t.Parallel: each owns its servers, its nodes
// and its ports, and spends most of its time waiting, so they overlap
// those waits two at a time (go test's -parallel is GOMAXPROCS) after the
// other tests of the package have run. They are written to hold under
// load (two busy loops alongside), which running beside each other adds.
// More at once (-parallel 4) is more than two cores give them: a soak
// node's first announcement then timed out for 30 s.
package integration
