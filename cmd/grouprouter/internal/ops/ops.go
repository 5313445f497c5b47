// Package ops is the operator's HTTP surface of a grouprouter node, served
// by `grouprouter run --http ADDR`: /metrics (Prometheus text format),
// /healthz (the process is alive), /readyz (the node routes; 503 with the
// reason otherwise), / (a status page that refreshes itself) and
// /status.json (the same as JSON).
//
// It is a package of its own, beside router, because none of it is
// routing: it owns an HTTP mux, an embedded page and a follower of the
// events stream with a lifecycle of its own, and router stays free of
// net/http. What a library user embedding router needs is on router
// itself (Config.Metrics registers the node's metrics on the caller's
// registry; Router.CheckReady and Router.Status answer readiness and
// status); the page and its mux are the command's, so the package is
// the command's own (cmd/grouprouter/internal).
//
// Everything the page shows comes from the node's memory (router.Status:
// O(nodes), whatever the number of bindings) except the latest events,
// which a follower of stream GROUPING_EVENTS keeps in two bounded rings
// (all events; moves, hand-offs and unbinds). The follower runs only while
// someone looks: it starts with the first status request and stops after
// Config.Idle without one, so /metrics alone costs no event deliveries;
// the first request waits (up to firstEventsWait) for it to read what is
// stored. The charts are drawn on the server, as inline SVG, from a
// bounded history that Run samples from router.Status every HistoryEvery.
package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	_ "embed"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/grouprouter/grouprouter/router"
)

// Node is what the HTTP surface needs of a router node; *router.Router is one.
type Node interface {
	// CheckReady returns nil when the node routes, else why not.
	CheckReady() error
	// Status returns a snapshot of the node and the cluster it sees.
	Status(ctx context.Context) router.Status
}

// Config configures a Server.
type Config struct {
	// Node is the node served. Required.
	Node Node
	// Gatherer is served on /metrics; nil: /metrics answers 404.
	Gatherer prometheus.Gatherer
	// Conn reads stream GROUPING_EVENTS for the page's latest events; nil:
	// the page lists none.
	Conn *nats.Conn
	// Events is how many events, and how many moves, the page lists.
	// Default 25.
	Events int
	// Idle: the events follower stops this long after the last status
	// request. Default 1m.
	Idle time.Duration
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Server serves a node's operator endpoints. Its Handler may be used before
// Run and after; Run follows the events stream for the status page.
type Server struct {
	cfg     Config
	log     *slog.Logger
	page    *template.Template
	rates   rateSampler
	events  eventRings
	samples *history
	parked  parkedReader
	// wanted wakes Run when a status request comes; lastWanted is its
	// time, in Unix nanoseconds.
	wanted     chan struct{}
	lastWanted atomic.Int64
	// loadBy is until when (Unix nanoseconds) status requests wait for
	// the events follower to read what is stored: firstEventsWait after
	// the request that woke it.
	loadBy atomic.Int64
}

//go:embed status.html
var statusPage string

// New returns a server for cfg.Node.
func New(cfg Config) (*Server, error) {
	if cfg.Node == nil {
		return nil, fmt.Errorf("%w: no node", ErrConfig)
	}
	if cfg.Events <= 0 {
		cfg.Events = 25
	}
	if cfg.Idle <= 0 {
		cfg.Idle = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	page, err := template.New("status").Funcs(pageFuncs()).Parse(statusPage)
	if err != nil {
		return nil, err
	}
	return &Server{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "http"),
		page:    page,
		events:  newEventRings(cfg.Events),
		samples: newHistory(),
		wanted:  make(chan struct{}, 1),
		parked:  parkedReader{nc: cfg.Conn},
	}, nil
}

// Handler returns the HTTP handler of the endpoints. It is safe for
// concurrent use.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	if s.cfg.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Gatherer, promhttp.HandlerOpts{
			ErrorHandling: promhttp.ContinueOnError, // a failing collector does not hide the others
			ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		plain(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := s.cfg.Node.CheckReady(); err != nil {
			plain(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		plain(w, http.StatusOK, "ready")
	})
	mux.HandleFunc("GET /status.json", func(w http.ResponseWriter, r *http.Request) {
		v := s.view(r.Context())
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v)
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		v := s.view(r.Context())
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := s.page.Execute(w, v); err != nil {
			s.log.Warn("status page not rendered", "err", err)
		}
	})
	return mux
}

// plain writes a one-line text answer.
func plain(w http.ResponseWriter, code int, line string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(line + "\n"))
}

// firstEventsWait bounds how long a status request waits for the events
// follower to read what is stored, so that the first render lists the
// latest events rather than none.
const firstEventsWait = 3 * time.Second

// view takes a status snapshot for the page, and wakes the events
// follower. A request that wakes the follower (the first, or the first
// after Config.Idle without one) waits up to firstEventsWait for it to
// read the events stored, and so do the requests in that time; later
// ones do not wait (the stream may be unreadable).
func (s *Server) view(ctx context.Context) view {
	now := time.Now().UnixNano()
	if prev := s.lastWanted.Swap(now); prev == 0 || time.Duration(now-prev) > s.cfg.Idle {
		s.loadBy.Store(now + int64(firstEventsWait))
	}
	select {
	case s.wanted <- struct{}{}:
	default:
	}
	if wait := time.Duration(s.loadBy.Load() - now); s.cfg.Conn != nil && wait > 0 {
		timer := time.NewTimer(wait)
		select {
		case <-s.events.loadedChan():
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v := s.build(s.cfg.Node.Status(ctx))
	if s.cfg.Conn != nil {
		parked := s.parked.list(ctx)
		v.Parked = &parked
	}
	return v
}
