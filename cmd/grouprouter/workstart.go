package main

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/router"
)

// logWorkStart writes work's start line: the node, how many commands at
// once, the command, and the node's queue mode, read from its queue
// consumer ("unknown" when it cannot be read: the node may not have
// created it yet).
func logWorkStart(ctx context.Context, js jetstream.JetStream, o *workOptions, log *slog.Logger) {
	log.Info("grouprouter work starting", "node", o.node, "concurrency", o.concurrency, "max_attempts", o.maxAttempts,
		"timeout", o.timeout, "queue_mode", queueModeOf(ctx, js, o.node), "command", strings.Join(o.argv, " "),
		"version", readVersion().Version)
}

// queueModeOf returns node's queue mode as its queue consumer is set up:
// "pinned" (priority group router.PriorityGroup) or "plain"; "unknown"
// if the consumer cannot be read within a second or two.
func queueModeOf(ctx context.Context, js jetstream.JetStream, node string) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, router.QueueStream, router.QueueConsumer(node))
	if err != nil {
		return "unknown"
	}
	if slices.Contains(c.CachedInfo().Config.PriorityGroups, router.PriorityGroup) {
		return string(router.QueuePinned)
	}
	return string(router.QueuePlain)
}
