// Package integration runs grouprouter end to end against in-process NATS
// servers (one server, and three-server JetStream clusters on loopback):
// several router nodes, real producers and real queue consumers, with
// faults injected by stopping nodes, handlers and servers, and by holding
// the traffic of routes and links in TCP proxies.
//
// Every test owns its servers, its nodes and its ports, and all but four
// call t.Parallel: most of a test's time is spent waiting (for a fault's
// length, a grace, a cluster to form, a browser or a build), so the tests
// overlap those waits, one more at a time than there are cores (TestMain
// sets -parallel to GOMAXPROCS+1 unless it is given: 3 on CI's two cores,
// where the package took 576–660 s two at a time, and three at a time
// 491 s in one run of the suite (using 156 % of the 200 % the cores give)
// and 598 s in a CI run beside a heavier simulation in package router), after the four have run
// alone: their servers read users' passwords from the environment
// (permtest.NewAuth), which a parallel test may not set. Each test is
// written to hold under load (two busy loops alongside), which running
// beside others adds; a test that must do something within a deadline
// (a backlog stored before a rebind) pipelines it rather than count on
// the machine's pace. Four at a time is more than two cores give them: a
// soak node's first announcement then timed out for 30 s.
package integration
