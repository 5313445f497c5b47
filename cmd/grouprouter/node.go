package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

const (
	// reconnectWait is the pause between reconnect attempts of a node.
	reconnectWait = 250 * time.Millisecond
	// drainTimeout bounds the connection drain at shutdown.
	drainTimeout = 10 * time.Second
)

// run is the run subcommand: it validates the configuration, starts
// the embedded server if there are no servers to join, connects (waiting
// for NATS as long as it takes), and runs the router until ctx ends. Then
// it drains the connection and stops the server.
func (f *runFlags) run(ctx context.Context, in *invocation) error {
	opts, stderr := f.opts, in.stderr
	log := newLogger(stderr, opts.logLevel, opts.logJSON)
	opts.cfg.Logger = log
	web, err := listenHTTP(opts.httpAddr, log) // http.go; nil without --http
	if err != nil {
		return err
	}
	defer web.close() // on the error paths below; the one after the connection's drain comes first
	opts.cfg.Metrics = web.registerer()
	if opts.conn.PasswordFlag {
		log.Warn(passwordWarning)
	}

	servers := opts.conn.URL
	if servers == "" {
		emb, err := startEmbedded(opts.embedded, log)
		if err != nil {
			return err
		}
		defer emb.Close() // after the drain below: defers run last-in first-out
		servers = emb.url
	}
	conn := withURL(opts.conn, servers)

	closed := make(chan struct{})
	nc, err := connectNode(ctx, conn, servers, log,
		nats.Name("grouprouter-"+opts.cfg.Node),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.DrainTimeout(drainTimeout),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("reconnected to NATS", "url", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				log.Error("NATS error", "subject", sub.Subject, "err", err)
				return
			}
			log.Error("NATS error", "err", err)
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }),
	)
	if err != nil {
		return err
	}
	if nc == nil {
		log.Info("grouprouter node stopped before NATS answered", "node", opts.cfg.Node)
		return nil
	}
	defer drain(nc, closed, log)
	defer web.close() // once the router stopped, before the drain

	r, err := router.New(nc, opts.cfg)
	if err != nil {
		return err
	}
	if err := web.serve(nc, r); err != nil {
		return err
	}
	v := readVersion()
	log.Info("grouprouter node starting", "version", v.Version, "revision", v.revision(),
		"node", opts.cfg.Node, "name", opts.cfg.Name, "type", string(opts.cfg.Type),
		"address", opts.cfg.Address, "timeout", opts.cfg.Timeout, "queue_mode", string(opts.cfg.QueueMode),
		"group_timeout", neverOr(opts.cfg.GroupTimeout), "node_grace", opts.cfg.NodeGrace, "rebind_after", neverOr(max(opts.cfg.RebindAfter, 0)),
		"rebalance", rebalanceSummary(opts.cfg.Rebalance), "nats", nc.ConnectedUrlRedacted())
	if err := r.Run(ctx); err != nil {
		return setupError(err, conn)
	}
	log.Info("grouprouter node stopped", "node", opts.cfg.Node)
	return nil
}

// drain drains nc and waits until it is closed.
func drain(nc *nats.Conn, closed <-chan struct{}, log *slog.Logger) {
	if err := nc.Drain(); err != nil {
		nc.Close()
		return
	}
	t := time.NewTimer(drainTimeout + time.Second)
	defer t.Stop()
	select {
	case <-closed:
	case <-t.C:
		log.Warn("NATS connection drain did not finish; closing")
		nc.Close()
	}
}

// newLogger returns the command's logger: text (or JSON) lines on w.
func newLogger(w io.Writer, level slog.Level, asJSON bool) *slog.Logger {
	hopts := &slog.HandlerOptions{Level: level}
	if asJSON {
		return slog.New(slog.NewJSONHandler(w, hopts))
	}
	return slog.New(slog.NewTextHandler(w, hopts))
}

// redactURLs hides passwords in a comma-separated server list for messages.
func redactURLs(servers string) string {
	parts := strings.Split(servers, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if u, err := url.Parse(p); err == nil && u.User != nil {
			p = u.Redacted()
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}

// rebalanceSummary says how rebalancing is set, for the start line.
func rebalanceSummary(rb *proposals.RebalanceConfig) string {
	if rb == nil {
		d := proposals.DefaultRebalance
		rb = &d
	}
	if !rb.Enabled {
		return "off"
	}
	return fmt.Sprintf("tolerance %d, %d per tick, cool-down %v", rb.Tolerance, rb.MaxMoves, rb.CoolDown)
}
