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

// embeddedServer is the nats-server started when --nats is not given.
type embeddedServer struct {
	srv *server.Server
	// url is what clients on this host connect to.
	url string
}

// startEmbedded starts a JetStream-enabled nats-server listening on listen
// (HOST:PORT; port 0 picks a free one) with its store under storeDir,
// which it creates with mode 0700. It returns once the server accepts
// connections; Close stops it.
func startEmbedded(listen, storeDir string, log *slog.Logger) (*embeddedServer, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS server: --listen %q: %v", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS server: --listen %q: bad port", listen)
	}
	if err := os.MkdirAll(storeDir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded NATS server: store directory: %w", err)
	}

	// nats-server reports a taken port only through its logger and then
	// waits; probing first gives the operator an immediate, clear answer.
	if port != 0 {
		l, err := net.Listen("tcp", listen)
		if err != nil {
			return nil, listenError(listen, err)
		}
		l.Close()
	} else {
		port = server.RANDOM_PORT
	}

	fatal := make(chan string, 1)
	opts := &server.Options{
		ServerName: embeddedServerName,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   storeDir,
		NoSigs:     true, // grouprouter owns SIGINT/SIGTERM
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS server: %w", err)
	}
	debug := log.Enabled(context.Background(), slog.LevelDebug)
	srv.SetLoggerV2(&natsLogger{log: log.With("component", "nats-server"), fatal: fatal}, debug, false, false)
	srv.Start()

	deadline := time.Now().Add(embeddedReadyTimeout)
	for !srv.ReadyForConnections(50 * time.Millisecond) {
		select {
		case msg := <-fatal:
			srv.Shutdown()
			srv.WaitForShutdown()
			if isAddrInUse(msg) {
				return nil, listenError(listen, errPortInUse)
			}
			return nil, fmt.Errorf("embedded NATS server: %s", msg)
		default:
		}
		if time.Now().After(deadline) {
			srv.Shutdown()
			srv.WaitForShutdown()
			return nil, fmt.Errorf("embedded NATS server: not ready after %v", embeddedReadyTimeout)
		}
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
		"url", e.url, "listen", net.JoinHostPort(host, strconv.Itoa(port)), "store_dir", storeDir, "server_name", embeddedServerName)
	return e, nil
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
