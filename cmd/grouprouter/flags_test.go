package main

import (
	"bytes"
	"errors"
	"flag"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// testEnv is a Linux environment with a fixed host name and home.
func testEnv(host string) environment {
	return environment{
		goos:     "linux",
		getenv:   envMap{"HOME": "/home/op"}.get,
		hostname: func() string { return host },
	}
}

type envMap map[string]string

func (m envMap) get(k string) string { return m[k] }

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "grouping.xml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParseRunArgsDefaults(t *testing.T) {
	opts, err := parseRunArgs(nil, testEnv("broker-1.example.com"))
	if err != nil {
		t.Fatal(err)
	}
	want := router.Config{
		Name: "grouping-handler", Type: router.Local, Address: "jms", Timeout: 5 * time.Second,
		Node: "broker-1-example-com", GroupHeader: "Group-Id", QueueMode: router.QueuePinned,
		GroupTimeout: 0, ReaperPeriod: 30 * time.Second, NodeGrace: 15 * time.Second, RebindAfter: 30 * time.Second,
		EventsMaxAge: router.DefaultEventsMaxAge, DeadLetterMaxAge: router.DefaultDeadLetterMaxAge,
		MaxHeldMessages: router.DefaultMaxHeldMessages, MaxHeldBytes: router.DefaultMaxHeldBytes, QueueAckWait: router.DefaultQueueAckWait,
		MaxGroups: proposals.DefaultMaxGroups, MaxSpilledBytes: router.DefaultMaxSpilledBytes,
	}
	if rb := opts.cfg.Rebalance; rb == nil || *rb != (proposals.RebalanceConfig{Enabled: true, Tolerance: 1, MaxMoves: 4, CoolDown: 30 * time.Second}) {
		t.Errorf("rebalance %+v, want on, tolerance 1, 4 per tick, cool-down 30s", rb)
	}
	opts.cfg.Rebalance = nil
	if opts.cfg != want {
		t.Errorf("config\n got %+v\nwant %+v", opts.cfg, want)
	}
	if opts.conn.URL != "" || opts.listen != "127.0.0.1:4222" || opts.storeDir != "/home/op/.local/share/grouprouter" || opts.embedded == nil {
		t.Errorf("nats=%q listen=%q store=%q, want embedded on 127.0.0.1:4222 in the XDG data dir", opts.conn.URL, opts.listen, opts.storeDir)
	}
	if opts.logLevel != slog.LevelInfo || opts.logJSON || opts.file != nil {
		t.Errorf("log level %v json %v file %v", opts.logLevel, opts.logJSON, opts.file)
	}
}

func TestParseRunArgsMerge(t *testing.T) {
	file := writeFile(t, `<configuration xmlns="urn:activemq:core">
  <grouping-handler name="orders-handler">
    <type>REMOTE</type>
    <address>orders</address>
    <timeout>2500</timeout>
    <group-timeout>60000</group-timeout>
  </grouping-handler>
</configuration>`)
	partial := writeFile(t, `<grouping-handler name="partial"><address>billing.eu</address></grouping-handler>`)

	tests := []struct {
		name string
		args []string
		want router.Config
	}{
		{
			name: "file only",
			args: []string{"--config", file, "--node", "n1"},
			want: router.Config{Name: "orders-handler", Type: router.Remote, Address: "orders", Timeout: 2500 * time.Millisecond, Node: "n1", GroupHeader: "Group-Id", QueueMode: router.QueuePinned, GroupTimeout: time.Minute},
		},
		{
			name: "flags override the file, unset flags keep it",
			args: []string{"--config", file, "--node", "n1", "--type", "local", "--timeout", "3s", "--group-header", "JMSXGroupID"},
			want: router.Config{Name: "orders-handler", Type: router.Local, Address: "orders", Timeout: 3 * time.Second, Node: "n1", GroupHeader: "JMSXGroupID", QueueMode: router.QueuePinned, GroupTimeout: time.Minute},
		},
		{
			name: "flags before and after, single dash, bare milliseconds",
			args: []string{"-name", "other", "--config", file, "-address=payments", "--timeout", "750", "--node", "n2"},
			want: router.Config{Name: "other", Type: router.Remote, Address: "payments", Timeout: 750 * time.Millisecond, Node: "n2", GroupHeader: "Group-Id", QueueMode: router.QueuePinned, GroupTimeout: time.Minute},
		},
		{
			name: "file sets some, defaults fill the rest",
			args: []string{"--config", partial, "--node", "n3"},
			want: router.Config{Name: "partial", Type: router.Local, Address: "billing.eu", Timeout: 5 * time.Second, Node: "n3", GroupHeader: "Group-Id", QueueMode: router.QueuePinned},
		},
		{
			name: "a flag set to its default value still overrides the file",
			args: []string{"--config", file, "--node", "n4", "--type", "LOCAL", "--address", "jms", "--timeout", "5s", "--name", "grouping-handler"},
			want: router.Config{Name: "grouping-handler", Type: router.Local, Address: "jms", Timeout: 5 * time.Second, Node: "n4", GroupHeader: "Group-Id", QueueMode: router.QueuePinned, GroupTimeout: time.Minute},
		},
		{
			name: "plain queue mode, any letter case",
			args: []string{"--node", "n6", "--queue-mode", " Plain "},
			want: router.Config{Name: "grouping-handler", Type: router.Local, Address: "jms", Timeout: 5 * time.Second, Node: "n6", GroupHeader: "Group-Id",
				QueueMode: router.QueuePlain},
		},
		{
			name: "the remaining flags",
			args: []string{"--node", "n5", "--local-first", "--max-attempts", "3", "--replicas", "3", "--nats", "nats://a:4222,nats://b:4222",
				"--max-held", "5000", "--max-held-bytes", "1048576"},
			want: router.Config{Name: "grouping-handler", Type: router.Local, Address: "jms", Timeout: 5 * time.Second, Node: "n5", GroupHeader: "Group-Id",
				LocalFirst: true, MaxAttempts: 3, Replicas: 3, QueueMode: router.QueuePinned, MaxHeldMessages: 5000, MaxHeldBytes: 1 << 20},
		},
		{
			name: "events max age",
			args: []string{"--node", "n7", "--events-max-age", "90m"},
			want: router.Config{Name: "grouping-handler", Type: router.Local, Address: "jms", Timeout: 5 * time.Second, Node: "n7", GroupHeader: "Group-Id",
				QueueMode: router.QueuePinned, EventsMaxAge: 90 * time.Minute, DeadLetterMaxAge: router.DefaultDeadLetterMaxAge},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, err := parseRunArgs(tt.args, testEnv("host"))
			if err != nil {
				t.Fatal(err)
			}
			// Rebalancing is compared by value (TestRebalanceFlags
			// covers its flags): the defaults here.
			wantRB := proposals.RebalanceConfig{Enabled: true, Tolerance: 1, MaxMoves: 4, CoolDown: 30 * time.Second}
			if opts.cfg.Rebalance == nil || *opts.cfg.Rebalance != wantRB {
				t.Errorf("rebalance %+v, want %+v", opts.cfg.Rebalance, wantRB)
			}
			opts.cfg.Rebalance = nil
			if want := withLifecycleDefaults(tt.want); opts.cfg != want {
				t.Errorf("config\n got %+v\nwant %+v", opts.cfg, want)
			}
		})
	}

	opts, err := parseRunArgs([]string{"--config", file}, testEnv("host"))
	if err != nil {
		t.Fatal(err)
	}
	if opts.file == nil || opts.file.GroupTimeoutMS == nil || *opts.file.GroupTimeoutMS != 60000 {
		t.Errorf("group-timeout not kept from the file: %+v", opts.file)
	}
}

// withLifecycleDefaults fills the group lifecycle settings c leaves zero
// with the run defaults (GroupTimeout 0 is never, the default).
func withLifecycleDefaults(c router.Config) router.Config {
	if c.ReaperPeriod == 0 {
		c.ReaperPeriod = 30 * time.Second
	}
	if c.NodeGrace == 0 {
		c.NodeGrace = 15 * time.Second
	}
	if c.RebindAfter == 0 {
		c.RebindAfter = 30 * time.Second
	}
	if c.EventsMaxAge == 0 {
		c.EventsMaxAge = router.DefaultEventsMaxAge
	}
	if c.DeadLetterMaxAge == 0 {
		c.DeadLetterMaxAge = router.DefaultDeadLetterMaxAge
	}
	if c.MaxHeldMessages == 0 {
		c.MaxHeldMessages = router.DefaultMaxHeldMessages
	}
	if c.MaxHeldBytes == 0 {
		c.MaxHeldBytes = router.DefaultMaxHeldBytes
	}
	if c.QueueAckWait == 0 {
		c.QueueAckWait = router.DefaultQueueAckWait
	}
	if c.MaxGroups == 0 {
		c.MaxGroups = proposals.DefaultMaxGroups
	}
	if c.MaxSpilledBytes == 0 {
		c.MaxSpilledBytes = router.DefaultMaxSpilledBytes
	}
	return c
}

type lifecycleSettings struct {
	groupTimeout, reaperPeriod, nodeGrace, rebindAfter time.Duration
}

func lifecycleOf(c router.Config) lifecycleSettings {
	return lifecycleSettings{c.GroupTimeout, c.ReaperPeriod, c.NodeGrace, c.RebindAfter}
}

func TestParseRunArgsLifecycle(t *testing.T) {
	both := writeFile(t, `<grouping-handler name="h"><group-timeout>60000</group-timeout><reaper-period>5000</reaper-period></grouping-handler>`)
	never := writeFile(t, `<grouping-handler name="h"><group-timeout>-1</group-timeout><reaper-period>-1</reaper-period></grouping-handler>`)
	zero := writeFile(t, `<grouping-handler name="h"><group-timeout>0</group-timeout></grouping-handler>`)
	timeoutOnly := writeFile(t, `<grouping-handler name="h"><group-timeout>1500</group-timeout></grouping-handler>`)
	reaperNever := writeFile(t, `<grouping-handler name="h"><group-timeout>60000</group-timeout><reaper-period>-1</reaper-period></grouping-handler>`)
	reaperZero := writeFile(t, `<grouping-handler name="h"><group-timeout>60000</group-timeout><reaper-period>0</reaper-period></grouping-handler>`)
	const s = time.Second
	def := lifecycleSettings{0, 30 * s, 15 * s, 30 * s}

	tests := []struct {
		name string
		args []string
		want lifecycleSettings
	}{
		{"defaults", nil, def},
		{"file", []string{"--config", both}, lifecycleSettings{time.Minute, 5 * s, 15 * s, 30 * s}},
		{"file: -1 is never", []string{"--config", never}, lifecycleSettings{0, 0, 15 * s, 30 * s}},
		{"file: group-timeout 0 is never", []string{"--config", zero}, def},
		{"file: group-timeout with the default reaper period", []string{"--config", timeoutOnly}, lifecycleSettings{1500 * time.Millisecond, 30 * s, 15 * s, 30 * s}},
		{"flags override the file", []string{"--config", both, "--group-timeout", "2m", "--reaper-period", "250"},
			lifecycleSettings{2 * time.Minute, 250 * time.Millisecond, 15 * s, 30 * s}},
		{"flag -1 overrides the file's group-timeout", []string{"--config", both, "--group-timeout", "-1"}, lifecycleSettings{0, 5 * s, 15 * s, 30 * s}},
		{"flag 0 overrides the file's group-timeout", []string{"--config", both, "--group-timeout", "0s"}, lifecycleSettings{0, 5 * s, 15 * s, 30 * s}},
		{"flag sets only the reaper period", []string{"--config", both, "--reaper-period", "1s"}, lifecycleSettings{time.Minute, s, 15 * s, 30 * s}},
		{"a reaper-period flag fixes the file's never", []string{"--config", reaperNever, "--reaper-period", "10s"}, lifecycleSettings{time.Minute, 10 * s, 15 * s, 30 * s}},
		{"group timeout flag, bare milliseconds", []string{"--group-timeout", "90000"}, lifecycleSettings{90 * s, 30 * s, 15 * s, 30 * s}},
		{"reaper never without a group timeout", []string{"--reaper-period", "-1"}, lifecycleSettings{0, 0, 15 * s, 30 * s}},
		{"node grace and rebind after", []string{"--node-grace", "2s", "--rebind-after", "500"}, lifecycleSettings{0, 30 * s, 2 * s, 500 * time.Millisecond}},
		{"rebind after never", []string{"--rebind-after", "-1"}, lifecycleSettings{0, 30 * s, 15 * s, -time.Millisecond}},
		{"rebind after negative duration", []string{"--rebind-after", "-1s"}, lifecycleSettings{0, 30 * s, 15 * s, -s}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, err := parseRunArgs(append([]string{"--node", "n1"}, tt.args...), testEnv("h"))
			if err != nil {
				t.Fatal(err)
			}
			if got := lifecycleOf(opts.cfg); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}

	errTests := []struct {
		name  string
		args  []string
		usage bool
		want  string
	}{
		{"reaper never with a group timeout, file", []string{"--config", reaperNever},
			false, "reaper-period must be > 0 when group-timeout is set (group-timeout 1m0s, reaper-period never)"},
		{"reaper 0 with a group timeout, file", []string{"--config", reaperZero}, false, "reaper-period must be > 0 when group-timeout is set"},
		{"reaper never flag with the file's group timeout", []string{"--config", both, "--reaper-period", "-1"}, false, "reaper-period must be > 0 when group-timeout is set"},
		{"reaper 0 flag with a group timeout flag", []string{"--group-timeout", "1m", "--reaper-period", "0"}, false, "reaper-period must be > 0 when group-timeout is set"},
		{"negative reaper period", []string{"--reaper-period", "-5s"}, false, "reaper-period must be > 0, or -1 for never, got -5s"},
		{"negative group timeout", []string{"--group-timeout", "-2s"}, false, "group-timeout must be > 0, or -1 or 0 for never, got -2s"},
		{"zero node grace", []string{"--node-grace", "0"}, false, "node-grace must be > 0, got 0s"},
		{"negative node grace", []string{"--node-grace", "-1s"}, false, "node-grace must be > 0, got -1s"},
		{"zero rebind after", []string{"--rebind-after", "0s"}, false, "rebind-after must be > 0, or negative for never"},
		{"queue ack wait under a second", []string{"--queue-ack-wait", "500ms"}, false, "queue-ack-wait must be at least 1s, got 500ms"},
		{"zero events max age", []string{"--events-max-age", "0"}, false, "events-max-age must be > 0, got 0s"},
		{"negative events max age", []string{"--events-max-age", "-1h"}, false, "events-max-age must be > 0, got -1h0m0s"},
		{"malformed group timeout", []string{"--group-timeout", "soon"}, true, `invalid value "soon" for flag -group-timeout`},
		{"malformed node grace", []string{"--node-grace", "15 s"}, true, `invalid value "15 s" for flag -node-grace`},
	}
	for _, tt := range errTests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseRunArgs(append([]string{"--node", "n1"}, tt.args...), testEnv("h"))
			if err == nil {
				t.Fatal("accepted")
			}
			var ue *usageError
			if tt.usage != errors.As(err, &ue) {
				t.Errorf("usage error = %v, want %v (err %v)", !tt.usage, tt.usage, err)
			}
			if !tt.usage && !errors.Is(err, router.ErrConfig) {
				t.Errorf("%v does not wrap router.ErrConfig", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q\ndoes not contain %q", err, tt.want)
			}
		})
	}
}

func TestParseRunArgsConnection(t *testing.T) {
	t.Run("nats", func(t *testing.T) {
		opts, err := parseRunArgs([]string{"--nats", " nats://a:1,nats://b:2 "}, testEnv("h"))
		if err != nil {
			t.Fatal(err)
		}
		if opts.conn.URL != "nats://a:1,nats://b:2" || opts.embedded != nil {
			t.Errorf("nats %q", opts.conn.URL)
		}
	})
	t.Run("embedded with listen and store dir", func(t *testing.T) {
		opts, err := parseRunArgs([]string{"--listen", "127.0.0.2:5222", "--store-dir", "/data/gr", "--log-level", "DEBUG", "--log-json"}, testEnv("h"))
		if err != nil {
			t.Fatal(err)
		}
		if opts.conn.URL != "" || opts.listen != "127.0.0.2:5222" || opts.storeDir != "/data/gr" || opts.logLevel != slog.LevelDebug || !opts.logJSON {
			t.Errorf("got %+v", opts)
		}
	})
}

// TestParseRunArgsSync: the embedded server syncs every write by default;
// --sync sets an interval; a --server-config sync_interval stands unless
// --sync is given.
func TestParseRunArgsSync(t *testing.T) {
	interval := writeFile(t, "jetstream { sync_interval: 5s }\n")
	always := writeFile(t, "jetstream { sync_interval: always }\n")
	tests := []struct {
		name       string
		args       []string
		wantAlways bool
		wantEvery  time.Duration
	}{
		{"default", nil, true, 2 * time.Minute},
		{"interval", []string{"--sync", "1s"}, false, time.Second},
		{"always", []string{"--sync", "ALWAYS"}, true, 2 * time.Minute},
		{"file's interval stands", []string{"--server-config", interval}, false, 5 * time.Second},
		{"flag beats the file", []string{"--server-config", interval, "--sync", "always"}, true, 2 * time.Minute},
		{"file's always stands", []string{"--server-config", always}, true, 2 * time.Minute},
		{"flag beats the file's always", []string{"--server-config", always, "--sync", "10s"}, false, 10 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, err := parseRunArgs(append([]string{"--store-dir", "/data/gr"}, tt.args...), testEnv("h"))
			if err != nil {
				t.Fatal(err)
			}
			if o := opts.embedded; o.SyncAlways != tt.wantAlways || o.SyncInterval != tt.wantEvery {
				t.Errorf("SyncAlways %v SyncInterval %v, want %v %v", o.SyncAlways, o.SyncInterval, tt.wantAlways, tt.wantEvery)
			}
		})
	}
}

func TestParseRunArgsErrors(t *testing.T) {
	badFile := writeFile(t, `<grouping-handler name="x"><timeout>soon</timeout></grouping-handler>`)
	tests := []struct {
		name  string
		args  []string
		usage bool // a *usageError rather than a config error
		want  string
	}{
		{"unknown type", []string{"--type", "BOGUS"}, false, `unknown type "BOGUS" (want LOCAL or REMOTE)`},
		{"negative timeout", []string{"--timeout", "-1s"}, false, "timeout must be > 0, got -1s"},
		{"zero timeout", []string{"--timeout", "0"}, false, "timeout must be > 0, got 0s"},
		{"malformed timeout", []string{"--timeout", "soon"}, true, `invalid value "soon" for flag -timeout`},
		{"empty address", []string{"--address", ""}, false, "address is empty"},
		{"address in grouping.>", []string{"--address", "grouping.orders"}, false, "overlaps grouping.>"},
		{"wildcard address", []string{"--address", "jms.>"}, false, "must not contain wildcards"},
		{"bad node", []string{"--node", "a.b"}, false, "node: node id"},
		{"bad name", []string{"--name", "my handler"}, false, "name:"},
		{"negative max attempts", []string{"--max-attempts", "-1"}, false, "max attempts must be >= 0"},
		{"too many replicas", []string{"--replicas", "7"}, false, "replicas must be 0 (auto) to 5"},
		{"no held messages", []string{"--max-held", "0"}, false, "max-held and max-held-bytes must be > 0, got 0 and"},
		{"negative held bytes", []string{"--max-held-bytes", "-1"}, false, "max-held and max-held-bytes must be > 0, got 100000 and -1"},
		{"bad log level", []string{"--log-level", "loud"}, false, `unknown log level "loud"`},
		{"bad queue mode", []string{"--queue-mode", "shared"}, false, `queue mode "shared" (want pinned or plain)`},
		{"empty queue mode", []string{"--queue-mode", ""}, false, `queue mode "" (want pinned or plain)`},
		{"empty nats", []string{"--nats", ""}, false, "--nats is empty"},
		{"listen with nats", []string{"--nats", "nats://x:4222", "--listen", "127.0.0.1:1"}, false, "--listen configures the embedded server"},
		{"bad listen", []string{"--listen", "4222"}, false, `--listen "4222": want HOST:PORT`},
		{"bad listen port", []string{"--listen", "127.0.0.1:99999"}, false, "port must be 0 to 65535"},
		{"empty store dir", []string{"--store-dir", ""}, false, "--store-dir is empty"},
		{"bad sync", []string{"--sync", "sometimes"}, false, `--sync "sometimes": want always or a duration`},
		{"zero sync", []string{"--sync", "0s"}, false, `--sync "0s"`},
		{"sync with nats", []string{"--nats", "nats://x:4222", "--sync", "always"}, false, "--sync configures the embedded server"},
		{"bad file", []string{"--config", badFile}, false, "<timeout> must be an integer number of milliseconds"},
		{"missing file", []string{"--config", "/nonexistent/grouping.xml"}, false, "config file: open /nonexistent/grouping.xml"},
		{"unknown flag", []string{"--bogus"}, true, "flag provided but not defined: -bogus"},
		{"stray argument", []string{"--type", "LOCAL", "extra"}, true, `unexpected argument "extra"`},
		{"non-integer replicas", []string{"--replicas", "three"}, true, `invalid value "three" for flag -replicas`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseRunArgs(tt.args, testEnv("h"))
			if err == nil {
				t.Fatal("accepted")
			}
			var ue *usageError
			if tt.usage != errors.As(err, &ue) {
				t.Errorf("usage error = %v, want %v (err %v)", !tt.usage, tt.usage, err)
			}
			if !tt.usage && !errors.Is(err, router.ErrConfig) {
				t.Errorf("%v does not wrap router.ErrConfig", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q\ndoes not contain %q", err, tt.want)
			}
		})
	}

	if _, err := parseRunArgs([]string{"-h"}, testEnv("h")); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

func TestParseRunArgsNoDataDir(t *testing.T) {
	env := environment{goos: "linux", getenv: envMap{}.get, hostname: func() string { return "h" }}
	_, err := parseRunArgs(nil, env)
	if !errors.Is(err, router.ErrConfig) || !strings.Contains(err.Error(), "set --store-dir") {
		t.Fatalf("got %v, want a config error asking for --store-dir", err)
	}
	if _, err := parseRunArgs([]string{"--store-dir", "/x"}, env); err != nil {
		t.Fatalf("with --store-dir: %v", err)
	}
	if _, err := parseRunArgs([]string{"--nats", "nats://x:4222"}, env); err != nil {
		t.Fatalf("with --nats: %v", err)
	}
}

// TestRunRejectsBadConfigBeforeConnecting checks the exit code and the one
// line on stderr, and that nothing was started: the listen address given
// is busy, and --nats points at a port nobody listens on, so an attempt
// to start or connect would fail differently (exit 1).
func TestRunRejectsBadConfigBeforeConnecting(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	storeDir := filepath.Join(t.TempDir(), "store")

	tests := []struct {
		name string
		args []string
		want string
	}{
		{"bogus type", []string{"run", "--type", "BOGUS"},
			`grouprouter: invalid configuration: unknown type "BOGUS" (want LOCAL or REMOTE)`},
		{"bogus type, embedded on a busy port", []string{"run", "--type", "BOGUS", "--listen", busy.Addr().String(), "--store-dir", storeDir},
			`grouprouter: invalid configuration: unknown type "BOGUS" (want LOCAL or REMOTE)`},
		{"negative timeout, unreachable nats", []string{"run", "--timeout", "-1s", "--nats", "nats://127.0.0.1:1"},
			"grouprouter: invalid configuration: timeout must be > 0, got -1s"},
		{"address overlaps grouping", []string{"run", "--address", "grouping", "--nats", "nats://127.0.0.1:1"},
			`grouprouter: invalid configuration: address "grouping" overlaps grouping.>, the router's own subjects`},
		{"unknown flag", []string{"run", "--bogus", "--nats", "nats://127.0.0.1:1"},
			"grouprouter run: flag provided but not defined: -bogus (see 'grouprouter run -h')"},
		{"stray argument", []string{"run", "--nats", "nats://127.0.0.1:1", "now"},
			`grouprouter run: unexpected argument "now" (see 'grouprouter run -h')`},
		{"group timeout without a reaper", []string{"run", "--group-timeout", "1m", "--reaper-period", "-1", "--nats", "nats://127.0.0.1:1"},
			"grouprouter: invalid configuration: reaper-period must be > 0 when group-timeout is set (group-timeout 1m0s, reaper-period never)"},
		{"zero node grace", []string{"run", "--node-grace", "0", "--nats", "nats://127.0.0.1:1"},
			"grouprouter: invalid configuration: node-grace must be > 0, got 0s"},
		{"bindings: unknown flag", []string{"bindings", "--every"},
			"grouprouter bindings: flag provided but not defined: -every (see 'grouprouter bindings -h')"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != exitUsage {
				t.Errorf("exit code %d, want %d; stderr: %s", code, exitUsage, stderr.String())
			}
			if got := stderr.String(); got != tt.want+"\n" {
				t.Errorf("stderr\n got %q\nwant %q", got, tt.want+"\n")
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout: %q", stdout.String())
			}
		})
	}
	if _, err := os.Stat(storeDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("store dir was created before the config was validated: %v", err)
	}
}

func TestSanitizeNodeID(t *testing.T) {
	tests := []struct{ host, want string }{
		{"node-1", "node-1"},
		{"Broker_2", "Broker_2"},
		{"broker-1.example.com", "broker-1-example-com"},
		{"höst", "h--st"},
		{"", "grouprouter"},
		{"...", "grouprouter"},
		{strings.Repeat("a", 70), strings.Repeat("a", 64)},
	}
	for _, tt := range tests {
		if got := sanitizeNodeID(tt.host); got != tt.want {
			t.Errorf("sanitizeNodeID(%q) = %q, want %q", tt.host, got, tt.want)
		}
	}
}

func TestParseMillisOrDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"5s", 5 * time.Second, true},
		{"1m30s", 90 * time.Second, true},
		{"250ms", 250 * time.Millisecond, true},
		{"5000", 5 * time.Second, true},
		{" 1 ", time.Millisecond, true},
		{"-1", -time.Millisecond, true}, // rejected later by Validate, with the value
		{"0", 0, true},
		{"5 s", 0, false},
		{"five", 0, false},
		{"", 0, false},
		{"9223372036854775807", 0, false},
	}
	for _, tt := range tests {
		got, err := parseMillisOrDuration(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseMillisOrDuration(%q) = %v, %v; want %v, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestDefaultStoreDir(t *testing.T) {
	tests := []struct {
		name string
		goos string
		env  envMap
		want string // "" = error
	}{
		{"linux XDG", "linux", envMap{"XDG_DATA_HOME": "/xdg", "HOME": "/home/u"}, filepath.Join("/xdg", "grouprouter")},
		{"linux home", "linux", envMap{"HOME": "/home/u"}, filepath.Join("/home/u", ".local", "share", "grouprouter")},
		{"linux relative XDG is ignored", "linux", envMap{"XDG_DATA_HOME": "data", "HOME": "/home/u"}, filepath.Join("/home/u", ".local", "share", "grouprouter")},
		{"freebsd", "freebsd", envMap{"HOME": "/home/u"}, filepath.Join("/home/u", ".local", "share", "grouprouter")},
		{"linux nothing", "linux", envMap{}, ""},
		{"darwin", "darwin", envMap{"HOME": "/Users/u", "XDG_DATA_HOME": "/xdg"}, filepath.Join("/Users/u", "Library", "Application Support", "grouprouter")},
		{"windows", "windows", envMap{"LocalAppData": `C:\Users\u\AppData\Local`}, filepath.Join(`C:\Users\u\AppData\Local`, "grouprouter")},
		{"windows nothing", "windows", envMap{"HOME": "/x"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := defaultStoreDir(tt.goos, tt.env.get)
			if tt.want == "" {
				if err == nil {
					t.Fatalf("got %q, want an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestRebalanceFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want proposals.RebalanceConfig
		err  string
	}{
		{name: "defaults", want: proposals.RebalanceConfig{Enabled: true, Tolerance: 1, MaxMoves: 4, CoolDown: 30 * time.Second}},
		{name: "off", args: []string{"--rebalance=false"}, want: proposals.RebalanceConfig{Tolerance: 1, MaxMoves: 4, CoolDown: 30 * time.Second}},
		{name: "tuned", args: []string{"--rebalance-tolerance", "0", "--rebalance-rate", "10", "--rebalance-cool-down", "5s"},
			want: proposals.RebalanceConfig{Enabled: true, MaxMoves: 10, CoolDown: 5 * time.Second}},
		{name: "cool-down in milliseconds", args: []string{"--rebalance-cool-down", "1500"},
			want: proposals.RebalanceConfig{Enabled: true, Tolerance: 1, MaxMoves: 4, CoolDown: 1500 * time.Millisecond}},
		{name: "negative tolerance", args: []string{"--rebalance-tolerance", "-1"}, err: "rebalance-tolerance must be >= 0"},
		{name: "zero rate", args: []string{"--rebalance-rate", "0"}, err: "rebalance-rate and rebalance-cool-down > 0"},
		{name: "zero cool-down", args: []string{"--rebalance-cool-down", "0s"}, err: "rebalance-rate and rebalance-cool-down > 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, err := parseRunArgs(append([]string{"--node", "n1"}, tt.args...), testEnv("h"))
			if tt.err != "" {
				if err == nil || !errors.Is(err, router.ErrConfig) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want ErrConfig with %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := *opts.cfg.Rebalance; got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}
