// Package permtest gives the servers of a test the users of a generated
// permissions block.
package permtest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/permissions"
)

// Auth is the accounts and users of a generated permissions block, for
// servers of a test, and every user with the random password the test
// gave it.
type Auth struct {
	// Users and Pass are every user and its password, by user name.
	Users map[string]permissions.User
	Pass  map[string]string
	// AdminPass is the password of AdminUser, a user of the router's
	// account without permissions that the tests add to the block, to
	// look at the state as it is (every stream, every key).
	AdminPass string
	// path is the block's file: every server parses it for itself (a
	// server owns the accounts it is given).
	path          string
	routerAccount string
}

// AdminUser is the name of the tests' unrestricted user of the router's
// account (not in the generated block).
const AdminUser = "test-admin"

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
	a.path, a.routerAccount = path, layout.RouterAccount
	if a.routerAccount == "" {
		a.routerAccount = permissions.DefaultRouterAccount
	}
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	a.AdminPass = "a" + hex.EncodeToString(b)
	if _, err := server.ProcessConfigFile(path); err != nil {
		t.Fatalf("nats-server does not parse the generated block: %v", err)
	}
	return a
}

// Configure sets the block's accounts and users on a server's options (for
// natstest.RunServerWith and natstest.RunClusterWith), parsed anew for
// each server.
func (a *Auth) Configure(o *server.Options) {
	parsed, err := server.ProcessConfigFile(a.path)
	if err != nil {
		panic(fmt.Sprintf("permtest: the block parsed once and not again: %v", err))
	}
	o.Accounts, o.Users = parsed.Accounts, parsed.Users
	for _, acc := range parsed.Accounts {
		if acc.GetName() == a.routerAccount {
			o.Users = append(o.Users, &server.User{Username: AdminUser, Password: a.AdminPass, Account: acc})
		}
	}
}

// JetStream returns a JetStream context for user's connection nc: under
// the user's JetStream API prefix when it has one (a consumer).
func (a *Auth) JetStream(nc *nats.Conn, user string) (jetstream.JetStream, error) {
	if p := a.Users[user].APIPrefix; p != "" {
		return jetstream.NewWithAPIPrefix(nc, p)
	}
	return jetstream.New(nc)
}
