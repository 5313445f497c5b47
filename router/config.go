package router

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/wire"
)

// HandlerType is the grouping-handler type of a node.
type HandlerType string

const (
	// Local nodes route and also compete to answer proposals; a second
	// LOCAL node is the hot backup of the first.
	Local HandlerType = "LOCAL"
	// Remote nodes route and propose to the LOCAL handler.
	Remote HandlerType = "REMOTE"
)

// ParseHandlerType accepts LOCAL or REMOTE in any letter case.
func ParseHandlerType(s string) (HandlerType, error) {
	switch t := HandlerType(strings.ToUpper(strings.TrimSpace(s))); t {
	case Local, Remote:
		return t, nil
	}
	return "", fmt.Errorf("%w: unknown type %q (want LOCAL or REMOTE)", ErrConfig, s)
}

// Defaults of Config.
const (
	DefaultGroupHeader      = wire.DefaultGroupHeader // see package wire
	DefaultTimeout          = 5 * time.Second
	DefaultMaxHeldMessages  = 100_000
	DefaultMaxHeldBytes     = 64 << 20
	DefaultMaxSpilledBytes  = 256 << 20
	DefaultMaxInFlight      = 4096
	DefaultMaxBatch         = 64
	DefaultHeartbeat        = time.Second
	DefaultLeaseTTL         = 2 * time.Second
	DefaultCheckpoint       = time.Second
	DefaultIngressMaxAge    = 24 * time.Hour
	DefaultEventsMaxAge     = 24 * time.Hour
	DefaultDeadLetterMaxAge = 7 * 24 * time.Hour
	DefaultPinnedTTL        = 5 * time.Second
	DefaultQueueAckWait     = 30 * time.Second
)

// Config configures a router node. The first four fields are the
// <grouping-handler> block; the rest have defaults (see Defaults).
type Config struct {
	// Name of the grouping handler; the LOCAL handler and its backups share it.
	Name string
	// Type is LOCAL or REMOTE.
	Type HandlerType
	// Address: producers publish on <Address>.> (e.g. "jms" -> jms.orders).
	Address string
	// Timeout is how long a proposal may wait for a decision before the
	// attempt counts as failed (it is retried; the group waits).
	Timeout time.Duration

	// Node is this node's id: [A-Za-z0-9_-], at most 64 characters.
	Node string
	// GroupHeader names the header holding the group id. Default "Group-Id".
	GroupHeader string
	// LocalFirst makes a node propose itself for new groups when its queue
	// has a consumer, instead of the least loaded eligible node.
	LocalFirst bool
	// MaxAttempts is how many failed proposal attempts a group's held
	// messages wait through before they go to the dead-letter stream.
	// 0 (the default) means never: they wait, in order, until decided.
	MaxAttempts int
	// MaxHeldMessages and MaxHeldBytes bound the messages a node keeps in
	// memory (awaiting a decision or their group's previous publish). Past
	// either bound the node stops reading the ingress: back-pressure, no loss.
	MaxHeldMessages int
	MaxHeldBytes    int64
	// MaxSpilledBytes bounds the messages held without their body: once
	// the held messages take half of MaxHeldBytes (or of MaxHeldMessages),
	// a message that waits for a decision keeps only its sequence, its
	// subject and its group (about 160 bytes and the id), and is read
	// again from the ingress when it is published. A flood of new groups
	// then waits for its decisions without stopping the node's reading,
	// and groups bound already keep flowing. Default
	// DefaultMaxSpilledBytes; negative: never spill (the node stops
	// reading once the held messages reach their bounds).
	MaxSpilledBytes int64
	// MaxInFlight bounds the queue publishes awaiting their ack.
	MaxInFlight int
	// MaxBatch: a group with a backlog has up to this many of its next
	// messages published as one batch, one round trip instead of one
	// each (docs/protocol.md, "Batches"). Default 64; 1 turns batches off.
	// A replicated queue stream takes atomic batches, one of a single
	// replica fast-ingest batches (on R1 file storage an atomic batch is
	// slower than single publishes: docs/performance.md).
	MaxBatch int
	// GroupShare bounds how many of a group's messages may be on this
	// node's queue unacknowledged: past it, the group's next messages
	// wait on the node's held subject, in order, and go onto the queue as
	// the consumer acknowledges the earlier ones, so that one busy group
	// never fills the queue consumer's window and holds the other groups
	// back (docs/consuming.md, "A busy group"). 0 (the default): half of
	// the queue consumer's window (MaxAckPending) shared by the groups
	// with at least 16 unacknowledged, at least 16 each; negative: no
	// bound.
	GroupShare int
	// Replicas of the streams and buckets; 0 (auto) asks for 3 when the
	// node's server is in a cluster and 1 otherwise, and settles for 1 when
	// the cluster cannot place 3 within clusterFormingWait (see Replicas).
	// Existing streams keep theirs.
	Replicas int
	// Heartbeat is how often the node announces itself; it is considered
	// gone 3 heartbeats (at least 1s) after its last announcement.
	Heartbeat time.Duration
	// LeaseTTL is the LOCAL handler lease; a backup takes over about this
	// long after the active handler dies.
	LeaseTTL time.Duration
	// CheckpointInterval is how often the routing position is saved.
	CheckpointInterval time.Duration
	// IngressMaxAge is the ingress stream's MaxAge when the router creates it.
	IngressMaxAge time.Duration
	// IngressMaxBytes, QueueMaxBytes and DeadLetterMaxBytes bound the
	// streams the router creates (0: no bound). Past the bound the ingress
	// and the queue stream refuse new messages (producers get an error,
	// routing waits and retries: nothing is dropped); the dead-letter
	// stream drops its oldest.
	IngressMaxBytes    int64
	QueueMaxBytes      int64
	DeadLetterMaxBytes int64
	// BindingsMaxBytes bounds the bindings bucket (0: no bound): past it
	// new bindings are refused (and retried) until ended records expire.
	BindingsMaxBytes int64
	// DeadLetterMaxAge is how long dead letters are kept. Default 7 days.
	DeadLetterMaxAge time.Duration
	// MaxMessageSize is the largest message the ingress stream accepts
	// (0: the server's max_payload). The queue and dead-letter streams
	// accept that plus the headers the router adds.
	MaxMessageSize int32
	// EventsMaxAge is the events stream's MaxAge when the router creates
	// it (it also keeps at most EventsMaxBytes). Default 24h.
	EventsMaxAge time.Duration
	// PinnedTTL is the queue consumer's pinned-client timeout: how long a
	// dead puller keeps the pin before a standby gets it.
	PinnedTTL time.Duration
	// GroupTimeout expires a binding after no message of its group was
	// routed for this long (Artemis group-timeout); 0 or negative: never.
	GroupTimeout time.Duration
	// MaxGroups bounds the groups bound at once in the cluster, as the
	// active LOCAL handler counts them: a new group past it is refused and
	// its messages are dead-lettered (proposals.HandlerConfig.MaxGroups).
	// Default proposals.DefaultMaxGroups; negative: no limit. Only a LOCAL
	// node's value counts (that of the active handler).
	MaxGroups int
	// ReaperPeriod is how often idle bindings are looked for. Default 30s.
	ReaperPeriod time.Duration
	// NodeGrace is how long a node may be gone before the active LOCAL
	// handler moves its groups. Default 15s; keep it well under the queue
	// stream's 2 min duplicate window.
	NodeGrace time.Duration
	// RebindAfter is how long a node's queue may have no consumer (while
	// another node's has one) before the active LOCAL handler moves its
	// groups, waiting messages included. Default 30s; negative: never.
	RebindAfter time.Duration
	// FenceDeadline is how long a node may take to fence a group moving
	// away from it before the active LOCAL handler fences it from the
	// node's checkpoint, as for a gone node. Default 10s.
	FenceDeadline time.Duration
	// Rebalance tunes how the active LOCAL handler spreads groups over
	// the nodes whose queue has a consumer (idle groups first, a bounded
	// number per tick, never a group moved within the cool-down); nil:
	// proposals.DefaultRebalance (on, tolerance 1, 4 moves per tick, 16
	// moves in flight, cool-down 30s). Enabled false turns it off.
	Rebalance *proposals.RebalanceConfig
	// QueueAckWait is the ack wait of the node queues' consumers: a
	// message delivered and neither acked nor marked in progress within it
	// is delivered again. A move also waits on it: the group's messages
	// the old node's consumer was delivered stay its own until it acks
	// them, for as long as it keeps acknowledging; once it has made no
	// progress for QueueAckWait they are moved (see docs/protocol.md,
	// "Hand-over and epochs"). Default 30s (JetStream's default).
	QueueAckWait time.Duration
	// RecordTTL is how long ended records (released, dead-lettered) stay
	// in the bindings bucket. Default 10m.
	RecordTTL time.Duration
	// QueueMode is how node queues are consumed: QueuePinned (the default)
	// gives each node's durable consumer a priority group with one pinned
	// puller at a time, so several consumer processes may run as standbys;
	// QueuePlain creates it without a priority group, for clients that
	// cannot pull with one (run a single consumer process per node then).
	QueueMode QueueMode
	// InboxPrefix is the prefix of the reply subjects of the node's
	// connection (nats.CustomInboxPrefix, e.g. _INBOX.node-n0 with the
	// permissions of docs/permissions.md): the LOCAL handler answers only
	// reply subjects whose first token starts with its first token. Default: the
	// connection's, which is DefaultInboxPrefix unless it set its own; New
	// refuses a prefix the connection does not use.
	InboxPrefix string
	// JSDomain is the JetStream domain of the streams and buckets; "" means
	// the domain of the server the node is connected to. JetStream API
	// requests go to $JS.<domain>.API; the node publishes to the streams on
	// their plain subjects, so connect it to a server of that domain.
	JSDomain string
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Metrics, if not nil, is where New registers the node's metrics
	// (docs/metrics.md); they are read at scrape time, so a scrape costs
	// the same whatever the number of bindings. Default: none.
	Metrics prometheus.Registerer
}

// DefaultInboxPrefix is the reply subject prefix of NATS clients that set
// none.
const DefaultInboxPrefix = "_INBOX"

// QueueMode says how a node's queue consumer is set up.
type QueueMode string

const (
	// QueuePinned: priority group PriorityGroup, pinned-client policy.
	QueuePinned QueueMode = "pinned"
	// QueuePlain: a plain durable pull consumer.
	QueuePlain QueueMode = "plain"
)

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	if c.GroupHeader == "" {
		c.GroupHeader = DefaultGroupHeader
	}
	if c.MaxSpilledBytes == 0 {
		c.MaxSpilledBytes = DefaultMaxSpilledBytes
	}
	if c.MaxHeldMessages == 0 {
		c.MaxHeldMessages = DefaultMaxHeldMessages
	}
	if c.MaxHeldBytes == 0 {
		c.MaxHeldBytes = DefaultMaxHeldBytes
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = DefaultCheckpoint
	}
	if c.IngressMaxAge == 0 {
		c.IngressMaxAge = DefaultIngressMaxAge
	}
	if c.DeadLetterMaxAge == 0 {
		c.DeadLetterMaxAge = DefaultDeadLetterMaxAge
	}
	if c.EventsMaxAge == 0 {
		c.EventsMaxAge = DefaultEventsMaxAge
	}
	if c.PinnedTTL == 0 {
		c.PinnedTTL = DefaultPinnedTTL
	}
	if c.QueueMode == "" {
		c.QueueMode = QueuePinned
	}
	if c.ReaperPeriod <= 0 {
		c.ReaperPeriod = 30 * time.Second
	}
	if c.NodeGrace <= 0 {
		c.NodeGrace = 15 * time.Second
	}
	if c.RebindAfter == 0 {
		c.RebindAfter = 30 * time.Second
	}
	if c.QueueAckWait <= 0 {
		c.QueueAckWait = DefaultQueueAckWait
	}
	if c.RecordTTL <= 0 {
		c.RecordTTL = 10 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks the configuration; errors wrap ErrConfig.
func (c Config) Validate() error {
	if strings.TrimSpace(c.Name) == "" {
		return fmt.Errorf("%w: name is empty", ErrConfig)
	}
	if err := kvbinding.ValidateNodeID(c.Name); err != nil {
		return fmt.Errorf("%w: name: %v", ErrConfig, strings.Replace(err.Error(), "node id", "name", 1))
	}
	if c.Type != Local && c.Type != Remote {
		return fmt.Errorf("%w: unknown type %q (want LOCAL or REMOTE)", ErrConfig, c.Type)
	}
	if err := ValidateAddress(c.Address); err != nil {
		return err
	}
	if c.Timeout <= 0 {
		return fmt.Errorf("%w: timeout must be > 0, got %v", ErrConfig, c.Timeout)
	}
	if err := kvbinding.ValidateNodeID(c.Node); err != nil {
		return fmt.Errorf("%w: node: %v", ErrConfig, err)
	}
	if c.GroupHeader != "" && !validHeaderName(c.GroupHeader) {
		return fmt.Errorf("%w: group header %q is not a valid header name", ErrConfig, c.GroupHeader)
	}
	if c.QueueMode != "" && c.QueueMode != QueuePinned && c.QueueMode != QueuePlain {
		return fmt.Errorf("%w: queue mode %q (want pinned or plain)", ErrConfig, c.QueueMode)
	}
	if c.InboxPrefix != "" && !validPrefix(c.InboxPrefix) {
		return fmt.Errorf("%w: inbox prefix %q: want subject tokens without wildcards", ErrConfig, c.InboxPrefix)
	}
	if c.JSDomain != "" && strings.ContainsAny(c.JSDomain, ". \t\r\n*>") {
		return fmt.Errorf("%w: JetStream domain %q: want one subject token", ErrConfig, c.JSDomain)
	}
	switch {
	case c.MaxAttempts < 0:
		return fmt.Errorf("%w: max attempts must be >= 0, got %d", ErrConfig, c.MaxAttempts)
	case c.MaxHeldMessages < 0, c.MaxHeldBytes < 0, c.MaxInFlight < 0:
		return fmt.Errorf("%w: held/in-flight bounds must be > 0", ErrConfig)
	case c.MaxBatch < 0 || c.MaxBatch > maxAtomicBatch:
		return fmt.Errorf("%w: max batch must be 0 (default) to %d, got %d", ErrConfig, maxAtomicBatch, c.MaxBatch)
	case c.Replicas < 0 || c.Replicas > 5:
		return fmt.Errorf("%w: replicas must be 0 (auto) to 5, got %d", ErrConfig, c.Replicas)
	case c.IngressMaxBytes < 0, c.QueueMaxBytes < 0, c.DeadLetterMaxBytes < 0, c.BindingsMaxBytes < 0, c.MaxMessageSize < 0:
		return fmt.Errorf("%w: size bounds must be >= 0 (0: none)", ErrConfig)
	case c.Heartbeat < 0, c.LeaseTTL < 0, c.CheckpointInterval < 0, c.IngressMaxAge < 0, c.EventsMaxAge < 0, c.PinnedTTL < 0, c.DeadLetterMaxAge < 0:
		return fmt.Errorf("%w: durations must be > 0", ErrConfig)
	}
	return nil
}

// ValidateAddress checks a grouping-handler address: one or more subject
// tokens, no wildcards, not inside the router's own grouping.> namespace
// and not a system ($...) subject.
func ValidateAddress(a string) error {
	if a == "" {
		return fmt.Errorf("%w: address is empty", ErrConfig)
	}
	if strings.HasPrefix(a, "$") {
		return fmt.Errorf("%w: address %q is a system subject", ErrConfig, a)
	}
	for _, tok := range strings.Split(a, ".") {
		if tok == "" {
			return fmt.Errorf("%w: address %q has an empty token", ErrConfig, a)
		}
		if tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n*>") {
			return fmt.Errorf("%w: address %q must not contain wildcards or whitespace", ErrConfig, a)
		}
	}
	if first, _, _ := strings.Cut(a, "."); first == "grouping" {
		return fmt.Errorf("%w: address %q overlaps grouping.>, the router's own subjects", ErrConfig, a)
	}
	return nil
}

// ValidHeaderName is wire.ValidHeaderName.
func ValidHeaderName(h string) bool { return wire.ValidHeaderName(h) }

func validHeaderName(h string) bool { return wire.ValidHeaderName(h) }

// validPrefix accepts subject tokens without wildcards or whitespace.
func validPrefix(p string) bool {
	for _, tok := range strings.Split(p, ".") {
		if tok == "" || strings.ContainsAny(tok, " \t\r\n*>") {
			return false
		}
	}
	return true
}
