package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/retry"
	"github.com/grouprouter/grouprouter/router"
)

// Environment variables of the connection settings, as the nats CLI reads
// them.
const (
	envURL      = "NATS_URL"
	envUser     = "NATS_USER"
	envPassword = "NATS_PASSWORD"
	envCreds    = "NATS_CREDS"
	envNKey     = "NATS_NKEY"
	envCert     = "NATS_CERT"
	envKey      = "NATS_KEY"
	envCA       = "NATS_CA"
	envContext  = "NATS_CONTEXT"
)

// connEnvVars is every variable the connection settings read.
var connEnvVars = []string{envURL, envUser, envPassword, envCreds, envNKey, envCert, envKey, envCA, envContext}

// waitLogEvery is the least time between two "waiting for NATS" lines.
const waitLogEvery = 15 * time.Second

// connFlags are the connection flags every command takes, named as the
// nats CLI names them.
type connFlags struct {
	fs          *flag.FlagSet
	url         string
	user        string
	password    string
	creds       string
	nkey        string
	cert        string
	key         string
	ca          string
	tlsFirst    bool
	context     string
	inboxPrefix string
	jsDomain    string
	jsAPIPrefix string
}

// addConnFlags defines the connection flags on fs; natsUsage documents
// --nats for the command.
func addConnFlags(fs *flag.FlagSet, natsUsage string) *connFlags {
	f := &connFlags{fs: fs}
	fs.StringVar(&f.url, "nats", "", natsUsage)
	fs.StringVar(&f.user, "user", "", "user `NAME` (env "+envUser+")")
	fs.StringVar(&f.password, "password", "", "`PASSWORD` of --user (env "+envPassword+"; on the command line it shows in ps: prefer the variable, a context or a creds file)")
	fs.StringVar(&f.creds, "creds", "", "user credentials `FILE` (JWT and nkey seed; env "+envCreds+")")
	fs.StringVar(&f.nkey, "nkey", "", "nkey seed `FILE` (env "+envNKey+")")
	fs.StringVar(&f.cert, "tlscert", "", "TLS client certificate `FILE` (env "+envCert+")")
	fs.StringVar(&f.key, "tlskey", "", "TLS client key `FILE` (env "+envKey+")")
	fs.StringVar(&f.ca, "tlsca", "", "TLS certificate authority `FILE` to verify the servers with (env "+envCA+")")
	fs.BoolVar(&f.tlsFirst, "tlsfirst", false, "start with the TLS handshake (servers with handshake_first)")
	fs.StringVar(&f.context, "context", "", "read connection settings from the nats CLI context `NAME` (env "+envContext+"); flags and variables override it")
	fs.StringVar(&f.inboxPrefix, "inbox-prefix", "", "`PREFIX` of the reply subjects (default "+router.DefaultInboxPrefix+")")
	fs.StringVar(&f.jsDomain, "js-domain", "", "JetStream `DOMAIN` of the streams and buckets")
	fs.StringVar(&f.jsAPIPrefix, "js-api-prefix", "", "JetStream API `PREFIX` for a user in another account than the router's, which imports the router's JetStream API under it (grouprouter permissions prints it; consumers use it)")
	return f
}

// connSettings are the merged connection settings of a command.
type connSettings struct {
	// URL is the comma-separated server list; "" only for run without
	// servers to join (the embedded server).
	URL                        string
	User, Password, Token      string
	Creds, NKey, Cert, Key, CA string // file paths
	TLSFirst                   bool
	InboxPrefix, JSDomain      string
	// JSAPIPrefix is the JetStream API prefix of a user in another
	// account than the router's (a consumer's), "" for $JS.API.
	JSAPIPrefix string
	// Context is the nats CLI context read, "" if none.
	Context string
	// PasswordFlag is set when a password was on the command line
	// (--password, or in a --nats URL).
	PasswordFlag bool
	// Where URL, the credentials and the password came from, for
	// messages.
	urlSource, credsSource, passwordSource string
}

// resolve merges the flags with the environment and the context:
// a flag given on the command line wins over its environment variable,
// which wins over the context (as the nats CLI does). defaultURL is used
// when none of them names servers. Errors wrap router.ErrConfig.
func (f *connFlags) resolve(env environment, defaultURL string) (connSettings, error) {
	set := make(map[string]bool)
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })

	var s connSettings
	s.Context = f.context
	if !set["context"] {
		s.Context = env.getenv(envContext)
	}
	var nctx natsContext
	if s.Context != "" {
		var err error
		if nctx, err = loadContext(env, s.Context); err != nil {
			return connSettings{}, err
		}
	}
	ctxSource := fmt.Sprintf("context %q", s.Context)
	pick := func(flagName, flagValue, envName, ctxValue string) (value, source string) {
		switch {
		case set[flagName]:
			return strings.TrimSpace(flagValue), "--" + flagName
		case envName != "" && env.getenv(envName) != "":
			return strings.TrimSpace(env.getenv(envName)), envName
		case ctxValue != "":
			return strings.TrimSpace(ctxValue), ctxSource
		}
		return "", ""
	}
	s.URL, s.urlSource = pick("nats", f.url, envURL, nctx.URL)
	if s.urlSource == "" && defaultURL != "" {
		s.URL, s.urlSource = defaultURL, "default"
	}
	if s.urlSource != "" {
		if err := checkNATSURLs(s.URL, s.urlSource); err != nil {
			return connSettings{}, err
		}
	}
	// Credentials go as a whole: the first of the flags, the environment
	// and the context that names any (a user, a creds file, an nkey) gives
	// them, so that --user replaces a context's creds file.
	levels := []struct {
		source           string
		user, creds, key string
	}{
		{"flags", flagValue(set, "user", f.user), flagValue(set, "creds", f.creds), flagValue(set, "nkey", f.nkey)},
		{"the environment", env.getenv(envUser), env.getenv(envCreds), env.getenv(envNKey)},
		{ctxSource, nctx.User, nctx.Creds, nctx.NKey},
	}
	for _, l := range levels {
		l.user, l.creds, l.key = strings.TrimSpace(l.user), strings.TrimSpace(l.creds), strings.TrimSpace(l.key)
		if l.user == "" && l.creds == "" && l.key == "" {
			continue
		}
		var kinds []string
		for _, k := range []struct{ what, v string }{{"a user", l.user}, {"a creds file", l.creds}, {"an nkey", l.key}} {
			if k.v != "" {
				kinds = append(kinds, k.what)
			}
		}
		if len(kinds) > 1 {
			return connSettings{}, fmt.Errorf("%w: several credentials in %s: %s; give one", router.ErrConfig, l.source, strings.Join(kinds, ", "))
		}
		s.User, s.Creds, s.NKey, s.credsSource = l.user, l.creds, l.key, l.source
		break
	}
	// A password goes with its user: the context's only with the
	// context's user.
	ctxPassword := ""
	if s.credsSource == ctxSource {
		ctxPassword = nctx.Password
	}
	s.Password, s.passwordSource = pick("password", f.password, envPassword, ctxPassword)
	s.PasswordFlag = set["password"] || (set["nats"] && urlHasPassword(s.URL))
	s.Cert, _ = pick("tlscert", f.cert, envCert, nctx.Cert)
	s.Key, _ = pick("tlskey", f.key, envKey, nctx.Key)
	s.CA, _ = pick("tlsca", f.ca, envCA, nctx.CA)
	if s.credsSource == ctxSource || (s.User == "" && s.Creds == "" && s.NKey == "") {
		s.Token = nctx.Token // the context's token goes with its credentials
	}
	s.TLSFirst = f.tlsFirst || (!set["tlsfirst"] && nctx.TLSFirst)
	s.InboxPrefix, _ = pick("inbox-prefix", f.inboxPrefix, "", nctx.InboxPrefix)
	s.JSDomain, _ = pick("js-domain", f.jsDomain, "", nctx.JSDomain)
	s.JSAPIPrefix, _ = pick("js-api-prefix", f.jsAPIPrefix, "", nctx.JSAPIPrefix)

	if s.User == "" && s.passwordSource != "--password" {
		s.Password = "" // an ambient NATS_PASSWORD without a user: ignored, as the nats CLI does
	}
	switch {
	case s.Password != "" && s.User == "":
		return connSettings{}, fmt.Errorf("%w: a password (--password) without a user; set --user or %s", router.ErrConfig, envUser)
	case (s.Cert == "") != (s.Key == ""):
		return connSettings{}, fmt.Errorf("%w: a TLS client certificate needs both --tlscert and --tlskey (%s, %s)", router.ErrConfig, envCert, envKey)
	}
	if s.InboxPrefix != "" {
		if err := nats.CustomInboxPrefix(s.InboxPrefix)(&nats.Options{}); err != nil || strings.Contains(s.InboxPrefix, "..") {
			return connSettings{}, fmt.Errorf("%w: inbox prefix %q: want subject tokens without wildcards or a trailing dot", router.ErrConfig, s.InboxPrefix)
		}
	}
	if s.JSDomain != "" && strings.ContainsAny(s.JSDomain, ". \t\r\n*>") {
		return connSettings{}, fmt.Errorf("%w: JetStream domain %q: want one subject token", router.ErrConfig, s.JSDomain)
	}
	if p := strings.TrimSuffix(s.JSAPIPrefix, "."); s.JSAPIPrefix != "" && (p == "" || strings.ContainsAny(p, " \t\r\n*>") || strings.Contains(p, "..") || strings.HasPrefix(p, ".")) {
		return connSettings{}, fmt.Errorf("%w: JetStream API prefix %q: want subject tokens without wildcards", router.ErrConfig, s.JSAPIPrefix)
	}
	if s.JSAPIPrefix != "" && s.JSDomain != "" {
		return connSettings{}, fmt.Errorf("%w: --js-api-prefix and --js-domain both name where the JetStream API is: give one", router.ErrConfig)
	}
	return s, nil
}

// flagValue is the flag's value if it was given, else "".
func flagValue(set map[string]bool, name, value string) string {
	if set[name] {
		return value
	}
	return ""
}

// options returns the nats.Connect options of the settings.
func (s connSettings) options() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case s.User != "":
		opts = append(opts, nats.UserInfo(s.User, s.Password))
	case s.Creds != "":
		opts = append(opts, nats.UserCredentials(s.Creds))
	case s.NKey != "":
		o, err := nats.NkeyOptionFromSeed(s.NKey)
		if err != nil {
			return nil, fmt.Errorf("nkey seed file %s: %w", s.NKey, cleanFileError(err))
		}
		opts = append(opts, o)
	}
	if s.Token != "" {
		opts = append(opts, nats.Token(s.Token))
	}
	if s.Cert != "" {
		opts = append(opts, nats.ClientCert(s.Cert, s.Key))
	}
	if s.CA != "" {
		opts = append(opts, nats.RootCAs(s.CA))
	}
	if s.TLSFirst {
		opts = append(opts, nats.TLSHandshakeFirst())
	}
	if s.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(s.InboxPrefix))
	}
	return opts, nil
}

// identity says who connects, for messages: never a secret.
func (s connSettings) identity() string {
	switch {
	case s.User != "":
		return fmt.Sprintf("user %q", s.User)
	case s.Creds != "":
		return fmt.Sprintf("creds file %s", s.Creds)
	case s.NKey != "":
		return fmt.Sprintf("nkey %s", s.NKey)
	case s.Token != "":
		return fmt.Sprintf("the token of context %q", s.Context)
	case s.Cert != "":
		return fmt.Sprintf("TLS client certificate %s", s.Cert)
	}
	return ""
}

// jetStream returns a JetStream context in the settings' domain, or under
// their API prefix.
func (s connSettings) jetStream(nc *nats.Conn) (jetstream.JetStream, error) {
	if s.JSAPIPrefix != "" {
		return jetstream.NewWithAPIPrefix(nc, s.JSAPIPrefix)
	}
	if s.JSDomain != "" {
		return jetstream.NewWithDomain(nc, s.JSDomain)
	}
	return jetstream.New(nc)
}

// urlHasPassword reports whether a server list holds a password.
func urlHasPassword(servers string) bool {
	for _, p := range strings.Split(servers, ",") {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			if _, ok := u.User.Password(); ok {
				return true
			}
		}
	}
	return false
}

// passwordWarning is the warning about a password given as a flag.
const passwordWarning = "a password on the command line (--password, or in a --nats URL) is visible to other users of this host (ps); prefer " +
	envPassword + ", a nats context (--context) or a creds file (--creds)"

// connectClient connects a client command (every command but run) once,
// bounded by connectTimeout per server, and returns one clear error if it
// cannot. Extra options follow the defaults. The caller
// closes the connection.
func connectClient(s connSettings, cmd string, warn func(string), extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	opts, err := s.options()
	if err != nil {
		return nil, nil, err
	}
	all := append([]nats.Option{nats.Name("grouprouter-" + cmd), nats.Timeout(connectTimeout)}, opts...)
	nc, err := nats.Connect(s.URL, append(all, extra...)...)
	if err != nil {
		return nil, nil, connectError(err, s)
	}
	if s.PasswordFlag && warn != nil {
		warn(passwordWarning)
	}
	js, err := s.jetStream(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// connectNode connects a router node: it tries until NATS answers or ctx
// ends (a node may start before its servers), logging what it waits for,
// and stops at once when NATS refuses the credentials or TLS fails. It
// returns a nil connection and a nil error when ctx ended first.
func connectNode(ctx context.Context, s connSettings, servers string, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := s.options()
	if err != nil {
		return nil, err
	}
	opts = append(opts, extra...)
	b := retry.Backoff{Min: 250 * time.Millisecond, Max: 5 * time.Second}
	start := time.Now()
	var logged time.Time
	for attempt := 1; ; attempt++ {
		nc, err := nats.Connect(servers, opts...)
		if err == nil {
			if attempt > 1 {
				log.Info("connected to NATS", "url", nc.ConnectedUrlRedacted(), "attempts", attempt, "waited", time.Since(start).Round(time.Millisecond))
			}
			return nc, nil
		}
		if retry.Permanent(err) {
			return nil, connectError(err, withURL(s, servers))
		}
		if now := time.Now(); attempt == 1 || now.Sub(logged) >= waitLogEvery {
			args := []any{"url", redactURLs(servers), "err", err}
			if attempt == 1 {
				log.Info("waiting for NATS at "+redactURLs(servers), args...)
			} else {
				log.Warn("still waiting for NATS at "+redactURLs(servers), append(args, "attempts", attempt, "waited", now.Sub(start).Round(time.Second))...)
			}
			logged = now
		}
		if retry.Sleep(ctx, b.Next()) != nil {
			return nil, nil
		}
	}
}

func withURL(s connSettings, url string) connSettings {
	s.URL = url
	return s
}

// connectError turns a failed connection into one line saying what to do.
func connectError(err error, s connSettings) error {
	where := redactURLs(s.URL)
	who := s.identity()
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired),
		errors.Is(err, nats.ErrAuthRevoked), errors.Is(err, nats.ErrAccountAuthExpired):
		if who == "" {
			return fmt.Errorf("NATS at %s requires credentials and none were given (see --user, --creds, --nkey, --context)", where)
		}
		return fmt.Errorf("NATS refused the credentials for %s at %s (%s)", who, where, strings.TrimPrefix(err.Error(), "nats: "))
	case retry.TLS(err):
		hint := ""
		var unknown x509.UnknownAuthorityError
		if errors.As(err, &unknown) || strings.Contains(err.Error(), "unknown authority") {
			hint = " (give the servers' certificate authority with --tlsca)"
		}
		return fmt.Errorf("TLS with NATS at %s failed: %s%s", where, tlsMessage(err), hint)
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("cannot connect to NATS at %s: %v", where, cleanFileError(err))
	case errors.Is(err, nats.ErrNoServers):
		if s.urlSource == "default" {
			return fmt.Errorf("cannot reach NATS at %s: no server answered (is it running? that is the default address: set --nats, %s or --context)", where, envURL)
		}
		return fmt.Errorf("cannot reach NATS at %s: no server answered (is it running? the address comes from %s)", where, s.urlSource)
	}
	return fmt.Errorf("cannot connect to NATS at %s: %s", where, strings.TrimPrefix(err.Error(), "nats: "))
}

// tlsMessage is a TLS error without the client's prefixes.
func tlsMessage(err error) string {
	msg := err.Error()
	for _, p := range []string{"nats: ", "tls error: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return msg
}

// cleanFileError keeps the path and the reason of a file error.
func cleanFileError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Path, pe.Err)
	}
	return err
}

// requestError explains a failed JetStream request of a client command in
// one line; nc tells whether the server refused a permission.
func requestError(err error, s connSettings, nc *nats.Conn, before error, what string) error {
	where := redactURLs(s.URL)
	if v := retry.Violation(nc, before); v != nil {
		return permissionError(v, s, where)
	}
	switch {
	case jetStreamDisabled(err):
		return noJetStreamError(s)
	case errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("%s: JetStream at %s did not answer (is it enabled, and its cluster up?)", what, where)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return fmt.Errorf("%s: JetStream at %s did not answer in time (no meta leader? permissions?)", what, where)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// permissionError says which permission NATS denied.
func permissionError(v error, s connSettings, where string) error {
	msg := violationOf(v).Error()
	if i := strings.Index(msg, "Permissions Violation"); i >= 0 {
		msg = msg[i:]
	}
	if j := strings.Index(msg, " on connection"); j >= 0 {
		msg = msg[:j]
	}
	who := s.identity()
	if who == "" {
		who = "this connection"
	}
	return fmt.Errorf("NATS denied %s a permission grouprouter needs at %s: %s", who, where, msg)
}

// violationOf returns the permissions violation the client reported,
// found in err's tree (err itself if there is none).
func violationOf(err error) error {
	if errors.Unwrap(err) == nats.ErrPermissionViolation {
		return err
	}
	var next []error
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		next = []error{u.Unwrap()}
	case interface{ Unwrap() []error }:
		next = u.Unwrap()
	}
	for _, e := range next {
		if e != nil && errors.Is(e, nats.ErrPermissionViolation) {
			return violationOf(e)
		}
	}
	return err
}

// setupError explains a node's failed setup (a *router.SetupError) in one
// line.
func setupError(err error, s connSettings) error {
	var se *router.SetupError
	if errors.Is(err, router.ErrNodeIDInUse) {
		return err // says it all, in one line
	}
	if !errors.As(err, &se) {
		return fmt.Errorf("router: %w", err)
	}
	where := redactURLs(s.URL)
	cause := se.Err
	switch {
	case errors.Is(cause, nats.ErrPermissionViolation):
		return permissionError(cause, s, where)
	case errors.Is(cause, nats.ErrAuthorization), errors.Is(cause, nats.ErrAuthExpired),
		errors.Is(cause, nats.ErrAuthRevoked), errors.Is(cause, nats.ErrAccountAuthExpired):
		return connectError(cause, s)
	case jetStreamDisabled(cause):
		return noJetStreamError(s)
	}
	msg := cause.Error()
	var apiErr *jetstream.APIError
	if errors.As(cause, &apiErr) && apiErr.Description != "" {
		msg = fmt.Sprintf("%s (JetStream error %d)", apiErr.Description, apiErr.ErrorCode)
	}
	msg = strings.ReplaceAll(msg, "grouping: ", "")
	return fmt.Errorf("setting up the node's %s at %s: %s", se.Step, where, msg)
}

// natsContext is a saved nats CLI context: the fields grouprouter uses of
// the JSON file "nats context save" writes.
type natsContext struct {
	URL         string `json:"url"`
	Token       string `json:"token"`
	User        string `json:"user"`
	Password    string `json:"password"`
	Creds       string `json:"creds"`
	NKey        string `json:"nkey"`
	Cert        string `json:"cert"`
	Key         string `json:"key"`
	CA          string `json:"ca"`
	JSDomain    string `json:"jetstream_domain"`
	JSAPIPrefix string `json:"jetstream_api_prefix"`
	InboxPrefix string `json:"inbox_prefix"`
	TLSFirst    bool   `json:"tls_first"`

	// Settings grouprouter does not support: a context using them is
	// refused rather than half applied.
	NSC        string `json:"nsc"`
	UserJWT    string `json:"user_jwt"`
	SocksProxy string `json:"socks_proxy"`
}

// contextPath returns the file of the nats CLI context name:
// $XDG_CONFIG_HOME/nats/context/<name>.json, by default under ~/.config.
func contextPath(env environment, name string) (string, error) {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) || strings.Contains(name, "..") {
		return "", fmt.Errorf("%w: invalid context name %q", router.ErrConfig, name)
	}
	base := env.getenv("XDG_CONFIG_HOME")
	if base == "" {
		home := env.getenv("HOME")
		if home == "" {
			return "", fmt.Errorf("%w: context %q: neither $XDG_CONFIG_HOME nor $HOME is set", router.ErrConfig, name)
		}
		base = filepath.Join(home, ".config")
	}
	return filepath.Join(base, "nats", "context", name+".json"), nil
}

// loadContext reads the nats CLI context name. Paths in it may start with
// ~ or hold $VARIABLES, as the nats CLI allows. Errors wrap router.ErrConfig.
func loadContext(env environment, name string) (natsContext, error) {
	path, err := contextPath(env, name)
	if err != nil {
		return natsContext{}, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return natsContext{}, fmt.Errorf("%w: unknown nats context %q (no file %s)", router.ErrConfig, name, path)
		}
		return natsContext{}, fmt.Errorf("%w: nats context %q: %v", router.ErrConfig, name, cleanFileError(err))
	}
	var c natsContext
	if err := json.Unmarshal(data, &c); err != nil {
		return natsContext{}, fmt.Errorf("%w: nats context %q (%s): %v", router.ErrConfig, name, path, err)
	}
	for field, v := range map[string]string{"nsc": c.NSC, "user_jwt": c.UserJWT, "socks_proxy": c.SocksProxy} {
		if v != "" {
			return natsContext{}, fmt.Errorf("%w: nats context %q sets %q, which grouprouter does not support", router.ErrConfig, name, field)
		}
	}
	for _, p := range []*string{&c.Creds, &c.NKey, &c.Cert, &c.Key, &c.CA} {
		*p = expandPath(env, *p)
	}
	return c, nil
}

// expandPath expands a leading ~ and $VARIABLES in a context's file path.
func expandPath(env environment, p string) string {
	if p == "" {
		return ""
	}
	if p == "~" || strings.HasPrefix(p, "~/") {
		if home := env.getenv("HOME"); home != "" {
			p = home + p[1:]
		}
	}
	return os.Expand(p, env.getenv)
}

// natsClientUsage documents --nats of the client commands.
const natsClientUsage = "NATS server `URL`s, comma-separated (env " + envURL + "; default " + defaultNATSURL + ")"

// warnTo returns a function writing a warning line to w.
func warnTo(w io.Writer) func(string) {
	return func(msg string) { fmt.Fprintf(w, "grouprouter: warning: %s\n", msg) }
}
