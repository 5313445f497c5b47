package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/grouprouter/grouprouter/internal/localnats"
	"github.com/grouprouter/grouprouter/router"
)

const (
	// embeddedServerName is the ServerName of the embedded nats-server.
	embeddedServerName = "grouprouter-embedded"
	// embeddedReadyTimeout bounds how long the embedded server may take to
	// accept connections (JetStream recovers its store first).
	embeddedReadyTimeout = 30 * time.Second
)

// errPortInUse is wrapped when the embedded server's address is taken.
var errPortInUse = errors.New("address already in use")

// embeddedServer is the nats-server run starts when there are no servers to join.
type embeddedServer struct {
	srv *server.Server
	// url is what clients on this host connect to.
	url string
}

// embeddedOptions returns the embedded server's configuration: the
// nats-server configuration file configFile if given (parsed by
// nats-server itself: users, TLS, accounts, ...), with JetStream on, the
// listen address (HOST:PORT, port 0 picks a free one) when listenSet or
// the file sets none, and the store directory when storeDirSet or the file
// sets none, and the fsync policy sync when syncSet or the file sets none
// (its sync_interval). It refuses (router.ErrConfig) a server listening
// beyond loopback without authentication or without TLS. It reads the file only.
func embeddedOptions(listen string, listenSet bool, storeDir string, storeDirSet bool, configFile string,
	sync localnats.Sync, syncSet bool) (*server.Options, error) {
	o := &server.Options{}
	if configFile != "" {
		var err error
		if o, err = server.ProcessConfigFile(configFile); err != nil {
			return nil, fmt.Errorf("%w: --server-config %s: %v", router.ErrConfig, configFile, err)
		}
	}
	if listenSet || (o.Host == "" && o.Port == 0) {
		host, portStr, err := net.SplitHostPort(listen)
		if err != nil {
			return nil, fmt.Errorf("%w: --listen %q: %v", router.ErrConfig, listen, err)
		}
		port, err := strconv.Atoi(portStr)
		if err != nil {
			return nil, fmt.Errorf("%w: --listen %q: bad port", router.ErrConfig, listen)
		}
		if port == 0 {
			port = server.RANDOM_PORT
		}
		o.Host, o.Port = host, port
	}
	if o.Host == "" {
		o.Host = server.DEFAULT_HOST // what nats-server listens on without a host
	}
	if o.Port == 0 {
		o.Port = server.DEFAULT_PORT
	}
	if storeDirSet || o.StoreDir == "" {
		o.StoreDir = storeDir
	}
	if syncSet || localnats.SyncOf(o) == (localnats.Sync{}) {
		sync.Apply(o)
	}
	if o.ServerName == "" {
		o.ServerName = embeddedServerName
	}
	o.JetStream = true
	o.NoSigs = true // grouprouter owns SIGINT/SIGTERM
	if !loopbackHost(o.Host) {
		addr := net.JoinHostPort(o.Host, strconv.Itoa(max(o.Port, 0)))
		switch {
		case !hasClientAuth(o):
			return nil, fmt.Errorf("%w: the embedded NATS server would listen on %s, beyond this host, with no authentication: "+
				"configure users (or nkeys, tokens, client certificates) and TLS in a --server-config file, or listen on 127.0.0.1", router.ErrConfig, addr)
		case o.TLSConfig == nil:
			// Credentials and messages would cross the network in clear.
			return nil, fmt.Errorf("%w: the embedded NATS server would listen on %s, beyond this host, without TLS: "+
				"configure a tls block (cert_file, key_file) in the --server-config file, or listen on 127.0.0.1", router.ErrConfig, addr)
		}
	}
	return o, nil
}

// loopbackHost reports whether host is a loopback address or localhost.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// hasClientAuth reports whether the server authenticates its clients.
func hasClientAuth(o *server.Options) bool {
	return len(o.Users) > 0 || len(o.Nkeys) > 0 || o.Username != "" || o.Authorization != "" ||
		len(o.TrustedOperators) > 0 || len(o.TrustedKeys) > 0 || o.AuthCallout != nil ||
		o.CustomClientAuthentication != nil || (o.TLSVerify && o.TLSConfig != nil)
}

// startEmbedded starts the nats-server configured by o (see
// embeddedOptions), creating its store directory with mode 0700. It
// returns once the server accepts connections; Close stops it.
func startEmbedded(o *server.Options, log *slog.Logger) (*embeddedServer, error) {
	host, port := o.Host, o.Port
	listen := net.JoinHostPort(host, strconv.Itoa(max(port, 0)))
	if err := os.MkdirAll(o.StoreDir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded NATS server: store directory: %w", err)
	}

	// nats-server reports a taken port only through its logger and then
	// waits; probing first gives the operator an immediate, clear answer.
	if port > 0 {
		l, err := net.Listen("tcp", listen)
		if err != nil {
			return nil, listenError(listen, err)
		}
		l.Close()
	}

	fatal := make(chan string, 1)
	debug := log.Enabled(context.Background(), slog.LevelDebug)
	setLogger := func(srv *server.Server) {
		srv.SetLoggerV2(&natsLogger{log: log.With("component", "nats-server"), fatal: fatal}, debug, false, false)
	}
	var fatalErr error // what a fatal log line said, once one came
	fatalLogged := func() error {
		select {
		case msg := <-fatal:
			fatalErr = fmt.Errorf("embedded NATS server: %s", msg)
			if isAddrInUse(msg) {
				fatalErr = listenError(listen, errPortInUse)
			}
		default:
		}
		return fatalErr
	}
	srv, err := localnats.StartServer(o, embeddedReadyTimeout, setLogger, fatalLogged)
	switch {
	case err == nil:
	case fatalErr != nil:
		return nil, fatalErr
	case errors.Is(err, localnats.ErrNotReady):
		return nil, fmt.Errorf("embedded NATS server: not ready after %v", embeddedReadyTimeout)
	default:
		return nil, fmt.Errorf("embedded NATS server: %w", err)
	}

	clientHost := host
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		clientHost = "127.0.0.1" // listening on every interface; this host reaches it on loopback
	}
	if a, ok := srv.Addr().(*net.TCPAddr); ok {
		port = a.Port
	}
	e := &embeddedServer{srv: srv, url: "nats://" + net.JoinHostPort(clientHost, strconv.Itoa(port))}
	log.Info("embedded NATS server started; other nodes and clients join it with --nats "+e.url,
		"url", e.url, "listen", net.JoinHostPort(host, strconv.Itoa(port)), "store_dir", o.StoreDir, "server_name", o.ServerName,
		"auth", hasClientAuth(o), "tls", o.TLSConfig != nil, "sync", embeddedSync(o))
	if !o.SyncAlways {
		log.Info("the embedded server flushes JetStream writes to disk every "+embeddedSync(o)+", not before each PubAck: "+
			"an OS crash or power loss loses what was acknowledged since the last flush (--sync always prevents it)", "sync", embeddedSync(o))
	}
	return e, nil
}

// embeddedSync names o's fsync policy as --sync does.
func embeddedSync(o *server.Options) string {
	if s := localnats.SyncOf(o); s.Always || s.Interval > 0 {
		return s.String()
	}
	return localnats.ServerDefaultSync.String()
}

// Close shuts the server down and waits until it has.
func (e *embeddedServer) Close() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// listenError explains a failure to listen on addr.
func listenError(addr string, err error) error {
	if errors.Is(err, errPortInUse) || errors.Is(err, syscall.EADDRINUSE) || isAddrInUse(err.Error()) {
		host, port, _ := net.SplitHostPort(addr)
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			host = "127.0.0.1"
		}
		url := "nats://" + net.JoinHostPort(host, port)
		return fmt.Errorf("cannot start the embedded NATS server: %s is already in use; "+
			"to join the NATS server already listening there, run with --nats %s (or pick another port with --listen)", addr, url)
	}
	return fmt.Errorf("cannot start the embedded NATS server on %s: %w", addr, err)
}

func isAddrInUse(msg string) bool {
	msg = strings.ToLower(msg)
	return strings.Contains(msg, "address already in use") || strings.Contains(msg, "only one usage of each socket address")
}

// defaultStoreDir returns the embedded server's default store directory:
// the user's data directory (XDG on Linux and other Unixes) + /grouprouter.
func defaultStoreDir(goos string, getenv func(string) string) (string, error) {
	var base string
	switch goos {
	case "windows":
		base = getenv("LocalAppData")
		if base == "" {
			return "", errors.New("cannot find the user's data directory: %LocalAppData% is not set")
		}
	case "darwin", "ios":
		home := getenv("HOME")
		if home == "" {
			return "", errors.New("cannot find the user's data directory: $HOME is not set")
		}
		base = filepath.Join(home, "Library", "Application Support")
	case "plan9":
		home := getenv("home")
		if home == "" {
			return "", errors.New("cannot find the user's data directory: $home is not set")
		}
		base = filepath.Join(home, "lib")
	default:
		// The XDG Base Directory spec says to ignore a relative $XDG_DATA_HOME.
		if x := getenv("XDG_DATA_HOME"); x != "" && filepath.IsAbs(x) {
			base = x
			break
		}
		home := getenv("HOME")
		if home == "" {
			return "", errors.New("cannot find the user's data directory: neither $XDG_DATA_HOME nor $HOME is set")
		}
		base = filepath.Join(home, ".local", "share")
	}
	return filepath.Join(base, "grouprouter"), nil
}

// natsLogger routes nats-server's log lines to slog. Notices go to debug:
// the server's startup banner is noise next to grouprouter's own lines.
// Fatal lines are errors here (the server must not exit the process) and
// are also handed to startEmbedded, which is waiting for readiness.
type natsLogger struct {
	log   *slog.Logger
	fatal chan<- string
}

func (l *natsLogger) logf(level slog.Level, format string, v []any) {
	if l.log.Enabled(context.Background(), level) {
		l.log.Log(context.Background(), level, fmt.Sprintf(format, v...))
	}
}

func (l *natsLogger) Noticef(format string, v ...any) { l.logf(slog.LevelDebug, format, v) }
func (l *natsLogger) Warnf(format string, v ...any)   { l.logf(slog.LevelWarn, format, v) }
func (l *natsLogger) Errorf(format string, v ...any)  { l.logf(slog.LevelError, format, v) }
func (l *natsLogger) Debugf(format string, v ...any)  { l.logf(slog.LevelDebug, format, v) }
func (l *natsLogger) Tracef(format string, v ...any)  { l.logf(slog.LevelDebug-4, format, v) }

func (l *natsLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.Error(msg)
	select {
	case l.fatal <- msg:
	default:
	}
}
