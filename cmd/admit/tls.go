package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// tlsFiles names a certificate, its key and a CA bundle in PEM files. The
// files are read again when they change (checked at most every few
// seconds, on a handshake), so that certificates renewed in place — a
// Kubernetes Secret's rotation, cert-manager's — are used without a
// restart. A set of files that cannot be read keeps the last good one.
type tlsFiles struct {
	cert, key, ca string

	mu      sync.Mutex
	checked time.Time
	stamp   string // the files' sizes and modification times
	pair    *tls.Certificate
	pool    *x509.CertPool
}

// tlsRecheck is how often the files are looked at again.
const tlsRecheck = 5 * time.Second

func (f *tlsFiles) set() bool { return f.cert != "" || f.key != "" || f.ca != "" }

// load reads the files if they changed since last read.
func (f *tlsFiles) load(now time.Time) (*tls.Certificate, *x509.CertPool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pair != nil || f.pool != nil {
		if now.Sub(f.checked) < tlsRecheck {
			return f.pair, f.pool, nil
		}
	}
	f.checked = now
	stamp := ""
	for _, name := range []string{f.cert, f.key, f.ca} {
		if name == "" {
			continue
		}
		fi, err := os.Stat(name)
		if err != nil {
			return f.keep(err)
		}
		stamp += fmt.Sprintf("%s:%d:%d;", name, fi.Size(), fi.ModTime().UnixNano())
	}
	if stamp == f.stamp {
		return f.pair, f.pool, nil
	}
	var pair *tls.Certificate
	if f.cert != "" || f.key != "" {
		if f.cert == "" || f.key == "" {
			return nil, nil, errors.New("TLS: a certificate needs both its file and its key's")
		}
		p, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return f.keep(err)
		}
		pair = &p
	}
	var pool *x509.CertPool
	if f.ca != "" {
		pem, err := os.ReadFile(f.ca)
		if err != nil {
			return f.keep(err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return f.keep(fmt.Errorf("%s: no PEM certificate", f.ca))
		}
	}
	f.stamp, f.pair, f.pool = stamp, pair, pool
	return pair, pool, nil
}

// keep answers with the last good files, or err when there are none.
func (f *tlsFiles) keep(err error) (*tls.Certificate, *x509.CertPool, error) {
	if f.pair == nil && f.pool == nil {
		return nil, nil, fmt.Errorf("TLS: %w", err)
	}
	return f.pair, f.pool, nil
}

// serverConfig is a server's TLS configuration: its certificate, and with
// a CA, clients must show a certificate it signed (mutual TLS) — with
// san, one that names san.
func (f *tlsFiles) serverConfig(san string) (*tls.Config, error) {
	pair, _, err := f.load(time.Now())
	if err != nil {
		return nil, err
	}
	if pair == nil {
		return nil, errors.New("TLS: a server needs a certificate and its key")
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			pair, pool, err := f.load(time.Now())
			if err != nil {
				return nil, err
			}
			c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*pair}, NextProtos: []string{"h2"}}
			if pool != nil {
				c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, pool
				if san != "" {
					c.VerifyPeerCertificate = requireSAN(san)
				}
			}
			return c, nil
		},
	}, nil
}

// clientConfig is a client's TLS configuration: the server is checked
// against the CA (the system's without one) and, with san, must be named
// san; the certificate, if any, is shown to servers that ask.
func (f *tlsFiles) clientConfig(san string) (*tls.Config, error) {
	_, pool, err := f.load(time.Now())
	if err != nil {
		return nil, err
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: san}
	if f.cert != "" {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			pair, _, err := f.load(time.Now())
			return pair, err
		}
	}
	return c, nil
}

// requireSAN refuses a verified peer whose certificate does not name san
// (as a DNS name, URI or IP address).
func requireSAN(san string) func([][]byte, [][]*x509.Certificate) error {
	return func(_ [][]byte, chains [][]*x509.Certificate) error {
		if len(chains) == 0 || len(chains[0]) == 0 {
			return errors.New("TLS: no verified client certificate")
		}
		leaf := chains[0][0]
		for _, n := range leaf.DNSNames {
			if n == san {
				return nil
			}
		}
		for _, u := range leaf.URIs {
			if u.String() == san {
				return nil
			}
		}
		for _, ip := range leaf.IPAddresses {
			if ip.String() == san {
				return nil
			}
		}
		return fmt.Errorf("TLS: the client certificate does not name %s", san)
	}
}
