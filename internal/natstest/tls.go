package natstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// TLSFiles are PEM files of a throwaway certificate authority and of a
// server and a client certificate it signed, in a t.TempDir().
type TLSFiles struct {
	CA         string // the authority's certificate
	ServerCert string // for 127.0.0.1 and localhost
	ServerKey  string
	ClientCert string // for client authentication
	ClientKey  string
}

// NewTLS makes a certificate authority and server and client certificates
// valid for an hour.
func NewTLS(t testing.TB) TLSFiles {
	t.Helper()
	dir := t.TempDir()
	caKey := newKey(t)
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "natstest CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatalf("natstest: CA: %v", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatalf("natstest: CA: %v", err)
	}
	files := TLSFiles{CA: filepath.Join(dir, "ca.pem")}
	writePEM(t, files.CA, "CERTIFICATE", caDER)
	issue := func(serial int64, name string, usage x509.ExtKeyUsage, certFile, keyFile string) {
		key := newKey(t)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    now.Add(-time.Minute),
			NotAfter:     now.Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatalf("natstest: certificate %s: %v", name, err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		writePEM(t, certFile, "CERTIFICATE", der)
		writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
	}
	files.ServerCert, files.ServerKey = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	files.ClientCert, files.ClientKey = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	issue(2, "natstest server", x509.ExtKeyUsageServerAuth, files.ServerCert, files.ServerKey)
	issue(3, "natstest client", x509.ExtKeyUsageClientAuth, files.ClientCert, files.ClientKey)
	return files
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("natstest: key: %v", err)
	}
	return k
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("natstest: %v", err)
	}
}

// Configure makes a server require TLS with the server certificate, and
// client certificates signed by the authority if verifyClients.
func (f TLSFiles) Configure(t testing.TB, o *server.Options, verifyClients bool) {
	t.Helper()
	cfg, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: f.ServerCert, KeyFile: f.ServerKey, CaFile: f.CA, Verify: verifyClients, Timeout: 2,
	})
	if err != nil {
		t.Fatalf("natstest: server TLS: %v", err)
	}
	o.TLS, o.TLSVerify, o.TLSConfig, o.TLSTimeout = true, verifyClients, cfg, 2
}
