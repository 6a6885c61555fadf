package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/admitdev/admit/redistest"
)

// TestServeRedisSharedCatalog runs two servers on one Redis: they share the
// limits and the tenant catalog, and a third started after both stopped
// finds the changes.
func TestServeRedisSharedCatalog(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	a := startServe(t, "--store", url, "--data-dir", t.TempDir())
	b := startServe(t, "--store", url, "--data-dir", t.TempDir())

	if code, _ := call(t, "PUT", a.url+"/v1/admin/tenants/newco", `{"tier":"premium"}`); code != 200 {
		t.Fatalf("create tenant on a: %d", code)
	}
	start := time.Now()
	waitFor(t, func() bool {
		code, _ := call(t, "POST", b.url+"/v1/check", `{"tenant":"newco","user":"u"}`)
		return code == 200
	}, "server b to know server a's tenant")
	t.Logf("the change reached server b after %v (waitFor's bound: 5s)", time.Since(start))

	// One limit across both servers: seed 000's tenant t1234 (tier free)
	// may schedule a burst of 10 emails (the demo's schedule-email rule).
	admitted := 0
	for i := range 14 {
		s := a
		if i%2 == 1 {
			s = b
		}
		code, _ := call(t, "POST", s.url+"/v1/check", `{"tenant":"t1234","user":"ann","action":"schedule-email"}`)
		if code == 200 {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("admitted %d of 14 across two servers, want the rule's burst of 10", admitted)
	}

	_, ready := call(t, "GET", a.url+"/readyz", "")
	if ready["status"] != "ready" || ready["breaker"] != "closed" {
		t.Errorf("readyz %v", ready)
	}
	a.stop()
	b.stop()
	c := startServe(t, "--store", url, "--data-dir", t.TempDir())
	if _, m := call(t, "GET", c.url+"/v1/admin/tenants/newco", ""); m["tier"] != "premium" {
		t.Errorf("after every server restarted newco is %v", m)
	}

	// With Redis gone, readiness says so, and stays ready: the demo's
	// rules fail open, and this server decides them.
	srv.Kill()
	code, m := call(t, "GET", c.url+"/readyz", "")
	if code != 200 || m["status"] != "ready" || !strings.Contains(m["store"].(string), "redisstore: ping") || fmt.Sprint(m["on_error"]) != "[open]" {
		t.Errorf("readyz with Redis down: %d %v", code, m)
	}
}

// TestReadinessKeepsTheFailureMode: with the store down, a server whose
// rules all fail open or local is ready, since it decides as they say
// (a load balancer taking it out would serve no one); one with a rule
// that fails closed is not, and names the rule. A reload that adds one
// makes the server unready at once.
func TestReadinessKeepsTheFailureMode(t *testing.T) {
	srv := redistest.Start(t)
	spec := filepath.Join(t.TempDir(), "admit.yaml")
	open := "version: 1\nstore:\n  on_error: open\ntiers:\n  free:\n    rules:\n" +
		"      - {name: calls, scope: tenant, algorithm: token_bucket, rate: 10/s, burst: 10}\n" +
		"      - {name: exports, scope: tenant, algorithm: fixed_window, limit: 5, window: 1m, on_error: local}\n" +
		"tenants:\n  t1: {tier: free}\n"
	writeFile(t, spec, open)
	s := startServe(t, "--store", "redis://"+srv.Addr, "--config", spec)
	if code, m := call(t, "GET", s.url+"/readyz", ""); code != 200 || m["store"] != "ok" {
		t.Fatalf("readyz: %d %v", code, m)
	}
	srv.Kill()
	code, m := call(t, "GET", s.url+"/readyz", "")
	if code != 200 || m["status"] != "ready" || fmt.Sprint(m["on_error"]) != "[open local]" || !strings.Contains(fmt.Sprint(m["store"]), "ping") {
		t.Errorf("readyz with Redis down, rules open and local: %d %v; want 200, ready, on_error [open local], the store's error", code, m)
	}
	if code, m := call(t, "POST", s.url+"/v1/check", `{"tenant":"t1"}`); code != 200 || m["failover"] != "local" {
		t.Errorf("a check with Redis down: %d %v; want admitted by the local limiter", code, m)
	}
	// A rule that fails closed: unready, the rule named.
	writeFile(t, spec, strings.Replace(open, "burst: 10}", "burst: 10, on_error: closed}", 1))
	s.reload <- struct{}{}
	waitFor(t, func() bool { code, _ := call(t, "GET", s.url+"/readyz", ""); return code == 503 },
		"readyz 503 after a reload added a rule that fails closed, Redis down")
	code, m = call(t, "GET", s.url+"/readyz", "")
	if m["status"] != "unavailable" || fmt.Sprint(m["closed_rules"]) != "[free/calls]" {
		t.Errorf("readyz with a closed rule, Redis down: %d %v; want unavailable, closed_rules [free/calls]", code, m)
	}
}

// TestReadinessEnvoyFilesClosed: the limits of envoyproxy/ratelimit
// files fail as store.on_error says; with it closed and Redis down the
// server answers their domains UNAVAILABLE, so /readyz is 503 naming the
// domain though every rule of the configuration fails open.
func TestReadinessEnvoyFilesClosed(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	spec := filepath.Join(dir, "admit.yaml")
	writeFile(t, spec, "version: 1\nstore:\n  on_error: closed\ntiers:\n  free:\n    rules:\n"+
		"      - {name: calls, scope: tenant, algorithm: token_bucket, rate: 10/s, burst: 10, on_error: open}\ntenants:\n  t1: {tier: free}\n")
	envoy := filepath.Join(dir, "rl")
	if err := os.Mkdir(envoy, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(envoy, "edge.yaml"), "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	s := startServe(t, "--store", "redis://"+srv.Addr, "--config", spec, "--envoy-config", envoy)
	if code, m := call(t, "GET", s.url+"/readyz", ""); code != 200 || m["store"] != "ok" {
		t.Fatalf("readyz: %d %v", code, m)
	}
	srv.Kill()
	code, m := call(t, "GET", s.url+"/readyz", "")
	if code != 503 || m["status"] != "unavailable" || fmt.Sprint(m["closed_rules"]) != "[envoy:edge]" {
		t.Errorf("readyz with Redis down, the files' limits failing closed: %d %v; want 503, closed_rules [envoy:edge]", code, m)
	}
}

// TestEnvoyRedisShared: two servers on one Redis decide an
// envoyproxy/ratelimit limit together, exactly; a limit the Redis store
// cannot hold is refused at start with its position.
func TestEnvoyRedisShared(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rl.yaml"), "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 7}\n")
	a := startServe(t, "--store", url, "--data-dir", t.TempDir(), "--envoy-config", dir)
	b := startServe(t, "--store", url, "--data-dir", t.TempDir(), "--envoy-config", dir)
	ca, cb := rlsClient(t, a.grpc), rlsClient(t, b.grpc)
	admitted := 0
	for i := range 12 {
		c := ca
		if i%2 == 1 {
			c = cb
		}
		if shouldRateLimit(t, c, "rl", "user", "u1").OverallCode == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	if admitted != 7 {
		t.Fatalf("admitted %d of 12 across two servers, want 7", admitted)
	}

	writeFile(t, filepath.Join(dir, "year.yaml"), "domain: yearly\ndescriptors:\n  - key: user\n    rate_limit: {unit: year, requests_per_unit: 7}\n")
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--store", url, "--data-dir", t.TempDir(), "--envoy-config", dir},
		&env{stdout: io.Discard, stderr: &stderr, getenv: os.Getenv})
	if code != 2 || !strings.Contains(stderr.String(), "year.yaml:4:17: yearly.user: rule") || !strings.Contains(stderr.String(), "longer than the Redis store's") {
		t.Fatalf("a year window on Redis: exit %d: %s", code, stderr.String())
	}
}

// TestEnvoyChargeEachRedis: a domain with charge: each counts every hit on
// a shared Redis as envoyproxy/ratelimit does, past the limit: a stream's
// cost sent when it ends (hits_addend) leaves the counter over its limit,
// and both servers refuse the next check. POST /v1/report debits the same
// way through the HTTP API.
func TestEnvoyChargeEachRedis(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rl.yaml"), "domain: rl\ncharge: each\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 5}\n")
	a := startServe(t, "--store", url, "--data-dir", t.TempDir(), "--envoy-config", dir)
	b := startServe(t, "--store", url, "--data-dir", t.TempDir(), "--envoy-config", dir)
	ask := func(c rlsv3.RateLimitServiceClient, hits uint64) *rlsv3.RateLimitResponse {
		d := &rlext.RateLimitDescriptor{Entries: []*rlext.RateLimitDescriptor_Entry{{Key: "user", Value: "u1"}}, HitsAddend: wrapperspb.UInt64(hits)}
		resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlext.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	ca, cb := rlsClient(t, a.grpc), rlsClient(t, b.grpc)
	if r := ask(ca, 0); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 5 {
		t.Fatalf("check: %v", r)
	}
	if r := ask(cb, 3); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("3 of 5: %v", r)
	}
	if r := ask(ca, 3); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("6 of 5: %v", r)
	}
	for _, c := range []rlsv3.RateLimitServiceClient{ca, cb} {
		if r := ask(c, 0); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("a check after the counter passed its limit: %v", r)
		}
	}

	// The HTTP API's debits, on the same Redis: the default tier's rules
	// are the demo's; a report past a bucket's burst refuses the next check.
	spec := filepath.Join(t.TempDir(), "admit.yaml")
	writeFile(t, spec, "version: 1\ntiers:\n  free:\n    rules:\n      - {name: ai, scope: tenant, algorithm: token_bucket, rate: 10/hour, burst: 10, max_cost: 20}\ntenants:\n  t1: {tier: free}\n")
	h := startServe(t, "--store", url, "--data-dir", t.TempDir(), "--config", spec)
	if code, _ := call(t, "POST", h.url+"/v1/check", `{"tenant":"t1","cost":0}`); code != 200 {
		t.Fatalf("check before the work: %d", code)
	}
	if code, body := call(t, "POST", h.url+"/v1/report", `{"tenant":"t1","cost":14}`); code != 200 || body["allowed"] != true || body["over_limit"] != true || body["remaining"] != float64(0) {
		t.Fatalf("report of 14: %d %v", code, body)
	}
	// A debt of 4 tokens at 6 minutes each, plus the token asked for: 30
	// minutes from the report, less the time Redis's clock moved since.
	code, body := call(t, "POST", h.url+"/v1/check", `{"tenant":"t1"}`)
	if retry, _ := body["retry_after_ms"].(float64); code != 429 || retry > 30*60*1000 || retry < 29*60*1000 {
		t.Fatalf("check after a debt of 4 tokens: %d %v", code, body)
	}
}

// TestUsageRecordsRedis: two servers on one Redis meter a quota's usage;
// once they stop (writing their last records), a third reads the sums, in
// JSON and CSV, as a billing job would.
func TestUsageRecordsRedis(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	spec := filepath.Join(t.TempDir(), "admit.yaml")
	writeFile(t, spec, "version: 1\ntiers:\n  free:\n    rules:\n      - {name: ai, scope: tenant, algorithm: quota, limit: 5, period: month, max_cost: 100}\ntenants:\n  t1: {tier: free}\n")
	a := startServe(t, "--store", url, "--data-dir", t.TempDir(), "--config", spec)
	b := startServe(t, "--store", url, "--data-dir", t.TempDir(), "--config", spec)
	statuses := map[int]int{}
	for i := range 8 {
		h := a
		if i%2 == 1 {
			h = b
		}
		code, _ := call(t, "POST", h.url+"/v1/check", `{"tenant":"t1"}`)
		statuses[code]++
	}
	if code, body := call(t, "POST", a.url+"/v1/report", `{"tenant":"t1","cost":40}`); code != 200 || body["over_limit"] != true {
		t.Fatalf("report: %d", code)
	}
	if statuses[200] != 5 || statuses[429] != 3 {
		t.Fatalf("statuses %v, want 5 admitted and 3 refused", statuses)
	}
	a.stop()
	b.stop()

	c := startServe(t, "--store", url, "--data-dir", t.TempDir(), "--config", spec)
	code, body := call(t, "GET", c.url+"/v1/admin/usage?tenant=t1", "")
	recs, _ := body["records"].([]any)
	if code != 200 || len(recs) != 1 {
		t.Fatalf("usage: %d %v", code, body)
	}
	r := recs[0].(map[string]any)
	// A calendar month (the one the test ran in).
	start, _ := time.Parse(time.RFC3339, fmt.Sprint(r["period_start"]))
	if start.Day() != 1 || start.Hour() != 0 || r["rule"] != "ai" || r["admitted"] != float64(5) || r["refused"] != float64(3) || r["cost"] != float64(45) ||
		r["period_start"] != start.Format(time.RFC3339) || r["period_end"] != start.AddDate(0, 1, 0).Format(time.RFC3339) {
		t.Fatalf("record %v", r)
	}
	req, _ := http.NewRequest("GET", c.url+"/v1/admin/usage?tenant=t1", nil)
	asAdmin(req)
	req.Header.Set("Accept", "text/csv")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	csv, _ := io.ReadAll(resp.Body)
	want := "tenant,rule,period_start,period_end,admitted,refused,cost,failover,failover_cost\nt1,ai," + start.Format(time.RFC3339) + "," + start.AddDate(0, 1, 0).Format(time.RFC3339) + ",5,3,45,0,0\n"
	if string(csv) != want {
		t.Fatalf("CSV:\n%s\nwant\n%s", csv, want)
	}
	if code, _ := call(t, "GET", c.url+"/v1/admin/usage", ""); code != 400 {
		t.Fatalf("no tenant: %d", code)
	}
}

// TestServeRedisTLS: admit serve reaches Redis over TLS as an ACL user,
// from the store section of its configuration (the password from the
// environment), and admit ratelimit does from envoyproxy/ratelimit's
// REDIS_TLS variables; both decide, and the password is in no log line.
func TestServeRedisTLS(t *testing.T) {
	f := redistest.NewTLSFiles(t)
	srv := redistest.StartTLS(t, f, "--user", "default", "on", "nopass", "~*", "&*", "+@all", "-@scripting",
		"--user", "admit", "on", ">tls-s3cret", "~*", "&*", "+@all")
	spec := filepath.Join(t.TempDir(), "admit.yaml")
	writeFile(t, spec, fmt.Sprintf(`version: 1
store:
  backend: redis
  redis:
    addrs: [%q]
    username: admit
    password: ${REDIS_PASSWORD}
    tls: {enabled: true, ca_file: %q, cert_file: %q, key_file: %q}
tiers:
  free:
    rules:
      - {name: r, scope: tenant, algorithm: fixed_window, limit: 2, window: 1h}
tenants:
  t1: {tier: free}
`, srv.TLSAddr, f.CA, f.ClientCert, f.ClientKey))
	t.Setenv("REDIS_PASSWORD", "tls-s3cret") // ${VAR} in a configuration reads the process's environment
	s := startServe(t, "--config", spec, "--data-dir", t.TempDir())
	for i, want := range []int{200, 200, 429} {
		if code, body := call(t, "POST", s.url+"/v1/check", `{"tenant":"t1"}`); code != want {
			t.Fatalf("check %d over TLS: %d %v\n%s", i, code, body, s.stderr)
		}
	}
	if code, body := call(t, "GET", s.url+"/readyz", ""); code != 200 {
		t.Fatalf("readyz: %d %v", code, body)
	}

	root := t.TempDir()
	dir := filepath.Join(root, "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "rl.yaml"), "domain: rl\ndescriptors:\n  - key: foo\n    rate_limit: {unit: day, requests_per_unit: 1}\n")
	r := startCmdEnv(t, map[string]string{"RUNTIME_ROOT": root, "HOST": "127.0.0.1", "PORT": "0", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0",
		"ADMIT_DATA_DIR": t.TempDir(), "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.TLSAddr, "REDIS_AUTH": "admit:tls-s3cret",
		"REDIS_TLS": "true", "REDIS_TLS_CACERT": f.CA, "REDIS_TLS_CLIENT_CERT": f.ClientCert, "REDIS_TLS_CLIENT_KEY": f.ClientKey, "LOG_LEVEL": "info"}, "ratelimit")
	c := rlsClient(t, r.grpc)
	for _, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := shouldRateLimit(t, c, "rl", "foo", "x").OverallCode; got != want {
			t.Fatalf("admit ratelimit over TLS: %v, want %v", got, want)
		}
	}
	for _, out := range []string{s.stderr.String(), r.stderr.String()} {
		if strings.Contains(out, "tls-s3cret") {
			t.Errorf("the Redis password is in the log:\n%s", out)
		}
	}
	// A wrong password: refused at start, the password not in the error.
	var stderr strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a server that started anyway stops
	defer cancel()
	code := run(ctx, []string{"serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--store", "rediss://admit:wrong-s3cret@" + srv.TLSAddr + "?tls_ca_file=" + f.CA + "&tls_cert_file=" + f.ClientCert + "&tls_key_file=" + f.ClientKey},
		&env{stdout: io.Discard, stderr: &stderr, getenv: func(string) string { return "" }})
	if code != 2 || strings.Contains(stderr.String(), "wrong-s3cret") {
		t.Errorf("a wrong password: exit %d, output %s", code, stderr.String())
	}
}

// TestIdempotencyRedis: two servers on one Redis share idempotency keys:
// a report retried on the other server, and retries sent to both at once,
// are one charge.
func TestIdempotencyRedis(t *testing.T) {
	srv := redistest.Start(t)
	spec := filepath.Join(t.TempDir(), "admit.yaml")
	writeFile(t, spec, "version: 1\ntiers:\n  free:\n    rules:\n      - {name: q, scope: tenant, algorithm: quota, limit: 100, period: month, max_cost: 100}\ntenants:\n  t1: {tier: free}\n")
	a := startServe(t, "--store", "redis://"+srv.Addr, "--config", spec)
	b := startServe(t, "--store", "redis://"+srv.Addr, "--config", spec)
	report := func(s *running, key string) (int, http.Header) {
		req, _ := http.NewRequest("POST", s.url+"/v1/report", strings.NewReader(`{"tenant":"t1","cost":30}`))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	if code, _ := report(a, "k1"); code != 200 {
		t.Fatalf("report: %d", code)
	}
	if code, h := report(b, "k1"); code != 200 || h.Get("Idempotent-Replayed") != "true" {
		t.Errorf("its retry on the other server: %d, replayed %q", code, h.Get("Idempotent-Replayed"))
	}
	// Ten retries of k2 at once, half to each server.
	var wg sync.WaitGroup
	codes := make([]int, 10)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := a
			if i%2 == 1 {
				s = b
			}
			codes[i], _ = report(s, "k2")
		}()
	}
	wg.Wait()
	for _, c := range codes {
		if c != 200 && c != 409 {
			t.Errorf("retries at once: %v, want 200s and 409s", codes)
			break
		}
	}
	// Charged 30 + 30 of 100: 40 left, 39 after a dry run's 1.
	if _, m := call(t, "POST", a.url+"/v1/check", `{"tenant":"t1","dry_run":true}`); m["remaining"] != float64(39) {
		t.Errorf("after two keys' reports and their retries: %v, want 40 of 100 left (39 after the dry run)", m)
	}
	// Redis down: a report with a key is decided by on_error (open), as
	// one without, not an error.
	srv.Kill()
	if code, h := report(a, "k3"); code != 200 || h.Get("Idempotent-Replayed") != "" {
		t.Errorf("a report with a key, Redis down: %d, replayed %q; want 200 by on_error", code, h.Get("Idempotent-Replayed"))
	}
}

// TestIdempotencyRedisBounded: through admit serve on Redis, a keyed
// request that charged nothing (an anonymous check no rule applies to, a
// report of cost 0) leaves no key in Redis, and a tenant holds at most
// server.idempotency_keys_per_tenant keys: past them its keyed reports
// are 429 with Retry-After, another tenant's go on.
func TestIdempotencyRedisBounded(t *testing.T) {
	srv := redistest.Start(t)
	spec := filepath.Join(t.TempDir(), "admit.yaml")
	writeFile(t, spec, "version: 1\nserver:\n  idempotency_keys_per_tenant: 5\ntiers:\n  free:\n    rules:\n      - {name: q, scope: tenant, algorithm: quota, limit: 1000, period: month, max_cost: 100}\ntenants:\n  t1: {tier: free}\n  t2: {tier: free}\n")
	a := startServe(t, "--store", "redis://"+srv.Addr, "--config", spec)
	send := func(path, body, key string) (int, http.Header) {
		req, _ := http.NewRequest("POST", a.url+path, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	for i := range 100 {
		k := "flood-" + strconv.Itoa(i)
		if code, _ := send("/v1/check", `{"cost":1}`, k); code != 200 {
			t.Fatalf("an anonymous keyed check: %d", code)
		}
		if code, _ := send("/v1/report", `{"tenant":"t1","cost":0}`, k); code != 200 {
			t.Fatalf("a keyed report of cost 0: %d", code)
		}
	}
	if out := redisCLI(t, srv.Addr, "--scan", "--pattern", "admit:idem:*"); out != "" {
		t.Fatalf("keys kept of requests that charged nothing:\n%s", out)
	}
	for i := range 5 {
		if code, _ := send("/v1/report", `{"tenant":"t1","cost":1}`, "t1-"+strconv.Itoa(i)); code != 200 {
			t.Fatalf("t1's keyed report %d: %d", i, code)
		}
	}
	code, h := send("/v1/report", `{"tenant":"t1","cost":1}`, "t1-5")
	if ra, _ := strconv.Atoi(h.Get("Retry-After")); code != 429 || ra < 1 || ra > 3600 {
		t.Errorf("t1's sixth key: %d, Retry-After %q; want 429 and the wait for its first key", code, h.Get("Retry-After"))
	}
	if code, _ := send("/v1/report", `{"tenant":"t2","cost":1}`, "t1-5"); code != 200 {
		t.Errorf("t2's keyed report: %d, want 200", code)
	}
}

// redisCLI runs redis-cli against addr and returns its output, trimmed.
func redisCLI(t *testing.T, addr string, args ...string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestIdempotencyRedisPaused: a keyed report sent while Redis is paused
// is answered by the failure mode without a charge sent to the store
// (which a paused Redis would apply on waking); once Redis is back, its
// retry on another server is that answer again (the first server gave
// the store its answer) or, if the key's claim never reached Redis,
// decided there: charged at most once.
func TestIdempotencyRedisPaused(t *testing.T) {
	srv := redistest.Start(t)
	spec := filepath.Join(t.TempDir(), "admit.yaml")
	writeFile(t, spec, "version: 1\nstore:\n  on_error: open\ntiers:\n  free:\n    rules:\n      - {name: q, scope: tenant, algorithm: quota, limit: 1000, period: month, max_cost: 100}\ntenants:\n  t1: {tier: free}\n")
	a := startServe(t, "--store", "redis://"+srv.Addr, "--config", spec)
	b := startServe(t, "--store", "redis://"+srv.Addr, "--config", spec)
	report := func(s *running) (int, map[string]any, http.Header) {
		req, _ := http.NewRequest("POST", s.url+"/v1/report", strings.NewReader(`{"tenant":"t1","cost":1}`))
		req.Header.Set("Idempotency-Key", "paused-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m, resp.Header
	}
	srv.Freeze()
	code, first, _ := report(a)
	srv.Thaw()
	if code != 200 || first["failover"] != "open" {
		t.Fatalf("a keyed report, Redis paused: %d %v; want 200 by on_error open", code, first)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, m, h := report(b)
		if code == 200 && (h.Get("Idempotent-Replayed") == "true" || m["failover"] == nil) {
			if h.Get("Idempotent-Replayed") == "true" && m["claim_id"] != first["claim_id"] {
				t.Errorf("replayed %v, want the first answer %v", m, first)
			}
			break
		}
		if code != 409 && code != 200 || time.Now().After(deadline) {
			t.Fatalf("its retry on the other server, Redis back: %d %v; want 200 (or 409 a moment)", code, m)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, m := call(t, "POST", a.url+"/v1/check", `{"tenant":"t1","dry_run":true}`)
	if r, _ := m["remaining"].(float64); r != 998 && r != 999 {
		t.Errorf("after the paused report and its retry: %v, want at most one charge (998 or 999 left after the dry run)", m)
	}
}

// TestRedisEvictionWarned: a Redis that may evict keys (a maxmemory and
// an LRU policy, ElastiCache's default) is warned of at start: an evicted
// key resets its limit and forgets its idempotency answers.
func TestRedisEvictionWarned(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru")
	s := startServe(t, "--store", "redis://"+srv.Addr)
	if !strings.Contains(s.stderr.String(), "Redis may evict keys (maxmemory-policy volatile-lru)") {
		t.Errorf("no warning of an evicting Redis:\n%s", s.stderr)
	}
	quiet := startServe(t, "--store", "redis://"+redistest.Start(t).Addr)
	if strings.Contains(quiet.stderr.String(), "may evict") {
		t.Errorf("a warning for a Redis that does not evict:\n%s", quiet.stderr)
	}
}
