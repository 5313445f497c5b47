package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/grouprouter/grouprouter/cmd/grouprouter/internal/ops"
	"github.com/grouprouter/grouprouter/router"
)

// opsHTTP is the --http server of `run`: /metrics, /healthz, /readyz and
// the status page (package cmd/grouprouter/internal/ops). It listens as soon as the flags
// are checked, so that a busy address fails before anything starts, and
// serves once the router exists.
type opsHTTP struct {
	ln  net.Listener
	reg *prometheus.Registry
	log *slog.Logger

	srv    *http.Server
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// checkHTTPAddr validates --http as HOST:PORT (port 0 picks a free one).
func checkHTTPAddr(hp string) (string, error) {
	host, port, err := net.SplitHostPort(strings.TrimSpace(hp))
	if err != nil {
		return "", fmt.Errorf("%w: --http %q: want HOST:PORT like 127.0.0.1:8222 (or :8222 for every interface)", router.ErrConfig, hp)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return "", fmt.Errorf("%w: --http %q: port must be 0 to 65535", router.ErrConfig, hp)
	}
	return net.JoinHostPort(host, port), nil
}

// listenHTTP listens on addr for the operator endpoints; nil (and no
// error) when addr is "" (--http not given).
func listenHTTP(addr string, log *slog.Logger) (*opsHTTP, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot serve --http %s: %w", addr, err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	log.Info("HTTP endpoints listening (/metrics, /healthz, /readyz, status page /)", "addr", ln.Addr().String())
	return &opsHTTP{ln: ln, reg: reg, log: log}, nil
}

// registerer is where the router registers its metrics (nil without --http).
func (o *opsHTTP) registerer() prometheus.Registerer {
	if o == nil {
		return nil
	}
	return o.reg
}

// serve starts serving node r (and following the events stream on nc for
// the status page) until close.
func (o *opsHTTP) serve(nc *nats.Conn, r *router.Router) error {
	if o == nil {
		return nil
	}
	srv, err := ops.New(ops.Config{Node: r, Gatherer: o.reg, Conn: nc, Logger: o.log})
	if err != nil {
		return err
	}
	o.srv = &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	o.cancel = cancel
	o.wg.Add(2)
	go func() {
		defer o.wg.Done()
		if err := o.srv.Serve(o.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			o.log.Error("HTTP server stopped", "err", err)
		}
	}()
	go func() {
		defer o.wg.Done()
		_ = srv.Run(ctx)
	}()
	return nil
}

// close stops serving (requests in progress get up to 5 s) and waits for
// everything serve started. Calls after the first do nothing.
func (o *opsHTTP) close() {
	if o == nil {
		return
	}
	o.once.Do(func() {
		if o.srv == nil {
			_ = o.ln.Close()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = o.srv.Shutdown(ctx)
		o.cancel()
		o.wg.Wait()
	})
}
