package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// connectTimeout bounds the connection attempt of the client subcommands.
const connectTimeout = 5 * time.Second

// jetStreamDisabled reports whether err says that the server or account
// has no JetStream.
func jetStreamDisabled(err error) bool {
	return errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount)
}

// noJetStreamError is the message for jetStreamDisabled errors.
func noJetStreamError(s connSettings) error {
	if who := s.identity(); who != "" {
		return fmt.Errorf("JetStream is not enabled for the account of %s at %s; grouprouter needs it", who, redactURLs(s.URL))
	}
	return fmt.Errorf("JetStream is not enabled at %s; grouprouter needs it", redactURLs(s.URL))
}

// requireBucket checks that a bucket exists without creating it (opening
// one through kvbinding would create it): listing must not. what names what
// is missing for the message ("bindings", "nodes").
func requireBucket(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, s connSettings, bucket, what string) error {
	before := nc.LastError()
	_, err := js.KeyValue(ctx, bucket)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return fmt.Errorf("no %s yet: is a grouprouter node running? (no bucket %q at %s)", what, bucket, redactURLs(s.URL))
	}
	return requestError(err, s, nc, before, "open bucket "+bucket)
}
