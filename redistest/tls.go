package redistest

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
	"strconv"
	"testing"
	"time"
)

// TLSFiles are the PEM files of a test's own certificate authority, a
// server certificate it signed for 127.0.0.1 and localhost, and a client
// certificate it signed, written to a temporary directory.
type TLSFiles struct {
	CA                    string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
	// OtherCA is a CA that signed none of them: a client that trusts it
	// must refuse the servers.
	OtherCA string
}

// NewTLSFiles makes a CA and the certificates it signs for a test.
func NewTLSFiles(tb testing.TB) TLSFiles {
	tb.Helper()
	dir := tb.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			tb.Fatal(err)
		}
		return p
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			tb.Fatal(err)
		}
		return k
	}
	serial := int64(1)
	template := func(cn string) *x509.Certificate {
		serial++
		return &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		}
	}
	newCA := func(cn string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		key := newKey()
		t := template(cn)
		t.IsCA, t.BasicConstraintsValid, t.KeyUsage = true, true, x509.KeyUsageCertSign|x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, t, t, &key.PublicKey, key)
		if err != nil {
			tb.Fatal(err)
		}
		cert, _ := x509.ParseCertificate(der)
		return cert, key, der
	}
	ca, caKey, caDER := newCA("admit test CA")
	_, _, otherDER := newCA("another CA")
	leaf := func(cn string, usage []x509.ExtKeyUsage, ips []net.IP, names []string) ([]byte, []byte) {
		key := newKey()
		t := template(cn)
		t.ExtKeyUsage, t.KeyUsage, t.IPAddresses, t.DNSNames = usage, x509.KeyUsageDigitalSignature, ips, names
		der, err := x509.CreateCertificate(rand.Reader, t, ca, &key.PublicKey, caKey)
		if err != nil {
			tb.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			tb.Fatal(err)
		}
		return der, kder
	}
	// Redis shows its own certificate when it connects to its peers
	// (replication, the cluster bus, a Sentinel's master), so the server
	// certificate serves as a client's too.
	sDER, sKey := leaf("redis", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, []net.IP{net.IPv4(127, 0, 0, 1)}, []string{"localhost"})
	cDER, cKey := leaf("admit", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil)
	return TLSFiles{
		CA:         write("ca.pem", "CERTIFICATE", caDER),
		ServerCert: write("server.pem", "CERTIFICATE", sDER), ServerKey: write("server.key", "EC PRIVATE KEY", sKey),
		ClientCert: write("client.pem", "CERTIFICATE", cDER), ClientKey: write("client.key", "EC PRIVATE KEY", cKey),
		OtherCA: write("other-ca.pem", "CERTIFICATE", otherDER),
	}
}

// tlsArgs are the redis-server arguments that also serve TLS on port,
// asking clients for a certificate the CA signed; the plain port stays, on
// loopback, for the harness's own commands.
func (f TLSFiles) tlsArgs(port int) []string {
	return []string{"--tls-port", strconv.Itoa(port), "--tls-cert-file", f.ServerCert, "--tls-key-file", f.ServerKey,
		"--tls-ca-cert-file", f.CA, "--tls-auth-clients", "yes", "--tls-replication", "yes"}
}

// StartTLS starts a standalone redis-server that serves TLS on
// Server.TLSAddr (client certificates required) besides its plain port;
// extra are more arguments, as for Start.
func StartTLS(tb testing.TB, f TLSFiles, extra ...string) *Server {
	tb.Helper()
	port := freePort(tb)
	s := &Server{dir: tb.TempDir(), args: append(f.tlsArgs(port), extra...), TLSPort: port}
	s.TLSAddr = "127.0.0.1:" + strconv.Itoa(port)
	return startServer(tb, s)
}

// StartSentinelTLS starts a Sentinel that monitors master (a StartTLS
// server) under name over TLS and serves its clients on TLSAddr; the
// master's address it gives them is the master's TLS one. extra are more
// arguments (users, say).
func StartSentinelTLS(tb testing.TB, master *Server, name string, f TLSFiles, extra ...string) *Server {
	tb.Helper()
	if master.TLSPort == 0 {
		tb.Fatal("redistest: StartSentinelTLS monitors a server started with StartTLS")
	}
	tls := *master
	tls.Port = master.TLSPort
	s := sentinel(tb, &tls, name, 1)
	port := freePort(tb)
	s.args, s.TLSPort, s.TLSAddr = append(f.tlsArgs(port), extra...), port, "127.0.0.1:"+strconv.Itoa(port)
	return startServer(tb, s)
}

// StartClusterTLS starts a cluster of masters as StartCluster does, each
// node serving TLS too (and the cluster bus over TLS). Redis answers a
// client on its TLS port with the nodes' TLS addresses.
func StartClusterTLS(tb testing.TB, masters int, f TLSFiles) []*Server {
	tb.Helper()
	nodes := make([]*Server, masters)
	for i := range nodes {
		nodes[i] = StartTLS(tb, f, append(clusterArgs, "--tls-cluster", "yes")...)
	}
	joinCluster(tb, nodes, 0)
	return nodes
}
