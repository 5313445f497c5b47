package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/router"
)

// writeContext saves a nats CLI context file under dir (an
// XDG_CONFIG_HOME) and returns its path.
func writeContext(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, "nats", "context", name+".json")
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// resolveArgs parses the connection flags of args as a client command does
// and resolves them in env.
func resolveArgs(args []string, env environment, defaultURL string) (connSettings, error) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := addConnFlags(fs, "")
	if err := fs.Parse(args); err != nil {
		return connSettings{}, err
	}
	return f.resolve(env, defaultURL)
}

func TestConnSettingsPrecedence(t *testing.T) {
	xdg := t.TempDir()
	writeContext(t, xdg, "prod", `{
  "description": "production",
  "url": "nats://ctx:4222",
  "user": "ctx-user",
  "password": "ctx-secret",
  "cert": "~/certs/ctx.pem",
  "key": "$CERTS/ctx-key.pem",
  "ca": "/etc/ctx-ca.pem",
  "tls_first": true,
  "inbox_prefix": "_INBOX_ctx",
  "jetstream_domain": "ctxdomain",
  "color_scheme": "ignored"
}`)
	writeContext(t, xdg, "creds", `{"url": "nats://c:4222", "creds": "~/ngs.creds", "token": "tok"}`)
	baseEnv := map[string]string{"HOME": "/home/op", "XDG_CONFIG_HOME": xdg, "CERTS": "/srv/certs"}

	tests := []struct {
		name string
		args []string
		env  map[string]string
		want connSettings // compared on the exported fields
	}{
		{name: "defaults", want: connSettings{URL: defaultNATSURL}},
		{name: "environment", env: map[string]string{envURL: "nats://env:4222", envUser: "env-user", envPassword: "env-pw",
			envCert: "/env/c.pem", envKey: "/env/k.pem", envCA: "/env/ca.pem"},
			want: connSettings{URL: "nats://env:4222", User: "env-user", Password: "env-pw", Cert: "/env/c.pem", Key: "/env/k.pem", CA: "/env/ca.pem"}},
		{name: "flags over environment", args: []string{"--nats", "nats://flag:4222", "--user", "flag-user", "--password", "flag-pw", "--tlsca", "/flag/ca.pem"},
			env:  map[string]string{envURL: "nats://env:4222", envUser: "env-user", envPassword: "env-pw", envCA: "/env/ca.pem"},
			want: connSettings{URL: "nats://flag:4222", User: "flag-user", Password: "flag-pw", CA: "/flag/ca.pem", PasswordFlag: true}},
		{name: "context", args: []string{"--context", "prod"},
			want: connSettings{URL: "nats://ctx:4222", User: "ctx-user", Password: "ctx-secret", Cert: "/home/op/certs/ctx.pem",
				Key: "/srv/certs/ctx-key.pem", CA: "/etc/ctx-ca.pem", TLSFirst: true, InboxPrefix: "_INBOX_ctx", JSDomain: "ctxdomain", Context: "prod"}},
		{name: "context from NATS_CONTEXT", env: map[string]string{envContext: "prod"},
			want: connSettings{URL: "nats://ctx:4222", User: "ctx-user", Password: "ctx-secret", Cert: "/home/op/certs/ctx.pem",
				Key: "/srv/certs/ctx-key.pem", CA: "/etc/ctx-ca.pem", TLSFirst: true, InboxPrefix: "_INBOX_ctx", JSDomain: "ctxdomain", Context: "prod"}},
		{name: "--context over NATS_CONTEXT", args: []string{"--context", "creds"}, env: map[string]string{envContext: "prod"},
			want: connSettings{URL: "nats://c:4222", Creds: "/home/op/ngs.creds", Token: "tok", Context: "creds"}},
		{name: "environment over context", args: []string{"--context", "prod"},
			env: map[string]string{envURL: "nats://env:4222", envUser: "env-user", envPassword: "env-pw", envCA: "/env/ca.pem"},
			want: connSettings{URL: "nats://env:4222", User: "env-user", Password: "env-pw", Cert: "/home/op/certs/ctx.pem",
				Key: "/srv/certs/ctx-key.pem", CA: "/env/ca.pem", TLSFirst: true, InboxPrefix: "_INBOX_ctx", JSDomain: "ctxdomain", Context: "prod"}},
		{name: "another user does not take the context's password", args: []string{"--context", "prod", "--user", "other"},
			want: connSettings{URL: "nats://ctx:4222", User: "other", Cert: "/home/op/certs/ctx.pem",
				Key: "/srv/certs/ctx-key.pem", CA: "/etc/ctx-ca.pem", TLSFirst: true, InboxPrefix: "_INBOX_ctx", JSDomain: "ctxdomain", Context: "prod"}},
		{name: "flags over context", args: []string{"--context", "prod", "--nats", "nats://flag:4222", "--tlsfirst=false",
			"--inbox-prefix", "my.inbox", "--js-domain", "hub"},
			want: connSettings{URL: "nats://flag:4222", User: "ctx-user", Password: "ctx-secret", Cert: "/home/op/certs/ctx.pem",
				Key: "/srv/certs/ctx-key.pem", CA: "/etc/ctx-ca.pem", InboxPrefix: "my.inbox", JSDomain: "hub", Context: "prod"}},
		{name: "creds and nkey from the environment", env: map[string]string{envCreds: "/a.creds"},
			want: connSettings{URL: defaultNATSURL, Creds: "/a.creds"}},
		{name: "nkey", env: map[string]string{envNKey: "/seed.nk"}, want: connSettings{URL: defaultNATSURL, NKey: "/seed.nk"}},
		{name: "password in the URL flag", args: []string{"--nats", "nats://u:pw@h:4222"},
			want: connSettings{URL: "nats://u:pw@h:4222", PasswordFlag: true}},
		{name: "a user replaces a context's creds", args: []string{"--context", "creds"}, env: map[string]string{envUser: "u", envPassword: "pw"},
			want: connSettings{URL: "nats://c:4222", User: "u", Password: "pw", Context: "creds"}},
		{name: "a creds flag replaces the environment's user", args: []string{"--creds", "/f.creds"}, env: map[string]string{envUser: "u", envPassword: "pw"},
			want: connSettings{URL: defaultNATSURL, Creds: "/f.creds"}},
		{name: "NATS_PASSWORD without a user is ignored", env: map[string]string{envPassword: "pw", envCreds: "/a.creds"},
			want: connSettings{URL: defaultNATSURL, Creds: "/a.creds"}},
		{name: "password in NATS_URL is not on the command line", env: map[string]string{envURL: "nats://u:pw@h:4222"},
			want: connSettings{URL: "nats://u:pw@h:4222"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range baseEnv {
				env[k] = v
			}
			for k, v := range tt.env {
				env[k] = v
			}
			got, err := resolveArgs(tt.args, environment{getenv: envMap(env).get}, defaultNATSURL)
			if err != nil {
				t.Fatal(err)
			}
			exported := func(s connSettings) connSettings {
				return connSettings{URL: s.URL, User: s.User, Password: s.Password, Token: s.Token, Creds: s.Creds, NKey: s.NKey,
					Cert: s.Cert, Key: s.Key, CA: s.CA, TLSFirst: s.TLSFirst, InboxPrefix: s.InboxPrefix, JSDomain: s.JSDomain,
					Context: s.Context, PasswordFlag: s.PasswordFlag}
			}
			if exported(got) != tt.want {
				t.Errorf("\n got %+v\nwant %+v", exported(got), tt.want)
			}
		})
	}

	t.Run("run has no default servers", func(t *testing.T) {
		got, err := resolveArgs(nil, environment{getenv: envMap(baseEnv).get}, "")
		if err != nil || got.URL != "" {
			t.Fatalf("URL %q, err %v; want none (the embedded server)", got.URL, err)
		}
	})
	t.Run("HOME when XDG_CONFIG_HOME is not set", func(t *testing.T) {
		home := t.TempDir()
		writeContext(t, filepath.Join(home, ".config"), "dev", `{"url": "nats://dev:4222"}`)
		got, err := resolveArgs([]string{"--context", "dev"}, environment{getenv: envMap{"HOME": home}.get}, defaultNATSURL)
		if err != nil || got.URL != "nats://dev:4222" {
			t.Fatalf("URL %q, err %v", got.URL, err)
		}
	})
}

func TestConnSettingsErrors(t *testing.T) {
	xdg := t.TempDir()
	writeContext(t, xdg, "nsc", `{"nsc": "nsc://op/acc/user"}`)
	writeContext(t, xdg, "broken", `{"url": `)
	writeContext(t, xdg, "creds", `{"creds": "/a.creds"}`)
	env := envMap{"HOME": "/home/op", "XDG_CONFIG_HOME": xdg}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"unknown context", []string{"--context", "nope"}, nil, `unknown nats context "nope" (no file ` + xdg},
		{"context name with a path", []string{"--context", "../x"}, nil, `invalid context name "../x"`},
		{"unsupported context field", []string{"--context", "nsc"}, nil, `sets "nsc", which grouprouter does not support`},
		{"malformed context", []string{"--context", "broken"}, nil, `nats context "broken"`},
		{"two credentials", []string{"--user", "u", "--creds", "/x.creds"}, nil, "several credentials in flags: a user, a creds file"},
		{"two credentials in the environment", nil, map[string]string{envUser: "u", envNKey: "/s.nk"}, "several credentials in the environment: a user, an nkey"},
		{"password without user", []string{"--password", "pw"}, nil, "a password (--password) without a user"},
		{"certificate without key", []string{"--tlscert", "/c.pem"}, nil, "needs both --tlscert and --tlskey"},
		{"bad inbox prefix", []string{"--inbox-prefix", "a.>"}, nil, `inbox prefix "a.>"`},
		{"bad domain", []string{"--js-domain", "a.b"}, nil, `JetStream domain "a.b"`},
		{"empty nats", []string{"--nats", " "}, nil, "--nats is empty"},
		{"empty URL in list", nil, map[string]string{envURL: "nats://a:1,,nats://b:2"}, `NATS_URL "nats://a:1,,nats://b:2" has an empty URL`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := envMap{}
			for k, v := range env {
				e[k] = v
			}
			for k, v := range tt.env {
				e[k] = v
			}
			_, err := resolveArgs(tt.args, environment{getenv: e.get}, defaultNATSURL)
			if !errors.Is(err, router.ErrConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want a config error with %q", err, tt.want)
			}
		})
	}
}

func TestMalformedNATSURL(t *testing.T) {
	for _, ok := range []string{"nats://127.0.0.1:4222", "NATS://127.0.0.1:4222", "tls://127.0.0.1:4222", "ws://127.0.0.1:8080",
		"wss://127.0.0.1:443/nats", "127.0.0.1:4222", "127.0.0.1", "nats://u:p@127.0.0.1:4222", "nats://[::1]:4222", "[::1]:4222",
		"nats://127.0.0.1:4222/"} {
		if why := malformedNATSURL(ok); why != "" {
			t.Errorf("%q: %s, want it accepted", ok, why)
		}
	}
	for in, want := range map[string]string{
		"nats:/127.0.0.1:4222":   `no "://" after the scheme`,
		"nats//127.0.0.1:4222":   `no "://" after the scheme`,
		"127.0.0.1:4222/":        `no "://" after the scheme`,
		"nats:///127.0.0.1:4222": `no host after "//"`,
		"nats://":                `no host after "//"`,
		"nats://:4222":           `no host after "//"`,
		"nats://u:p@:4222":       `no host after "//"`,
		"http://127.0.0.1:4222":  `unknown scheme "http"`,
		"nats:127.0.0.1:4222":    `invalid host "nats:127.0.0.1"`,
		"nats://[nats]:4222":     "invalid host",
		"nats://127.0.0.1:":      "empty port",
		"nats://127.0.0.1:0":     `port "0" is not 1 to 65535`,
		"nats://127.0.0.1:70000": `port "70000" is not 1 to 65535`,
		"nats://127.0.0.1:x":     "invalid port",
		"nats://127.0.0.1 :4222": "invalid character",
	} {
		if why := malformedNATSURL(in); !strings.Contains(why, want) {
			t.Errorf("%q: %q, want it refused with %q", in, why, want)
		}
	}
	for in, want := range map[string]string{
		"nats:/u:secret@127.0.0.1:4222": "nats:/u:xxxxx@127.0.0.1:4222",
		"nats://u:secret@:4222":         "nats://u:xxxxx@:4222",
		"u:secret@127.0.0.1/":           "u:xxxxx@127.0.0.1/",
		"nats://u@:4222":                "nats://u@:4222",
		"nats:/127.0.0.1:4222":          "nats:/127.0.0.1:4222",
	} {
		if got := redactMalformed(in); got != want {
			t.Errorf("redactMalformed(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestMalformedNATSURLNotDialed: a malformed --nats, NATS_URL or context
// URL is a configuration error naming it, found before any connection:
// a listener on the port the URLs name sees none, and nothing is looked
// up (every input is on 127.0.0.1 or has no host).
func TestMalformedNATSURLNotDialed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	xdg := t.TempDir()
	writeContext(t, xdg, "typo", `{"url": "nats:/127.0.0.1:`+port+`"}`)
	malformed := []string{
		"nats:/127.0.0.1:" + port,
		"nats:127.0.0.1:" + port,
		"nats//127.0.0.1:" + port,
		"nats:///127.0.0.1:" + port,
		"nats://:" + port,
		"http://127.0.0.1:" + port,
		"nats://127.0.0.1:" + port + ",nats:/127.0.0.1:" + port,
		"nats:/u:secret@127.0.0.1:" + port,
	}
	check := func(what string, code int, stderr, url string) {
		t.Helper()
		bad := url[strings.LastIndex(url, ",")+1:]
		if code != exitUsage || !strings.Contains(stderr, "malformed NATS URL") || !strings.Contains(stderr, strconv.Quote(redactMalformed(bad))) ||
			strings.Contains(stderr, "secret") {
			t.Errorf("%s %q: exit %d, stderr %q; want exit %d and the URL named as malformed (password hidden)", what, url, code, stderr, exitUsage)
		}
	}
	for _, u := range malformed {
		for _, cmd := range [][]string{{"groups"}, {"publish", "jms.a", "x"}, {"run", "--node", "n1"}} {
			code, _, stderr := runCommand(t, append(append([]string{cmd[0]}, "--nats", u), cmd[1:]...)...)
			check(cmd[0]+" --nats", code, stderr, u)
		}
		var stderr bytes.Buffer
		env := environment{goos: "linux", getenv: envMap{envURL: u, "HOME": t.TempDir()}.get, hostname: func() string { return "h" }}
		code := runEnv(context.Background(), []string{"nodes"}, env, io.Discard, &stderr)
		check("NATS_URL", code, stderr.String(), u)
	}
	var stderr bytes.Buffer
	env := environment{goos: "linux", getenv: envMap{"XDG_CONFIG_HOME": xdg, "HOME": t.TempDir()}.get, hostname: func() string { return "h" }}
	code := runEnv(context.Background(), []string{"nodes", "--context", "typo"}, env, io.Discard, &stderr)
	check("--context", code, stderr.String(), "nats:/127.0.0.1:"+port)
	if !strings.Contains(stderr.String(), `context "typo"`) {
		t.Errorf("the error does not say the URL came from the context: %s", &stderr)
	}
	time.Sleep(100 * time.Millisecond)
	if n := accepted.Load(); n != 0 {
		t.Errorf("%d connections reached 127.0.0.1:%s; a malformed URL must be refused before connecting", n, port)
	}
}
