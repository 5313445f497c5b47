// Package permtest gives the servers of a test the users of a generated
// permissions block.
package permtest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"grouprouter/internal/permissions"
)

// Auth is the users of a generated permissions block, for servers of a
// test: the block as nats-server parsed it, and every user with the random
// password the test gave it.
type Auth struct {
	// ServerUsers are the block's users, for server.Options.Users.
	ServerUsers []*server.User
	// Users and Pass are every user and its password, by user name.
	Users map[string]permissions.User
	Pass  map[string]string
}

// NewAuth writes layout's permissions block to a file, gives every user a
// random password (set, for the test, in the environment variable the
// block reads it from) and has nats-server parse the block, failing the
// test if it does not.
func NewAuth(t *testing.T, layout permissions.Layout) *Auth {
	t.Helper()
	var block bytes.Buffer
	if err := layout.WriteConfig(&block); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "grouprouter-auth.conf")
	if err := os.WriteFile(path, block.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	us, err := layout.Users()
	if err != nil {
		t.Fatal(err)
	}
	a := &Auth{Users: map[string]permissions.User{}, Pass: map[string]string{}}
	for _, u := range us {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		a.Users[u.Name], a.Pass[u.Name] = u, "p"+hex.EncodeToString(b)
		t.Setenv(u.PasswordEnv, a.Pass[u.Name])
	}
	parsed, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server does not parse the generated block: %v", err)
	}
	a.ServerUsers = parsed.Users
	return a
}

// Configure sets the users on a server's options (for natstest.RunServerWith and
// natstest.RunClusterWith).
func (a *Auth) Configure(o *server.Options) { o.Users = a.ServerUsers }
