package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/grouprouter/grouprouter/internal/localnats"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// Defaults for what neither the configuration file nor a flag sets.
const (
	defaultName     = "grouping-handler"
	defaultType     = router.Local
	defaultAddress  = "jms"
	defaultTimeout  = router.DefaultTimeout
	defaultListen   = "127.0.0.1:4222"
	defaultNATSURL  = "nats://127.0.0.1:4222"
	defaultLogLevel = "info"
	defaultQueue    = router.QueuePinned
	fallbackNode    = "grouprouter"
	// defaultSync is the embedded server's fsync policy: every write on
	// disk before its PubAck (what `grouprouter bench --sync always`
	// measured it costs: README, Benchmarks).
	defaultSync = "always"

	// Group lifecycle defaults, as router.Config's (the group timeout's is never).
	defaultReaperPeriod = 30 * time.Second
	defaultNodeGrace    = 15 * time.Second
	defaultRebindAfter  = 30 * time.Second
)

// Rebalancing defaults, as proposals.DefaultRebalance's.
var (
	defaultRebalanceTolerance = proposals.DefaultRebalance.Tolerance
	defaultRebalanceMoves     = proposals.DefaultRebalance.MaxMoves
	defaultRebalanceCoolDown  = proposals.DefaultRebalance.CoolDown
)

// usageError is a command-line mistake (unknown flag, stray argument,
// malformed flag value). It exits with exitUsage.
type usageError struct {
	cmd string // subcommand, for the message
	msg string
}

func (e *usageError) Error() string {
	return fmt.Sprintf("%s (see 'grouprouter %s -h')", e.msg, e.cmd)
}

// runOptions is everything the run subcommand needs, merged and validated.
type runOptions struct {
	// cfg is validated; its Logger is set when the command starts.
	cfg router.Config
	// file is the parsed --config file, or nil.
	file *fileConfig
	// conn are the connection settings; conn.URL empty means start the
	// embedded server and connect to it.
	conn connSettings
	// embedded is the embedded server's configuration, nil when joining
	// servers; listen and storeDir are its address and store.
	embedded *server.Options
	listen   string
	storeDir string
	logLevel slog.Level
	logJSON  bool
	// httpAddr is --http's HOST:PORT, "" when off.
	httpAddr string
}

// runFlags holds the run subcommand's flag values before merging.
type runFlags struct {
	fs           *flag.FlagSet
	opts         runOptions // merged by check
	conn         *connFlags
	config       string
	serverConfig string
	node         string
	typ          string
	address      string
	timeout      msDuration
	groupTimeout msDuration
	reaperPeriod msDuration
	nodeGrace    msDuration
	rebindAfter  msDuration
	rebalance    bool
	rbTolerance  int
	rbMoves      int
	rbCoolDown   msDuration
	eventsMaxAge msDuration
	dlqMaxAge    msDuration
	ingressBytes int64
	queueBytes   int64
	dlqBytes     int64
	bindingBytes int64
	maxMsgSize   int
	maxHeld      int
	maxHeldBytes int64
	maxGroups    int
	maxSpilled   int64
	groupShare   int
	name         string
	groupHeader  string
	localFirst   bool
	maxAttempts  int
	replicas     int
	queueMode    string
	queueAckWait msDuration
	logLevel     string
	logJSON      bool
	listen       string
	storeDir     string
	sync         string
	httpAddr     string
}

func newRunFlags(fs *flag.FlagSet) action {
	f := &runFlags{
		fs:           fs,
		timeout:      msDuration(defaultTimeout),
		reaperPeriod: msDuration(defaultReaperPeriod),
		nodeGrace:    msDuration(defaultNodeGrace),
		rebindAfter:  msDuration(defaultRebindAfter),
		rbCoolDown:   msDuration(defaultRebalanceCoolDown),
		eventsMaxAge: msDuration(router.DefaultEventsMaxAge),
		dlqMaxAge:    msDuration(router.DefaultDeadLetterMaxAge),
	}
	fs.StringVar(&f.config, "config", "", "read the `FILE` holding a <grouping-handler> element (flags override it)")
	f.conn = addConnFlags(fs, "join the NATS servers at `URL`s, comma-separated (env "+envURL+"); without servers to join an embedded server is started")
	fs.StringVar(&f.node, "node", "", "this node's `ID`, [A-Za-z0-9_-]{1,64} (default: the host name, sanitized)")
	fs.StringVar(&f.typ, "type", string(defaultType), "grouping-handler `TYPE`: LOCAL (decides; a second LOCAL is its backup) or REMOTE")
	fs.StringVar(&f.address, "address", defaultAddress, "producers publish on `ADDRESS`.>")
	fs.Var(&f.timeout, "timeout", "how long a routing decision may take: a `DURATION` like 5s, or milliseconds like 5000")
	fs.Var(&f.groupTimeout, "group-timeout",
		"Artemis group-timeout: a binding expires after no message of its group for this `DURATION` (5m, or milliseconds); -1 or 0 = never, the default")
	fs.Var(&f.reaperPeriod, "reaper-period", "how often expired bindings are looked for: a `DURATION` (or milliseconds)")
	fs.Var(&f.nodeGrace, "node-grace",
		"how long a node may be gone before the LOCAL handler moves its groups to live nodes: a `DURATION` (or milliseconds); keep it well under 2m")
	fs.Var(&f.rebindAfter, "rebind-after",
		"how long a node's queue may have no consumer while another node's has one before its groups move, waiting messages included: a `DURATION` (or milliseconds); negative = never")
	fs.BoolVar(&f.rebalance, "rebalance", true,
		"the LOCAL handler moves groups, idle ones first, from nodes above their share (groups / nodes with a queue consumer) plus the tolerance to nodes below it; --rebalance=false: groups move only when a node is gone or has no consumer, or by the operator")
	fs.IntVar(&f.rbTolerance, "rebalance-tolerance", defaultRebalanceTolerance, "rebalancing: how many `N` groups a node may hold above or below its share")
	fs.IntVar(&f.rbMoves, "rebalance-rate", defaultRebalanceMoves, "rebalancing: at most `N` groups moved per handler tick (a quarter of the lease TTL, 0.5s by default)")
	fs.Var(&f.rbCoolDown, "rebalance-cool-down", "rebalancing: a group is not moved again within this `DURATION` (or milliseconds) of its last move")
	fs.Var(&f.eventsMaxAge, "events-max-age",
		"how long the stream "+router.EventsStream+" keeps events, when this node creates it: a `DURATION` (or milliseconds)")
	fs.Var(&f.dlqMaxAge, "dlq-max-age", "how long "+router.DeadLetterStream+" keeps dead letters, when this node creates it: a `DURATION`")
	fs.Int64Var(&f.ingressBytes, "ingress-max-bytes", 0, "bound "+router.IngressStream+" to `BYTES` when this node creates it (0: none); past it producers get an error, nothing is dropped")
	fs.Int64Var(&f.queueBytes, "queue-max-bytes", 0, "bound "+router.QueueStream+" to `BYTES` (0: none); past it routing waits and retries")
	fs.Int64Var(&f.dlqBytes, "dlq-max-bytes", 0, "bound "+router.DeadLetterStream+" to `BYTES` (0: none); past it new dead letters are refused and their groups wait (an aggregated warning) until room is made")
	fs.Int64Var(&f.bindingBytes, "bindings-max-bytes", 0, "bound the bindings bucket to `BYTES` (0: none); past it new bindings wait until ended records expire")
	fs.IntVar(&f.maxMsgSize, "max-msg-size", 0, "the largest message `BYTES` the ingress accepts (0: the server's max_payload)")
	fs.IntVar(&f.maxHeld, "max-held", router.DefaultMaxHeldMessages, "at most `N` messages held in memory (read ahead, awaiting a decision or their group's previous publish); past it the node stops reading: back-pressure, no loss")
	fs.Int64Var(&f.maxHeldBytes, "max-held-bytes", router.DefaultMaxHeldBytes, "at most `BYTES` of messages held in memory (the process's heap grows to about 2-3 times this under full read-ahead)")
	fs.Int64Var(&f.maxSpilled, "max-spilled-bytes", router.DefaultMaxSpilledBytes, "past half of --max-held-bytes (or --max-held), a message waiting for a decision keeps only its sequence (about 160 bytes and its group id) and is read again from the ingress when it is published, so that a flood of new groups does not stop the node's reading: at most `BYTES` of such messages (0: never; the node then stops reading at its held bounds)")
	fs.IntVar(&f.groupShare, "group-share", 0, "at most `N` of a group's messages unacknowledged on this node's queue: past it the group's next messages wait, in order, on the node's held subject, so that one busy or stuck group never fills the queue consumer's window and holds the others back (0: half the window shared by the busy groups, at least 16 each; -1: no bound)")
	fs.IntVar(&f.maxGroups, "max-groups", proposals.DefaultMaxGroups, "LOCAL: at most `N` groups bound at once in the cluster (every node caches each binding); a new group past it is refused: its messages go to "+router.DeadLetterStream+" with the reason, with an aggregated warning and a \"limit\" event (0: no limit)")
	fs.StringVar(&f.name, "name", defaultName, "grouping-handler `NAME`; a LOCAL handler and its backup share it")
	fs.StringVar(&f.groupHeader, "group-header", router.DefaultGroupHeader, "`HEADER` holding the group id")
	fs.BoolVar(&f.localFirst, "local-first", false, "propose this node for new groups when its queue has a consumer")
	fs.IntVar(&f.maxAttempts, "max-attempts", 0, "dead-letter a group's held messages after `N` failed decisions (0 = never)")
	fs.IntVar(&f.replicas, "replicas", 0, "`N` replicas of streams and buckets (0 = 3 on a clustered server, 1 if the cluster cannot place 3 within 10 s or the server is standalone)")
	fs.StringVar(&f.queueMode, "queue-mode", string(defaultQueue),
		"how the node's queue is consumed: `MODE` pinned (pull with priority group \""+router.PriorityGroup+"\"; one pinned consumer process, others stand by) or plain (no priority group, for clients that cannot pull with one; run one consumer process per node)")
	f.queueAckWait = msDuration(router.DefaultQueueAckWait)
	fs.Var(&f.queueAckWait, "queue-ack-wait",
		"the queue consumers' ack wait (`DURATION`): a delivered message neither acked nor marked in progress within it is delivered again; a move waits for the old consumer while it acks, and takes what it holds once it made no progress for this long")
	fs.StringVar(&f.logLevel, "log-level", defaultLogLevel, "`LEVEL`: debug, info, warn or error")
	fs.BoolVar(&f.logJSON, "log-json", false, "log JSON lines instead of text")
	fs.StringVar(&f.listen, "listen", defaultListen, "embedded server: listen on `HOST:PORT`")
	fs.StringVar(&f.storeDir, "store-dir", "", "embedded server: JetStream store `DIR` (default: the user's data directory + /grouprouter)")
	fs.StringVar(&f.sync, "sync", defaultSync,
		"embedded server: fsync `POLICY`: always (every write is on disk before its PubAck) or a DURATION between background flushes "+
			"(nats-server's default is 2m: an OS crash or power loss then loses what was acknowledged since the last flush); a --server-config sync_interval stands unless --sync is given")
	fs.StringVar(&f.httpAddr, "http", "", "serve /metrics, /healthz, /readyz and the status page / on `HOST:PORT` (default: off)")
	fs.StringVar(&f.serverConfig, "server-config", "",
		"embedded server: nats-server configuration `FILE` (its users, TLS, ...); --listen and --store-dir override it; listening beyond loopback needs authentication and TLS in it")
	return f
}

// runHelp is the run command's help.
const runHelp = `Usage: grouprouter run [flags]

Runs a grouprouter node. Settings come from, in order of precedence: flags,
the <grouping-handler> element of --config, defaults
(name grouping-handler, type LOCAL, address jms, timeout 5s, group-timeout
never, reaper-period 30s). The file's <timeout>, <group-timeout> and
<reaper-period> are milliseconds, -1 meaning never for the last two.
`

// runFlagSections group run's flags in its -h.
var runFlagSections = []flagSection{
	{"Node flags", []string{"config", "node", "type", "name", "address", "timeout", "group-header", "local-first", "max-attempts",
		"queue-mode", "queue-ack-wait", "replicas"}},
	{"Grouping flags (bindings, moves, rebalancing)", []string{"group-timeout", "reaper-period", "node-grace", "rebind-after",
		"rebalance", "rebalance-tolerance", "rebalance-rate", "rebalance-cool-down", "group-share", "max-groups"}},
	{"Connection flags (to join NATS servers)", []string{"nats", "context", "user", "password", "creds", "nkey", "inbox-prefix",
		"js-domain", "js-api-prefix"}},
	{"TLS flags", []string{"tlsca", "tlscert", "tlskey", "tlsfirst"}},
	{"Embedded server flags (without servers to join)", []string{"listen", "store-dir", "sync", "server-config"}},
	{"Limits flags", []string{"max-held", "max-held-bytes", "max-spilled-bytes", "max-msg-size", "ingress-max-bytes",
		"queue-max-bytes", "dlq-max-bytes", "bindings-max-bytes", "events-max-age", "dlq-max-age"}},
	{"Logging and monitoring flags", []string{"log-level", "log-json", "http"}},
}

// check merges the parsed flags with --config and the defaults into
// f.opts, and validates the result. It returns errors wrapping
// router.ErrConfig for invalid settings. It touches no network and
// creates no directory.
func (f *runFlags) check(in *invocation) error {
	var err error
	f.opts, err = f.merge(in.env)
	return err
}

// merge merges the parsed flags with --config and the defaults.
func (f *runFlags) merge(env environment) (runOptions, error) {
	set := make(map[string]bool)
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })

	var opts runOptions
	var file fileConfig
	if set["config"] {
		var err error
		if file, err = loadConfigFile(f.config); err != nil {
			return runOptions{}, err
		}
		opts.file = &file
	}

	// Precedence: an explicit flag, then the file, then the flag's default.
	name := f.name
	if !set["name"] && file.Name != "" {
		name = file.Name
	}
	typ := f.typ
	if !set["type"] && file.Type != nil {
		typ = *file.Type
	}
	address := f.address
	if !set["address"] && file.Address != nil {
		address = *file.Address
	}
	timeout := time.Duration(f.timeout)
	if !set["timeout"] && file.TimeoutMS != nil {
		timeout = time.Duration(*file.TimeoutMS) * time.Millisecond
	}
	ht, err := router.ParseHandlerType(typ)
	if err != nil {
		return runOptions{}, err
	}
	lc, err := mergeLifecycle(f, set, file)
	if err != nil {
		return runOptions{}, err
	}
	if f.queueAckWait < msDuration(time.Second) {
		return runOptions{}, fmt.Errorf("%w: queue-ack-wait must be at least 1s, got %v", router.ErrConfig, time.Duration(f.queueAckWait))
	}
	queueMode := router.QueueMode(strings.ToLower(strings.TrimSpace(f.queueMode)))
	if queueMode == "" { // Validate would take it for the default
		return runOptions{}, fmt.Errorf("%w: queue mode %q (want pinned or plain)", router.ErrConfig, f.queueMode)
	}
	node := f.node
	if !set["node"] {
		node = sanitizeNodeID(env.hostname())
	}
	if opts.conn, err = f.conn.resolve(env, ""); err != nil {
		return runOptions{}, err
	}
	opts.cfg = router.Config{
		Name:        name,
		Type:        ht,
		Address:     address,
		Timeout:     timeout,
		Node:        node,
		GroupHeader: f.groupHeader,
		LocalFirst:  f.localFirst,
		MaxAttempts: f.maxAttempts,
		Replicas:    f.replicas,
		QueueMode:   queueMode,

		QueueAckWait: time.Duration(f.queueAckWait),

		GroupTimeout: lc.groupTimeout,
		ReaperPeriod: lc.reaperPeriod,
		NodeGrace:    lc.nodeGrace,
		RebindAfter:  lc.rebindAfter,
		Rebalance: &proposals.RebalanceConfig{Enabled: f.rebalance, Tolerance: f.rbTolerance, MaxMoves: f.rbMoves,
			CoolDown: time.Duration(f.rbCoolDown)},
		EventsMaxAge: time.Duration(f.eventsMaxAge),

		DeadLetterMaxAge:   time.Duration(f.dlqMaxAge),
		IngressMaxBytes:    f.ingressBytes,
		QueueMaxBytes:      f.queueBytes,
		DeadLetterMaxBytes: f.dlqBytes,
		BindingsMaxBytes:   f.bindingBytes,
		MaxMessageSize:     int32(min(f.maxMsgSize, 1<<31-1)),
		MaxHeldMessages:    f.maxHeld,
		MaxHeldBytes:       f.maxHeldBytes,
		MaxGroups:          f.maxGroups,
		MaxSpilledBytes:    f.maxSpilled,
		GroupShare:         f.groupShare,

		InboxPrefix: opts.conn.InboxPrefix,
		JSDomain:    opts.conn.JSDomain,
	}
	if opts.conn.JSAPIPrefix != "" {
		return runOptions{}, fmt.Errorf("%w: --js-api-prefix: a router node connects in the router's own account (the prefix is for consumers in another account; see docs/permissions.md)", router.ErrConfig)
	}
	if f.rbTolerance < 0 || f.rbMoves <= 0 || f.rbCoolDown <= 0 {
		return runOptions{}, fmt.Errorf("%w: rebalance-tolerance must be >= 0, rebalance-rate and rebalance-cool-down > 0, got %d, %d and %v",
			router.ErrConfig, f.rbTolerance, f.rbMoves, time.Duration(f.rbCoolDown))
	}
	if f.maxMsgSize < 0 {
		return runOptions{}, fmt.Errorf("%w: max-msg-size must be >= 0, got %d", router.ErrConfig, f.maxMsgSize)
	}
	if f.maxGroups == 0 {
		opts.cfg.MaxGroups = -1 // none
	}
	if f.maxSpilled == 0 {
		opts.cfg.MaxSpilledBytes = -1 // never spill
	}
	if f.maxSpilled < 0 {
		return runOptions{}, fmt.Errorf("%w: max-spilled-bytes must be >= 0 (0: never spill), got %d", router.ErrConfig, f.maxSpilled)
	}
	if f.maxGroups < 0 {
		return runOptions{}, fmt.Errorf("%w: max-groups must be >= 0 (0: no limit), got %d", router.ErrConfig, f.maxGroups)
	}
	if f.maxHeld <= 0 || f.maxHeldBytes <= 0 {
		return runOptions{}, fmt.Errorf("%w: max-held and max-held-bytes must be > 0, got %d and %d", router.ErrConfig, f.maxHeld, f.maxHeldBytes)
	}
	if opts.cfg.DeadLetterMaxAge <= 0 {
		return runOptions{}, fmt.Errorf("%w: dlq-max-age must be > 0, got %v", router.ErrConfig, opts.cfg.DeadLetterMaxAge)
	}
	if opts.cfg.EventsMaxAge <= 0 {
		return runOptions{}, fmt.Errorf("%w: events-max-age must be > 0, got %v", router.ErrConfig, opts.cfg.EventsMaxAge)
	}
	if err := opts.cfg.Validate(); err != nil {
		return runOptions{}, err
	}

	if opts.logLevel, err = parseLogLevel(f.logLevel); err != nil {
		return runOptions{}, err
	}
	opts.logJSON = f.logJSON
	if set["http"] {
		if opts.httpAddr, err = checkHTTPAddr(f.httpAddr); err != nil {
			return runOptions{}, err
		}
	}

	if opts.conn.URL != "" {
		for _, embeddedOnly := range []string{"listen", "store-dir", "server-config", "sync"} {
			if set[embeddedOnly] {
				return runOptions{}, fmt.Errorf("%w: --%s configures the embedded server, but %s names NATS servers to join; use one or the other",
					router.ErrConfig, embeddedOnly, opts.conn.urlSource)
			}
		}
		return opts, nil
	}
	if opts.listen, err = checkListen(f.listen); err != nil {
		return runOptions{}, err
	}
	opts.storeDir = f.storeDir
	if !set["store-dir"] {
		if opts.storeDir, err = defaultStoreDir(env.goos, env.getenv); err != nil {
			return runOptions{}, fmt.Errorf("%w: %v; set --store-dir", router.ErrConfig, err)
		}
	} else if strings.TrimSpace(opts.storeDir) == "" {
		return runOptions{}, fmt.Errorf("%w: --store-dir is empty", router.ErrConfig)
	}
	sync, err := localnats.ParseSync(f.sync)
	if err != nil {
		return runOptions{}, fmt.Errorf("%w: --sync %q: want always or a duration such as 1s", router.ErrConfig, f.sync)
	}
	if opts.embedded, err = embeddedOptions(opts.listen, set["listen"], opts.storeDir, set["store-dir"], f.serverConfig, sync, set["sync"]); err != nil {
		return runOptions{}, err
	}
	opts.listen = net.JoinHostPort(opts.embedded.Host, strconv.Itoa(max(opts.embedded.Port, 0)))
	opts.storeDir = opts.embedded.StoreDir
	return opts, nil
}

// lifecycle is the merged group lifecycle settings, as router.Config takes
// them.
type lifecycle struct {
	groupTimeout time.Duration // 0 = never
	reaperPeriod time.Duration // 0 = never (only without a group timeout)
	nodeGrace    time.Duration
	rebindAfter  time.Duration // negative = never
}

// neverMillis is -1 as a bare number of milliseconds: the flags' and the
// file's "never" (as is 0 for --group-timeout).
const neverMillis = -time.Millisecond

// mergeLifecycle merges the lifecycle flags with the file's
// <group-timeout> and <reaper-period> (an explicit flag wins) and checks
// them. Errors wrap router.ErrConfig.
func mergeLifecycle(f *runFlags, set map[string]bool, file fileConfig) (lifecycle, error) {
	groupTimeout := time.Duration(f.groupTimeout)
	if !set["group-timeout"] && file.GroupTimeoutMS != nil {
		groupTimeout = time.Duration(*file.GroupTimeoutMS) * time.Millisecond
	}
	reaperPeriod := time.Duration(f.reaperPeriod)
	if !set["reaper-period"] && file.ReaperPeriodMS != nil {
		reaperPeriod = time.Duration(*file.ReaperPeriodMS) * time.Millisecond
	}
	lc := lifecycle{nodeGrace: time.Duration(f.nodeGrace), rebindAfter: time.Duration(f.rebindAfter)}

	switch {
	case groupTimeout == neverMillis, groupTimeout == 0:
	case groupTimeout < 0:
		return lifecycle{}, fmt.Errorf("%w: group-timeout must be > 0, or -1 or 0 for never, got %v", router.ErrConfig, groupTimeout)
	default:
		lc.groupTimeout = groupTimeout
	}
	switch {
	case reaperPeriod == neverMillis, reaperPeriod == 0:
		if lc.groupTimeout > 0 {
			return lifecycle{}, fmt.Errorf("%w: reaper-period must be > 0 when group-timeout is set (group-timeout %v, reaper-period %s)",
				router.ErrConfig, lc.groupTimeout, neverOr(reaperPeriod))
		}
	case reaperPeriod < 0:
		return lifecycle{}, fmt.Errorf("%w: reaper-period must be > 0, or -1 for never, got %v", router.ErrConfig, reaperPeriod)
	default:
		lc.reaperPeriod = reaperPeriod
	}
	if lc.nodeGrace <= 0 {
		return lifecycle{}, fmt.Errorf("%w: node-grace must be > 0, got %v", router.ErrConfig, lc.nodeGrace)
	}
	if lc.rebindAfter == 0 {
		return lifecycle{}, fmt.Errorf("%w: rebind-after must be > 0, or negative for never, got 0s", router.ErrConfig)
	}
	return lc, nil
}

// neverOr renders a lifecycle duration, "never" for -1 and 0.
func neverOr(d time.Duration) string {
	if d == neverMillis || d == 0 {
		return "never"
	}
	return d.String()
}

// environment is what parseRunArgs reads from the process, replaceable in tests.
type environment struct {
	goos     string
	getenv   func(string) string
	hostname func() string
	// stdin is what publish --stdin reads (nil: none).
	stdin io.Reader
}

// osEnvironment is the real process environment.
func osEnvironment() environment {
	return environment{
		goos:   runtime.GOOS,
		getenv: os.Getenv,
		hostname: func() string {
			h, _ := os.Hostname()
			return h
		},
		stdin: os.Stdin,
	}
}

// sanitizeNodeID turns a host name into a valid node id: every byte
// outside [A-Za-z0-9_-] becomes '-', at most kvbinding.MaxNodeIDLen long.
func sanitizeNodeID(host string) string {
	b := []byte(host)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '-'
		}
	}
	if len(b) > kvbinding.MaxNodeIDLen {
		b = b[:kvbinding.MaxNodeIDLen]
	}
	if len(strings.Trim(string(b), "-")) == 0 {
		return fallbackNode
	}
	return string(b)
}

// parseLogLevel accepts debug, info, warn or error in any letter case.
func parseLogLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("%w: unknown log level %q (want debug, info, warn or error)", router.ErrConfig, s)
}

// checkNATSURLs checks that a server list (from source: --nats, NATS_URL
// or a context) names at least one server.
func checkNATSURLs(urls, source string) error {
	if urls == "" {
		return fmt.Errorf("%w: %s is empty", router.ErrConfig, source)
	}
	for _, u := range strings.Split(urls, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			return fmt.Errorf("%w: %s %q has an empty URL", router.ErrConfig, source, redactURLs(urls))
		}
		if why := malformedNATSURL(u); why != "" {
			return fmt.Errorf("%w: %s: malformed NATS URL %q: %s (want nats://HOST:PORT; schemes nats, tls, ws, wss)",
				router.ErrConfig, source, redactMalformed(u), why)
		}
	}
	return nil
}

// natsSchemes are the URL schemes the NATS client connects with.
var natsSchemes = []string{"nats", "tls", "ws", "wss"}

// malformedNATSURL says what is wrong with one server URL, "" if nothing:
// checked before connecting, so that a typo such as nats:/127.0.0.1:4222
// (which the client takes for host "nats") is named instead of looked up.
// As the client does, a URL without "://" is HOST[:PORT].
func malformedNATSURL(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		if strings.Contains(s, "/") {
			return `no "://" after the scheme`
		}
		scheme, rest = "nats", s
	}
	if !slices.Contains(natsSchemes, strings.ToLower(scheme)) {
		return fmt.Sprintf("unknown scheme %q", scheme)
	}
	if rest == "" || rest[0] == '/' {
		return `no host after "//"`
	}
	u, err := url.Parse(strings.ToLower(scheme) + "://" + rest)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return err.Error()
	}
	host := u.Hostname()
	switch {
	case host == "":
		return `no host after "//"`
	case strings.HasPrefix(u.Host, "["):
		if net.ParseIP(host) == nil {
			return fmt.Sprintf("invalid IPv6 address %q", host)
		}
	case strings.ContainsFunc(host, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_')
	}):
		return fmt.Sprintf("invalid host %q", host)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("port %q is not 1 to 65535", p)
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return "empty port"
	}
	return ""
}

// redactMalformed hides the password of a URL that may not parse.
func redactMalformed(s string) string {
	at := strings.LastIndex(s, "@")
	if at < 0 {
		return s
	}
	start := strings.LastIndex(s[:at], "/") + 1
	user, _, hasPassword := strings.Cut(s[start:at], ":")
	if !hasPassword {
		return s
	}
	return s[:start] + user + ":xxxxx" + s[at:]
}

// checkListen validates --listen as HOST:PORT.
func checkListen(hp string) (string, error) {
	host, port, err := net.SplitHostPort(strings.TrimSpace(hp))
	if err != nil {
		return "", fmt.Errorf("%w: --listen %q: want HOST:PORT like %s", router.ErrConfig, hp, defaultListen)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return "", fmt.Errorf("%w: --listen %q: port must be 0 to 65535", router.ErrConfig, hp)
	}
	return net.JoinHostPort(host, port), nil
}

// msDuration is the --timeout flag: a Go duration ("5s") or a bare
// integer number of milliseconds ("5000"), as in the XML file.
type msDuration time.Duration

func (m *msDuration) String() string { return time.Duration(*m).String() }

func (m *msDuration) Set(s string) error {
	d, err := parseMillisOrDuration(s)
	if err != nil {
		return err
	}
	*m = msDuration(d)
	return nil
}

// parseMillisOrDuration parses "5s"-style durations and bare integers as
// milliseconds.
func parseMillisOrDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n > maxMillis || n < -maxMillis {
			return 0, fmt.Errorf("%d milliseconds is out of range", n)
		}
		return time.Duration(n) * time.Millisecond, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errors.New("want a duration like 5s or a number of milliseconds like 5000")
	}
	return d, nil
}
