package router

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func validConfig() Config {
	return Config{Name: "my-grouping-handler", Type: Local, Address: "jms", Timeout: 5 * time.Second, Node: "n1"}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string // substring of the error; "" = valid
	}{
		{"valid", func(*Config) {}, ""},
		{"remote", func(c *Config) { c.Type = Remote }, ""},
		{"dotted address", func(c *Config) { c.Address = "jms.orders" }, ""},
		{"unknown type", func(c *Config) { c.Type = "BOTH" }, "unknown type"},
		{"zero timeout", func(c *Config) { c.Timeout = 0 }, "timeout must be > 0"},
		{"negative timeout", func(c *Config) { c.Timeout = -time.Second }, "timeout must be > 0"},
		{"empty address", func(c *Config) { c.Address = "" }, "address is empty"},
		{"address is grouping", func(c *Config) { c.Address = "grouping" }, "overlaps grouping.>"},
		{"address inside grouping", func(c *Config) { c.Address = "grouping.queue" }, "overlaps grouping.>"},
		{"wildcard address", func(c *Config) { c.Address = "jms.*" }, "wildcards"},
		{"full wildcard", func(c *Config) { c.Address = ">" }, "wildcards"},
		{"empty token", func(c *Config) { c.Address = "jms..x" }, "empty token"},
		{"system address", func(c *Config) { c.Address = "$JS.API" }, "system subject"},
		{"space in address", func(c *Config) { c.Address = "j ms" }, "whitespace"},
		{"empty name", func(c *Config) { c.Name = "" }, "name is empty"},
		{"bad name", func(c *Config) { c.Name = "my handler" }, "name"},
		{"bad node", func(c *Config) { c.Node = "n.1" }, "node"},
		{"empty node", func(c *Config) { c.Node = "" }, "node"},
		{"bad header", func(c *Config) { c.GroupHeader = "Group Id" }, "group header"},
		{"negative attempts", func(c *Config) { c.MaxAttempts = -1 }, "max attempts"},
		{"replicas", func(c *Config) { c.Replicas = 7 }, "replicas"},
		{"negative events max age", func(c *Config) { c.EventsMaxAge = -time.Hour }, "durations must be > 0"},
		{"inbox prefix", func(c *Config) { c.InboxPrefix = "_INBOX_app" }, ""},
		{"inbox prefix wildcard", func(c *Config) { c.InboxPrefix = "app*" }, "inbox prefix"},
		{"inbox prefix trailing dot", func(c *Config) { c.InboxPrefix = "app." }, "inbox prefix"},
		{"domain", func(c *Config) { c.JSDomain = "hub" }, ""},
		{"domain with a dot", func(c *Config) { c.JSDomain = "hub.east" }, "domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mutate(&c)
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want ErrConfig containing %q", err, tt.want)
			}
		})
	}
}

func TestParseHandlerType(t *testing.T) {
	for in, want := range map[string]HandlerType{"LOCAL": Local, "local": Local, " Remote ": Remote} {
		if got, err := ParseHandlerType(in); err != nil || got != want {
			t.Errorf("ParseHandlerType(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseHandlerType("BACKUP"); !errors.Is(err, ErrConfig) {
		t.Errorf("ParseHandlerType(BACKUP) error = %v", err)
	}
}

func TestNewInboxPrefix(t *testing.T) {
	tests := []struct {
		name       string
		conn, cfg  string // the connection's custom prefix and Config.InboxPrefix
		want, fail string
	}{
		{name: "defaults", want: DefaultInboxPrefix},
		{name: "from the connection", conn: "app", want: "app"},
		{name: "same as the connection", conn: "app", cfg: "app", want: "app"},
		{name: "not the connection's", conn: "app", cfg: "other", fail: "inbox prefix"},
		{name: "connection has the default", cfg: "other", fail: "inbox prefix"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := validConfig()
			cfg.InboxPrefix = tt.cfg
			r, err := New(&nats.Conn{Opts: nats.Options{InboxPrefix: tt.conn}}, cfg)
			if tt.fail != "" {
				if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.fail) {
					t.Fatalf("New: %v, want ErrConfig about %q", err, tt.fail)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.cfg.InboxPrefix != tt.want {
				t.Errorf("inbox prefix %q, want %q", r.cfg.InboxPrefix, tt.want)
			}
		})
	}
}
