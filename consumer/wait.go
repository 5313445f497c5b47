package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/wire"
)

// Waiting for a node's queue consumer: the first look again after
// waitFirst, doubling up to waitMax.
const (
	waitFirst = 250 * time.Millisecond
	waitMax   = time.Second
	// leaderPoll is the first pause once the consumer exists without a
	// leader.
	leaderPoll = 50 * time.Millisecond
	// leaderlessSay is how long the consumer may lack a leader before
	// the wait says so.
	leaderlessSay = 5 * time.Second
)

// WaitQueue waits until node's queue consumer (stream wire.QueueStream,
// durable wire.QueueConsumer(node)) exists and can take pull requests,
// and returns it. It is what Consume does before it pulls; an application
// that pulls with nats.go itself calls it before Consume or Fetch.
//
// The consumer exists once the node's router has run. In a cluster, the
// servers answer its info before its leader is elected (for about 100 ms
// after the router created it), and a pull request sent meanwhile is lost:
// nats.go's Consume then sends its next one only once it misses two idle
// heartbeats (30 s by default), and until then the node sees no consumer
// on its queue. So WaitQueue also waits for the leader.
//
// It retries (every 250 ms to 1 s) until ctx ends, then returns ctx's
// error; it returns another error only for an invalid node id or a
// lookup that failed for another reason than a missing stream or
// consumer or a transient one.
func WaitQueue(ctx context.Context, js jetstream.JetStream, node string) (jetstream.Consumer, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: nil JetStream", ErrConfig)
	}
	if err := kvbinding.ValidateNodeID(node); err != nil {
		return nil, fmt.Errorf("%w: node: %v", ErrConfig, err)
	}
	cons, err := waitQueue(ctx, js, node, slog.New(slog.DiscardHandler))
	if cons == nil && err == nil {
		err = ctx.Err()
	}
	return cons, err
}

// waitQueue is WaitQueue, saying once on log (at info level) when it has
// to wait for the consumer to exist, and once when it has had no leader
// for leaderlessSay. It returns nil, nil when ctx ends.
func waitQueue(ctx context.Context, js jetstream.JetStream, node string, log *slog.Logger) (jetstream.Consumer, error) {
	name := wire.QueueConsumer(node)
	pause := waitFirst
	said, saidLeader, leaderless := false, false, 0
	var leaderlessSince time.Time
	for {
		lctx, cancel := context.WithTimeout(ctx, opTimeout)
		cons, err := js.Consumer(lctx, wire.QueueStream, name)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil, nil
		case err == nil:
			info := cons.CachedInfo()
			// Without cluster information for long, the servers are not
			// a cluster after all (a leaf node's cluster, say).
			noCluster := info != nil && info.Cluster == nil && leaderless > 0 && time.Since(leaderlessSince) >= leaderlessSay
			if leaderElected(js, info) || noCluster {
				if said || saidLeader {
					log.Debug("consumer: the node's queue consumer is there; starting", "consumer", name)
				}
				return cons, nil
			}
			if leaderless == 0 {
				pause = leaderPoll // elected within about 100 ms, as a rule
				leaderlessSince = time.Now()
			}
			leaderless++
			if !saidLeader && time.Since(leaderlessSince) >= leaderlessSay {
				// A new one gets its leader within a second; not this one.
				saidLeader = true
				log.Info("consumer: waiting for the node's queue consumer to have a leader (are its servers up?)", "consumer", name)
			} else {
				log.Debug("consumer: the queue consumer has no leader yet; waiting", "consumer", name)
			}
		case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound):
			if !said {
				said = true
				log.Info("consumer: waiting for the node's queue consumer (is its router running? it creates the consumer)",
					"consumer", name, "stream", wire.QueueStream)
			}
		case isTransient(err):
			log.Debug("consumer: looking up the queue consumer; retrying", "err", err)
		default:
			return nil, fmt.Errorf("consumer: queue consumer %s: %w", name, err)
		}
		if !sleep(ctx, pause) {
			return nil, nil
		}
		pause = min(2*pause, waitMax)
	}
}

// leaderElected reports whether a consumer whose info is info can take
// pull requests: it has a leader. A server outside a cluster answers
// without cluster information; a clustered one does too (and without
// state) for a consumer it has not started yet.
func leaderElected(js jetstream.JetStream, info *jetstream.ConsumerInfo) bool {
	if info == nil {
		return false
	}
	if info.Cluster != nil {
		return info.Cluster.Leader != ""
	}
	return js.Conn().ConnectedClusterName() == ""
}
