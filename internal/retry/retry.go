// Package retry tells the NATS failures that pass by themselves (a cluster
// still forming, a leader election, a server not up yet) from those that
// do not (credentials refused, permission denied, JetStream disabled for
// the account, a configuration the server rejects), and paces the retries
// of the former with capped, jittered exponential backoff.
//
// Errors it does not know are taken as transient: a node that waits and
// says why is easier to operate than one that exits on the first
// unfamiliar error while its cluster starts.
package retry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io/fs"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream API error codes that retrying fixes even though their HTTP-like
// status says "bad request".
const (
	codeNoSuitablePeers = 10005 // placement while peers are still joining
)

// JetStream API error codes that retrying does not fix although their
// status says "server error".
var permanentCodes = []jetstream.ErrorCode{
	10052, // invalid stream configuration
	10074, // replicas > 1 not supported in non-clustered mode
}

// Permanent reports whether err is a failure that retrying cannot fix:
// the server refused the credentials or a permission, the connection is
// closed, JetStream is disabled for the account or on the server, a TLS
// set-up the server or the client rejects, a file (creds, nkey, certificate)
// that cannot be read, or a JetStream request the server rejects as bad
// (status 400, 401 or 403, except "no suitable peers for placement").
// Everything else (no responders, timeouts, JetStream temporarily
// unavailable, no meta leader, insufficient resources, no server
// reachable, unknown errors) is transient.
func Permanent(err error) bool {
	if err == nil {
		return false
	}
	for _, p := range []error{
		nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired,
		nats.ErrPermissionViolation, nats.ErrConnectionClosed, nats.ErrConnectionDraining,
		nats.ErrSecureConnRequired, nats.ErrSecureConnWanted, nats.ErrClientCertOrRootCAsRequired,
		nats.ErrNkeysNotSupported, nats.ErrNkeyButNoSigCB, nats.ErrInvalidConnection,
		jetstream.ErrJetStreamNotEnabled, jetstream.ErrJetStreamNotEnabledForAccount,
		fs.ErrNotExist, fs.ErrPermission,
	} {
		if errors.Is(err, p) {
			return true
		}
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch {
		case slices.Contains(permanentCodes, apiErr.ErrorCode):
			return true
		case apiErr.ErrorCode == codeNoSuitablePeers:
			return false
		case apiErr.Code == 400, apiErr.Code == 401, apiErr.Code == 403:
			return true
		}
		return false
	}
	return TLS(err)
}

// TLS reports whether err is a TLS failure: a certificate that does not
// verify, a handshake the other side does not speak.
func TLS(err error) bool {
	var (
		unknownAuthority x509.UnknownAuthorityError
		invalidCert      x509.CertificateInvalidError
		hostname         x509.HostnameError
		verify           *tls.CertificateVerificationError
		header           tls.RecordHeaderError
		alert            tls.AlertError
	)
	return errors.As(err, &unknownAuthority) || errors.As(err, &invalidCert) || errors.As(err, &hostname) ||
		errors.As(err, &verify) || errors.As(err, &header) || errors.As(err, &alert) ||
		strings.Contains(err.Error(), "tls: ")
}

// Violation returns the permissions violation that nc reported after
// before (what nc.LastError returned before the attempt), or nil. A
// JetStream request whose subject the user may not publish to, or whose
// reply the user may not receive, gets no answer: the request only times
// out, and the reason is reported on the connection.
func Violation(nc *nats.Conn, before error) error {
	if nc == nil {
		return nil
	}
	last := nc.LastError()
	if last == nil || !errors.Is(last, nats.ErrPermissionViolation) || same(last, before) {
		return nil
	}
	return last
}

// same reports whether a and b are the same error value.
func same(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta.Comparable() && a == b
}

// Backoff paces retries: Next returns Min, then doubles up to Max, each
// with jitter (a random duration between half and all of it). The zero
// value uses 100 ms and 5 s. It is not safe for concurrent use.
type Backoff struct {
	Min, Max time.Duration
	next     time.Duration
}

// Next returns how long to wait before the next attempt.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	if hi < lo {
		hi = max(lo, 5*time.Second)
	}
	if b.next < lo {
		b.next = lo
	}
	d := b.next
	b.next = min(2*b.next, hi)
	return d/2 + rand.N(d/2+1)
}

// Reset starts the backoff over from Min.
func (b *Backoff) Reset() { b.next = 0 }

// Sleep waits d or until ctx ends, and returns ctx's error in that case.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
