package redisstore_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
)

// TestTLSAndACL: the store reaches a standalone server, a Sentinel's
// master and a 3-master Cluster over TLS (client certificates required)
// as an ACL user, as managed Redis services need; it refuses a server its
// CA did not sign, and a TLS port is not reached without TLS or without a
// client certificate. The default user may not run scripts, so a decision
// that succeeds was made as the named user.
func TestTLSAndACL(t *testing.T) {
	f := redistest.NewTLSFiles(t)
	acl := []string{"--user", "default", "on", "nopass", "~*", "&*", "+@all", "-@scripting",
		"--user", "admit", "on", ">s3cret", "~*", "&*", "+@all"}
	q := url.Values{"tls_ca_file": {f.CA}, "tls_cert_file": {f.ClientCert}, "tls_key_file": {f.ClientKey}}.Encode()
	master := redistest.StartTLS(t, f, acl...)
	// The sentinels know the same user: the store signs in to both alike.
	sentinel := redistest.StartSentinelTLS(t, master, "mymaster", f, "--user", "admit", "on", ">s3cret", "~*", "&*", "+@all")
	nodes := redistest.StartClusterTLS(t, 3, f)
	for _, d := range []struct{ name, url string }{
		{"standalone", "rediss://admit:s3cret@" + master.TLSAddr + "?" + q},
		{"sentinel", "rediss+sentinel://admit:s3cret@mymaster@" + sentinel.TLSAddr + "?" + q},
		{"cluster", "rediss+cluster://" + nodes[0].TLSAddr + "," + nodes[1].TLSAddr + "?" + q},
	} {
		t.Run(d.name, func(t *testing.T) {
			s := dial(t, d.url)
			r := &admit.Rule{Name: "r", Algorithm: admit.FixedWindow, Limit: 2, Window: time.Hour}
			ch := []admit.Charge{{Key: admit.Key{Scope: "tenant", Tenant: d.name, Rule: "r"}.String(), Rule: r, Cost: 1}}
			var dec admit.Decision
			for i, want := range []bool{true, true, false} {
				if err := s.Decide(context.Background(), ch, &dec); err != nil || dec.Allowed != want {
					t.Fatalf("decision %d over TLS: %v allowed %v, want %v", i, err, dec.Allowed, want)
				}
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for what, u := range map[string]string{
		"another CA":          "rediss://admit:s3cret@" + master.TLSAddr + "?" + url.Values{"tls_ca_file": {f.OtherCA}, "tls_cert_file": {f.ClientCert}, "tls_key_file": {f.ClientKey}}.Encode(),
		"no client cert":      "rediss://admit:s3cret@" + master.TLSAddr + "?" + url.Values{"tls_ca_file": {f.CA}}.Encode(),
		"no TLS":              "redis://admit:s3cret@" + master.TLSAddr,
		"a wrong server name": "rediss://admit:s3cret@" + master.TLSAddr + "?" + q + "&tls_server_name=redis.example",
		"a wrong password":    "rediss://admit:nope@" + master.TLSAddr + "?" + q,
	} {
		if s, err := redisstore.Open(ctx, u, &redisstore.Options{Timeout: time.Second}); err == nil {
			s.Close()
			t.Errorf("%s: connected", what)
		}
	}
	// The name check can be skipped, the chain's cannot.
	if s, err := redisstore.Open(ctx, "rediss://admit:s3cret@"+master.TLSAddr+"?"+q+"&tls_server_name=redis.example&tls_skip_hostname_verification=true", &redisstore.Options{Timeout: time.Second}); err != nil {
		t.Errorf("skipping the name check: %v", err)
	} else {
		s.Close()
	}
	// The default user (no name) may not decide: the named user did.
	s := dial(t, "rediss://"+master.TLSAddr+"?"+q)
	var dec admit.Decision
	r := &admit.Rule{Name: "r", Algorithm: admit.FixedWindow, Limit: 2, Window: time.Hour}
	if err := s.Decide(ctx, []admit.Charge{{Key: "k", Rule: r, Cost: 1}}, &dec); err == nil {
		t.Error("the default user decided; the ACL user was not the one used")
	}
}
