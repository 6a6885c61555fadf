package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"maps"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestRatelimitEnvironment(t *testing.T) {
	for name, tc := range map[string]struct {
		env                       map[string]string
		http, grpc, store, config string
		xds                       string
		wait, plaintext           bool
		metrics                   string
		charge                    string // default each
	}{
		"defaults":                 {env: nil, http: "0.0.0.0:8080", grpc: "0.0.0.0:8081", store: "memory", config: "/srv/runtime_data/current/config"},
		"all or nothing asked for": {env: map[string]string{"ADMIT_CHARGE": "all"}, http: "0.0.0.0:8080", grpc: "0.0.0.0:8081", store: "memory", config: "/srv/runtime_data/current/config", charge: "all"},
		"files and a single Redis": {
			env:  map[string]string{"PORT": "9000", "GRPC_PORT": "9001", "HOST": "127.0.0.1", "RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "REDIS_AUTH": "p@ss", "USE_STATSD": "false", "USE_PROMETHEUS": "true"},
			http: "127.0.0.1:9000", grpc: "0.0.0.0:9001", store: "redis://:p%40ss@redis:6379", config: "/data/ratelimit/config", metrics: ":9090",
		},
		"Envoy Gateway: xDS, Sentinel": {
			env: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "eg:18001", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
				"REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster,s1:26379,s2:26379", "REDIS_AUTH": "u:pw", "PROMETHEUS_ADDR": ":19001", "USE_STATSD": "0", "USE_PROMETHEUS": "1"},
			http: "0.0.0.0:8080", grpc: "0.0.0.0:8081", store: "redis+sentinel://u:pw@mymaster@s1:26379,s2:26379", xds: "eg:18001", wait: true, metrics: ":19001",
		},
		"Redis over TLS with a client certificate": {
			env: map[string]string{"REDIS_URL": "redis.example:6380", "REDIS_AUTH": "admit:pw", "REDIS_TLS": "true", "REDIS_TLS_CACERT": "/ca.pem",
				"REDIS_TLS_CLIENT_CERT": "/c.pem", "REDIS_TLS_CLIENT_KEY": "/k.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"},
			http: "0.0.0.0:8080", grpc: "0.0.0.0:8081", config: "/srv/runtime_data/current/config",
			store: "rediss://admit:pw@redis.example:6380?tls_ca_file=%2Fca.pem&tls_cert_file=%2Fc.pem&tls_key_file=%2Fk.pem&tls_skip_hostname_verification=true",
		},
		"xDS in plain text, started without a configuration": {
			env:  map[string]string{"CONFIG_TYPE": "grpc_xds_sotw", "CONFIG_GRPC_XDS_SERVER_URL": "eg:18001", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "REDIS_TYPE": "CLUSTER", "REDIS_URL": "a:7000,b:7000"},
			http: "0.0.0.0:8080", grpc: "0.0.0.0:8081", store: "redis+cluster://a:7000,b:7000", xds: "eg:18001", plaintext: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			f, _, err := ratelimitFlags(func(k string) string { return tc.env[k] }, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if f.http != tc.http || f.grpc != tc.grpc || f.store != tc.store || f.envoyConfig != tc.config || f.envoyXDS != tc.xds ||
				f.waitForXDS != tc.wait || (tc.xds != "" && f.xdsPlaintext != tc.plaintext) || f.metrics != tc.metrics || f.healthPath != "/healthcheck" || !f.empty ||
				f.envoyCharge != cmp.Or(tc.charge, "each") {
				t.Fatalf("got http %s grpc %s store %s config %s xds %s wait %v plaintext %v metrics %s", f.http, f.grpc, f.store, f.envoyConfig, f.envoyXDS, f.waitForXDS, f.xdsPlaintext, f.metrics)
			}
			// envoyproxy/ratelimit's statistics: to statsd at its defaults,
			// unless Prometheus is asked for.
			want := upstreamStatsFlags{statsd: "localhost:8125", every: 10 * time.Second, nearLimit: 0.8}
			if tc.metrics != "" {
				want = upstreamStatsFlags{prometheus: true, nearLimit: 0.8}
			}
			if f.upstreamStats != want {
				t.Errorf("statistics %+v, want %+v", f.upstreamStats, want)
			}
		})
	}
}

func TestRatelimitEnvironmentRefused(t *testing.T) {
	for env, want := range map[string]string{
		"BACKEND_TYPE=memcache":                       "BACKEND_TYPE",
		"REDIS_TLS=sure":                              "REDIS_TLS",
		"REDIS_PERSECOND=true":                        "REDIS_PERSECOND",
		"REDIS_SOCKET_TYPE=unix":                      "REDIS_SOCKET_TYPE",
		"REDIS_TYPE=SENTINEL REDIS_URL=s1:1":          "master-name",
		"REDIS_TYPE=SENTINEL REDIS_URL=m:s3cret,s1:1": "REDIS_URL=\"***,s1:1\": the master's name holds",
		"REDIS_TYPE=SENTINEL REDIS_URL=m:s3cret":      "REDIS_URL=\"***\"",
		"REDIS_URL=u:s3cret@a:1,b:1":                  "REDIS_URL=\"***,b:1\": REDIS_TYPE=SINGLE takes one",
		"REDIS_TYPE=other REDIS_URL=a:1":              "REDIS_TYPE",
		"REDIS_URL=a:1,b:1":                           "SINGLE takes one",
		"CONFIG_TYPE=K8S":                             "CONFIG_TYPE",
		"CONFIG_TYPE=GRPC_XDS_SOTW":                   "CONFIG_GRPC_XDS_SERVER_URL",
		"GRPC_SERVER_USE_TLS=true":                    "GRPC_SERVER_TLS_CERT",
		"GRPC_SERVER_USE_TLS=yes-please":              "want true or false",
		"LOG_LEVEL=loud":                              "LOG_LEVEL",
		"LOG_FORMAT=xml":                              "LOG_FORMAT",
		"USE_PROMETHEUS=maybe":                        "USE_PROMETHEUS",
		"USE_PROMETHEUS=true":                         "set one of them",
		"USE_DOG_STATSD=true":                         "USE_DOG_STATSD",
		"STATSD_PORT=none":                            "STATSD_PORT",
		"STATS_FLUSH_INTERVAL=soon":                   "STATS_FLUSH_INTERVAL",
		"NEAR_LIMIT_RATIO=2":                          "NEAR_LIMIT_RATIO",
		"FORCE_START_WITHOUT_INITIAL_CONFIG=no?":      "",
		"ADMIT_CHARGE=some":                           "ADMIT_CHARGE",
		"ADMIT_QUOTA_ANSWERS=never":                   "ADMIT_QUOTA_ANSWERS",
		"QUOTA_MODE=on-sundays":                       "QUOTA_MODE",
		"SHADOW_MODE=perhaps":                         "SHADOW_MODE",
	} {
		vars := map[string]string{}
		for _, kv := range strings.Fields(env) {
			k, v, _ := strings.Cut(kv, "=")
			vars[k] = v
		}
		_, _, err := ratelimitFlags(func(k string) string { return vars[k] }, io.Discard)
		if want == "" {
			// Only read with xDS, as envoyproxy/ratelimit does.
			if err != nil {
				t.Errorf("%s: %v", env, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: got %v, want an error with %q, and no password", env, err, want)
		}
	}
	// Through the command: exit 2, the reason on stderr.
	var stderr strings.Builder
	code := run(context.Background(), []string{"ratelimit"}, &env{stdout: io.Discard, stderr: &stderr, getenv: func(k string) string {
		return map[string]string{"BACKEND_TYPE": "memcache"}[k]
	}})
	if code != 2 || !strings.Contains(stderr.String(), "BACKEND_TYPE") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}

// TestRatelimitWaitsForXDS runs admit ratelimit on an xDS server that has
// no configuration yet, without FORCE_START_WITHOUT_INITIAL_CONFIG: not
// ready until the first version arrives, then deciding by it.
func TestRatelimitWaitsForXDS(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	snapshots := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	g := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, snapshots, nil))
	go g.Serve(ln)
	t.Cleanup(func() { cancel(); g.Stop() })

	r := startCmdEnv(t, map[string]string{
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": ln.Addr().String(), "CONFIG_GRPC_XDS_NODE_ID": "rl",
		"HOST": "127.0.0.1", "PORT": "0", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "ADMIT_DATA_DIR": t.TempDir(),
	}, "ratelimit")
	health := func() int {
		resp, err := http.Get(r.url + "/healthcheck")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := health(); code != http.StatusServiceUnavailable {
		t.Fatalf("/healthcheck before any configuration: %d", code)
	}
	snap, err := cachev3.NewSnapshot("1", map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: {&rlsconfv3.RateLimitConfig{
		Name: "rl", Domain: "rl", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "foo", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: 1}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := snapshots.SetSnapshot(context.Background(), "rl", snap); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); health() != http.StatusOK; {
		if time.Now().After(deadline) {
			t.Fatalf("not ready 10 s after the first configuration: %s", r.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c := rlsClient(t, r.grpc)
	for _, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := shouldRateLimit(t, c, "rl", "foo", "x").OverallCode; got != want {
			t.Fatalf("%v, want %v", got, want)
		}
	}
}

// TestRatelimitFiles runs admit ratelimit on envoyproxy/ratelimit's
// runtime directory layout.
func TestRatelimitFiles(t *testing.T) {
	env := ratelimitRuntime(t, map[string]string{"rl.yaml": "domain: rl\ndescriptors:\n  - key: foo\n    rate_limit: {unit: day, requests_per_unit: 1}\n" +
		"  - key: tokens\n    rate_limit: {unit: day, requests_per_unit: 2}\n"})
	r := startCmdEnv(t, env(), "ratelimit")
	c := rlsClient(t, r.grpc)
	for _, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := shouldRateLimit(t, c, "rl", "foo", "x").OverallCode; got != want {
			t.Fatalf("%v, want %v", got, want)
		}
	}
	// Counted as envoyproxy/ratelimit counts (ADMIT_CHARGE defaults to
	// each): checks (hits_addend 0) between hits of 1 on 2 a day, the
	// hits counted past the limit, so the 4th check is refused.
	var checks []rlsv3.RateLimitResponse_Code
	for range 4 {
		for _, hits := range []uint64{0, 1} {
			// The descriptor's own hits_addend: the request's 0 means 1.
			tokens := []*rlext.RateLimitDescriptor{{Entries: []*rlext.RateLimitDescriptor_Entry{{Key: "tokens", Value: "t"}}, HitsAddend: wrapperspb.UInt64(hits)}}
			resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: tokens})
			if err != nil {
				t.Fatal(err)
			}
			if hits == 0 {
				checks = append(checks, resp.OverallCode)
			}
		}
	}
	if ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT; !slices.Equal(checks, []rlsv3.RateLimitResponse_Code{ok, ok, ok, over}) {
		t.Errorf("checks between hits: %v, want OK OK OK OVER_LIMIT, as envoyproxy/ratelimit answers", checks)
	}
	// The admit catalog is empty: no demo tenants.
	if code, _ := call(t, "POST", r.url+"/v1/check", `{"tenant":"t1234","action":"invoke-doc-summary-ai"}`); code == http.StatusOK {
		t.Fatalf("a demo tenant's check answered %d", code)
	}
}

// writeCert writes a self-signed certificate for name to dir, as
// name.crt and name.key.
func writeCert(t *testing.T, dir, name string, serial int64) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(k)
	cert, key = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writeFile(t, cert, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	writeFile(t, key, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})))
	return cert, key
}

// TestTLSFilesReload checks that renewed files are used once looked at
// again, and that files that cannot be read keep the last good ones.
func TestTLSFilesReload(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeCert(t, dir, "one", 1)
	f := &tlsFiles{cert: cert, key: key, ca: cert}
	t0 := time.Now()
	serial := func(now time.Time) int64 {
		t.Helper()
		pair, pool, err := f.load(now)
		if err != nil || pool == nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.SerialNumber.Int64()
	}
	if s := serial(t0); s != 1 {
		t.Fatalf("serial %d", s)
	}
	// Renewed in place (a Secret's rotation writes new files).
	os.Remove(cert)
	os.Remove(key)
	writeCert(t, dir, "one", 2)
	if s := serial(t0.Add(time.Second)); s != 1 {
		t.Fatalf("looked at again before %v: serial %d", tlsRecheck, s)
	}
	if s := serial(t0.Add(tlsRecheck + time.Second)); s != 2 {
		t.Fatalf("after %v: serial %d, want the renewed 2", tlsRecheck, s)
	}
	// Half-written: the key is garbage; the last good pair stays.
	writeFile(t, key, "not a key")
	if s := serial(t0.Add(3 * tlsRecheck)); s != 2 {
		t.Fatalf("with a broken key: serial %d", s)
	}
	// Without any good files there is no configuration.
	if _, err := (&tlsFiles{cert: cert, key: key}).serverConfig(""); err == nil {
		t.Fatal("a broken key made a server configuration")
	}
	if _, err := (&tlsFiles{cert: cert}).serverConfig(""); err == nil {
		t.Fatal("a certificate without its key made a server configuration")
	}
}

func TestRequireSAN(t *testing.T) {
	dir := t.TempDir()
	cert, _ := writeCert(t, dir, "envoy", 1)
	pair, err := tls.LoadX509KeyPair(cert, filepath.Join(dir, "envoy.key"))
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	chains := [][]*x509.Certificate{{leaf}}
	if err := requireSAN("envoy")(nil, chains); err != nil {
		t.Fatal(err)
	}
	if err := requireSAN("other")(nil, chains); err == nil {
		t.Fatal("a certificate for envoy passed as other")
	}
}

// TestRatelimitStatistics: admit ratelimit reports envoyproxy/ratelimit's
// statistics as its settings ask, under its names: to a statsd server over
// TCP (a listener the test starts), and, with USE_PROMETHEUS, on the
// metrics it serves beside Admit's own (a scrape). Three hits on a limit
// of 2: two within it (the second near it, past 0.8 × 2), one over.
func TestRatelimitStatistics(t *testing.T) {
	environ := ratelimitRuntime(t, map[string]string{"rl.yaml": "domain: rl\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: day, requests_per_unit: 2}\n"})
	hit := func(r *running) {
		c := rlsClient(t, r.grpc)
		for range 3 {
			shouldRateLimit(t, c, "rl", "tenant", "t1")
		}
		shouldRateLimit(t, c, "nobody", "tenant", "t1")
	}
	want := map[string]uint64{
		"ratelimit.service.config_load_success":                1,
		"ratelimit.service.rate_limit.rl.tenant.total_hits":    3,
		"ratelimit.service.rate_limit.rl.tenant.within_limit":  2,
		"ratelimit.service.rate_limit.rl.tenant.near_limit":    1,
		"ratelimit.service.rate_limit.rl.tenant.over_limit":    1,
		"ratelimit.service.rate_limit.nobody.domain_not_found": 1,
		"ratelimit_server.ShouldRateLimit.total_requests":      4,
	}

	t.Run("statsd", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		r := startCmdEnv(t, environ("STATSD_HOST", "127.0.0.1", "STATSD_PORT", port, "STATS_FLUSH_INTERVAL", "50ms"), "ratelimit")
		hit(r)
		got := map[string]uint64{}
		times := 0
		_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(20 * time.Second))
		conn, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		lines := bufio.NewScanner(conn)
		for !maps.Equal(got, want) || times < 4 {
			if !lines.Scan() {
				t.Fatalf("statsd: %v; got %v and %d response times, want %v and 4", lines.Err(), got, times, want)
			}
			name, rest, _ := strings.Cut(lines.Text(), ":")
			v, kind, _ := strings.Cut(rest, "|")
			n, err := strconv.ParseUint(v, 10, 64)
			switch {
			case err != nil:
				t.Fatalf("statsd line %q", lines.Text())
			case kind == "c":
				got[name] += n
			case kind == "ms" && name == "ratelimit_server.ShouldRateLimit.response_time":
				times++
			default:
				t.Fatalf("statsd line %q", lines.Text())
			}
		}
	})

	t.Run("prometheus", func(t *testing.T) {
		addr := freeAddr(t)
		r := startCmdEnv(t, environ("USE_STATSD", "false", "USE_PROMETHEUS", "true", "PROMETHEUS_ADDR", addr, "PROMETHEUS_PATH", "/stats"), "ratelimit")
		hit(r)
		_, body := get(t, "http://"+addr+"/stats")
		for _, line := range []string{
			`ratelimit_service_config_load_success 1`,
			`ratelimit_service_rate_limit_total_hits{domain="rl",key1="tenant"} 3`,
			`ratelimit_service_rate_limit_within_limit{domain="rl",key1="tenant"} 2`,
			`ratelimit_service_rate_limit_near_limit{domain="rl",key1="tenant"} 1`,
			`ratelimit_service_rate_limit_over_limit{domain="rl",key1="tenant"} 1`,
			`ratelimit_service_rate_limit_nobody_domain_not_found 1`,
			`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 4`,
			`ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 4`,
			`admit_requests_total{endpoint="grpc",result="allowed"} 3`,
		} {
			if !strings.Contains(body, "\n"+line+"\n") {
				t.Errorf("the scrape has no line %q", line)
			}
		}
		if t.Failed() {
			t.Log(body)
		}
	})

	// PROMETHEUS_MAPPER_YAML names them instead (a statsd_exporter
	// mapping file: Envoy Gateway sets one); one it cannot read names
	// nothing, as upstream, and every statistic keeps its statsd name.
	mapping := filepath.Join(t.TempDir(), "mapping.yaml")
	writeFile(t, mapping, `mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "hits"
    labels: {domain: "$1", descriptor: "$2"}
  - match: "ratelimit.service.rate_limit.*.*.near_limit"
    name: "near"
    action: drop
`)
	for name, tc := range map[string]struct {
		file        string
		want, wantN []string
	}{
		"a mapping file": {mapping, []string{
			`hits{descriptor="tenant",domain="rl"} 3`,
			`ratelimit_service_rate_limit_rl_tenant_over_limit 1`,
			`ratelimit_server_ShouldRateLimit_response_time_count 4`,
		}, []string{"near", "ratelimit_service_rate_limit_rl_tenant_near_limit", "ratelimit_service_rate_limit_total_hits"}},
		"a mapping file it cannot read": {filepath.Join(t.TempDir(), "none.yaml"), []string{
			`ratelimit_service_rate_limit_rl_tenant_total_hits 3`,
			`ratelimit_service_config_load_success 1`,
		}, []string{"ratelimit_service_rate_limit_total_hits"}},
	} {
		t.Run(name, func(t *testing.T) {
			addr := freeAddr(t)
			r := startCmdEnv(t, environ("USE_STATSD", "false", "USE_PROMETHEUS", "true", "PROMETHEUS_ADDR", addr, "PROMETHEUS_MAPPER_YAML", tc.file), "ratelimit")
			hit(r)
			_, body := get(t, "http://"+addr+"/metrics")
			for _, line := range tc.want {
				if !strings.Contains(body, "\n"+line+"\n") {
					t.Errorf("the scrape has no line %q", line)
				}
			}
			for _, prefix := range tc.wantN {
				if strings.Contains(body, "\n"+prefix+"{") || strings.Contains(body, "\n"+prefix+" ") {
					t.Errorf("the scrape has %s, which the mapping drops or renames", prefix)
				}
			}
			if t.Failed() {
				t.Log(body)
			}
		})
	}
}

// TestRatelimitLimitHeaders: with LIMIT_RESPONSE_HEADERS_ENABLED and its
// header names, admit ratelimit adds envoyproxy/ratelimit's own headers:
// the limit, remaining and reset (the seconds left in the unit's period)
// of the descriptor over its limit, else of the one with the least
// remaining; RESPONSE_DYNAMIC_METADATA fills the dynamic metadata.
func TestRatelimitLimitHeaders(t *testing.T) {
	env := ratelimitRuntime(t, map[string]string{"rl.yaml": "domain: rl\ndescriptors:\n  - key: key\n    rate_limit: {unit: minute, requests_per_unit: 10}\n" +
		"  - key: wide\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"})
	r := startCmdEnv(t, env("USE_STATSD", "false", "LIMIT_RESPONSE_HEADERS_ENABLED", "true", "LIMIT_LIMIT_HEADER", "A-Ratelimit-Limit",
		"LIMIT_REMAINING_HEADER", "A-Ratelimit-Remaining", "LIMIT_RESET_HEADER", "A-Ratelimit-Reset", "RESPONSE_DYNAMIC_METADATA", "true"), "ratelimit")
	c := rlsClient(t, r.grpc)
	awayFromWindowEnds() // the 11 requests fall in one minute
	ask := func() (map[string]string, *rlsv3.RateLimitResponse, [2]int64) {
		req := &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlext.RateLimitDescriptor{
			{Entries: []*rlext.RateLimitDescriptor_Entry{{Key: "wide", Value: "w"}}},
			{Entries: []*rlext.RateLimitDescriptor_Entry{{Key: "key", Value: "k"}}},
			{Entries: []*rlext.RateLimitDescriptor_Entry{{Key: "nolimit", Value: "x"}}},
		}}
		before := 60 - time.Now().Unix()%60
		resp, err := c.ShouldRateLimit(context.Background(), req)
		after := 60 - time.Now().Unix()%60
		if err != nil {
			t.Fatal(err)
		}
		h := map[string]string{}
		for _, v := range resp.ResponseHeadersToAdd {
			h[v.Key] = v.Value
		}
		return h, resp, [2]int64{before, after}
	}
	h, resp, _ := ask()
	if h["A-Ratelimit-Limit"] != "10" || h["A-Ratelimit-Remaining"] != "9" || len(h) != 3 {
		t.Errorf("first: headers %v, want the minute's limit, 10, with 9 remaining", h)
	}
	if resp.GetDynamicMetadata().GetFields()["domain"].GetStringValue() != "rl" {
		t.Errorf("dynamic metadata %v, want the domain", resp.GetDynamicMetadata())
	}
	for range 9 {
		ask()
	}
	h, resp, reset := ask()
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || h["A-Ratelimit-Limit"] != "10" || h["A-Ratelimit-Remaining"] != "0" ||
		(h["A-Ratelimit-Reset"] != strconv.FormatInt(reset[0], 10) && h["A-Ratelimit-Reset"] != strconv.FormatInt(reset[1], 10)) {
		t.Errorf("over: %v, headers %v, want the minute's limit, none remaining, reset in %v s", resp.OverallCode, h, reset)
	}
}

// ratelimitRuntime writes files into a runtime directory as
// envoyproxy/ratelimit reads it (RUNTIME_ROOT/ratelimit/config) and
// returns the environment of an admit ratelimit serving it on free
// loopback ports, with more settings as name, value pairs.
func ratelimitRuntime(t *testing.T, files map[string]string) func(more ...string) map[string]string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		writeFile(t, filepath.Join(dir, name), data)
	}
	return func(more ...string) map[string]string {
		m := map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit",
			"HOST": "127.0.0.1", "PORT": "0", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "ADMIT_DATA_DIR": t.TempDir()}
		for i := 0; i+1 < len(more); i += 2 {
			m[more[i]] = more[i+1]
		}
		return m
	}
}

// TestRatelimitGlobalModes: admit ratelimit reads envoyproxy/ratelimit's
// SHADOW_MODE (every request OK, counted in global_shadow_mode) and
// QUOTA_MODE (every descriptor a quota one: the request refused only when
// every descriptor is over), and answers quota groups by default.
func TestRatelimitGlobalModes(t *testing.T) {
	env := ratelimitRuntime(t, map[string]string{"rl.yaml": "domain: rl\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n" +
		"  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"})
	ask := func(c rlsv3.RateLimitServiceClient, keys ...string) *rlsv3.RateLimitResponse {
		req := &rlsv3.RateLimitRequest{Domain: "rl"}
		for _, k := range keys {
			req.Descriptors = append(req.Descriptors, &rlext.RateLimitDescriptor{Entries: []*rlext.RateLimitDescriptor_Entry{{Key: k, Value: "v"}}})
		}
		resp, err := c.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	metrics := freeAddr(t)
	shadow := rlsClient(t, startCmdEnv(t, env("USE_STATSD", "false", "USE_PROMETHEUS", "true", "PROMETHEUS_ADDR", metrics, "SHADOW_MODE", "true"), "ratelimit").grpc)
	ask(shadow, "a")
	if r := ask(shadow, "a"); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("SHADOW_MODE, a over: %v, want OK overall, a OVER_LIMIT", r)
	}
	if _, body := get(t, "http://"+metrics+"/metrics"); !strings.Contains(body, "ratelimit_service_global_shadow_mode 1") {
		t.Errorf("global_shadow_mode not counted:\n%s", body)
	}
	quota := rlsClient(t, startCmdEnv(t, env("USE_STATSD", "false", "QUOTA_MODE", "true"), "ratelimit").grpc)
	ask(quota, "a")
	if r := ask(quota, "a", "b"); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("QUOTA_MODE, a over, b not: %v, want OK overall, a OVER_LIMIT", r)
	}
	if r := ask(quota, "a", "b"); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("QUOTA_MODE, both over: %v", r)
	}
}
