package proposals

import (
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/micro"
)

// The handler is the NATS micro service ServiceName (see addService). Its
// propose and admin endpoints hand each request to a worker and return, so
// that a slow decision does not hold up the subscription; micro counts the
// requests, but the processing time it reports is the hand-off's and it
// cannot see errors answered later by a worker. The handler therefore
// keeps its own figures per endpoint and serves them as the endpoint's
// stats data (`nats micro stats grouprouter`):
//
//	{"answered":120,"errors":1,"processing_time":51234000,"average_processing_time":426950}
//
// Times are nanoseconds from admission (the worker's queue included) to
// the reply; errors are requests a worker answered with an error for the
// whole request (malformed, refused operator commands). Requests refused
// because every worker was busy are answered in place: micro counts them
// in its own num_errors.

// endpointStats are one endpoint's figures since the handler started.
type endpointStats struct {
	answered atomic.Uint64
	errors   atomic.Uint64
	nanos    atomic.Int64
}

// served records a request a worker answered after took.
func (s *endpointStats) served(took time.Duration, failed bool) {
	s.answered.Add(1)
	s.nanos.Add(int64(took))
	if failed {
		s.errors.Add(1)
	}
}

// serviceStats are the figures of the endpoints answered by workers.
type serviceStats struct {
	propose, admin endpointStats
}

// EndpointData is the stats data of the handler's propose and admin
// endpoints.
type EndpointData struct {
	// Answered counts requests a worker answered.
	Answered uint64 `json:"answered"`
	// Errors counts requests a worker answered with an error for the
	// whole request.
	Errors uint64 `json:"errors"`
	// ProcessingTime is the total time from admission to reply, and
	// AverageProcessingTime its mean per answered request.
	ProcessingTime        time.Duration `json:"processing_time"`
	AverageProcessingTime time.Duration `json:"average_processing_time"`
}

// statsData is the micro StatsHandler: EndpointData for the endpoints
// answered by workers, nothing for ping (answered in place, so micro's own
// figures are right).
func (h *Handler) statsData(e *micro.Endpoint) any {
	var s *endpointStats
	switch e.Name {
	case "propose":
		s = &h.svcStats.propose
	case "admin":
		s = &h.svcStats.admin
	default:
		return nil
	}
	d := EndpointData{Answered: s.answered.Load(), Errors: s.errors.Load(), ProcessingTime: time.Duration(s.nanos.Load())}
	if d.Answered > 0 {
		d.AverageProcessingTime = d.ProcessingTime / time.Duration(d.Answered)
	}
	return d
}

// respond answers r from a worker: a plain publish to its reply subject
// (see admit).
func (h *Handler) respond(r micro.Request, data []byte) error {
	return h.nc.Publish(r.Reply(), data)
}
