// Package integration runs grouprouter end to end against in-process NATS
// servers (one server, and three-server JetStream clusters on loopback):
// several router nodes, real producers and real queue consumers, with
// faults injected by stopping nodes, handlers and servers.
package integration
