package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// connectTimeout bounds the connection attempt of the client subcommands.
const connectTimeout = 5 * time.Second

// connectClient connects a client subcommand (bindings, consume, nodes) to
// the comma-separated servers, after checking the list. Extra options
// follow the defaults. The caller closes the connection.
func connectClient(servers, cmd string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	servers = strings.TrimSpace(servers)
	if err := checkNATSURLs(servers); err != nil {
		return nil, nil, err
	}
	all := append([]nats.Option{nats.Name("grouprouter-" + cmd), nats.Timeout(connectTimeout)}, opts...)
	nc, err := nats.Connect(servers, all...)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot connect to NATS at %s: %w", redactURLs(servers), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// jetStreamDisabled reports whether err says that the server or account
// has no JetStream.
func jetStreamDisabled(err error) bool {
	return errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount)
}

// noJetStreamError is the message for jetStreamDisabled errors.
func noJetStreamError(servers string) error {
	return fmt.Errorf("JetStream is not enabled at %s; grouprouter needs it", redactURLs(servers))
}

// requireBucket checks that a bucket exists without creating it (opening
// one through kvbinding would create it): listing must not. what names what
// is missing for the message ("bindings", "nodes").
func requireBucket(ctx context.Context, js jetstream.JetStream, url, bucket, what string) error {
	_, err := js.KeyValue(ctx, bucket)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return fmt.Errorf("no %s yet: is a grouprouter node running? (no bucket %q at %s)", what, bucket, redactURLs(url))
	case jetStreamDisabled(err):
		return noJetStreamError(url)
	}
	return fmt.Errorf("open bucket %s: %w", bucket, err)
}
