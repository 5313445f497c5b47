package proposals

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// Client sends a node's proposals, on the node's own subject, to whichever
// LOCAL handler is active.
type Client struct {
	nc       *nats.Conn
	proposer string
	timeout  time.Duration
}

// NewClient returns a client proposing as node proposer, waiting at most
// timeout for each decision.
func NewClient(nc *nats.Conn, proposer string, timeout time.Duration) *Client {
	return &Client{nc: nc, proposer: proposer, timeout: timeout}
}

// Propose sends the proposals as one request and returns one decision per
// proposal, in order. It returns an error wrapping ErrDecisionTimeout when
// no reply came within the timeout, ErrNoHandler when no handler is
// subscribed, ErrHandlerFailed or ErrBadMessage otherwise. An error means
// nothing is known of any proposal in the batch.
func (c *Client) Propose(ctx context.Context, ps []Proposal) ([]Decision, error) {
	req := Request{Proposer: c.proposer, Proposals: ps}
	data, err := EncodeRequest(req)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	msg, err := c.nc.RequestWithContext(ctx, ProposeSubject(c.proposer), data)
	switch {
	case err == nil:
	case errors.Is(err, nats.ErrNoResponders):
		return nil, fmt.Errorf("%w (%d proposals)", ErrNoHandler, len(ps))
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return nil, fmt.Errorf("%w after %v (%d proposals)", ErrDecisionTimeout, c.timeout, len(ps))
	default:
		return nil, fmt.Errorf("proposals: request: %w", err)
	}
	reply, err := DecodeReply(msg.Data, req)
	if err != nil {
		return nil, err
	}
	return reply.Decisions, nil
}
