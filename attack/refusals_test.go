package attack

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/proctest"
	"github.com/admitdev/admit/redistest"
)

// refusalsConfig: tenants acme (the attacker, with a key) and victim; a
// fixed window (reads), a token bucket (uploads) and a concurrency limit
// (exports), each of acme's own, that a few requests exhaust for the
// hour; reads and uploads mapped from paths for forward-auth and the
// proxy.
var refusalsConfig = `version: 1
server:
  service_tokens: ["` + serviceToken + `"]
http:
  actions:
    - {match: "GET /read", action: read}
    - {match: "POST /upload", action: upload}
tiers:
  free:
    rules:
      - {name: reads, scope: tenant, actions: [read], algorithm: fixed_window, limit: 2, window: 1h}
      - {name: uploads, scope: tenant, actions: [upload], algorithm: token_bucket, rate: 1/h, burst: 2}
      - {name: exports, scope: tenant, actions: [export], algorithm: concurrency, max: 1, lease_ttl: 1h}
tenants:
  acme: {tier: free, api_keys_sha256: ["` + policy.HashKey("acme-key") + `"]}
  victim: {tier: free, api_keys_sha256: ["` + policy.HashKey("victim-key") + `"]}
`

// TestHTTPRefusalsCostRedisNothing: on admit serve and admit proxy over
// one Redis, a request that is malformed, unauthenticated or of another
// tenant costs Redis nothing, and a key refused over and over costs it one
// call per refusal period on each server — the decision that learns the
// refusal (redisstore's local refusals) — not one per request.
func TestHTTPRefusalsCostRedisNothing(t *testing.T) {
	srv := redistest.Start(t)
	store := "redis://" + srv.Addr
	s := serve(t, patientStore(refusalsConfig), false, "--store", store)
	var reached atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached.Add(1) }))
	defer up.Close()
	listen := proctest.FreeAddr(t)
	p := &server{t: t, Proc: proctest.Start(t, admitBin, listen, nil, "proxy", "--listen", listen, "--upstream", up.URL,
		"--config", writeFile(t, "admit.yaml", refusalsConfig), "--data-dir", t.TempDir(), "--store", store)}
	wrongKey := []string{"X-API-Key", "not-a-key"}

	// Bad requests: 20 rounds of each.
	type bad struct {
		srv                *server
		method, path, body string
		headers            []string
		status             int
	}
	bads := []bad{
		{s, "POST", "/v1/check", `{`, acme, 400},
		{s, "POST", "/v1/check", `{"action":"read","cost":"one"}`, acme, 400},
		{s, "POST", "/v1/check", `{"action":"read","cost":3}`, acme, 400}, // over max_cost
		{s, "POST", "/v1/check", `{"action":"read","nonsense":1}`, acme, 400},
		{s, "POST", "/v1/check", `{"action":"read"}`, wrongKey, 401},
		{s, "POST", "/v1/check", `{"tenant":"victim","action":"read"}`, acme, 403},
		{s, "POST", "/v1/acquire", `{"action":"upload","max_wait_ms":-1}`, acme, 400},
		{s, "POST", "/v1/acquire", `{"action":"upload"}`, wrongKey, 401},
		{s, "POST", "/v1/report", `{"action":"read"}`, acme, 400}, // no cost
		{s, "POST", "/v1/report", `{"action":"read","cost":1}`, wrongKey, 401},
		{s, "POST", "/v1/leases", `{"resource":"export","cost":2}`, acme, 400},
		{s, "POST", "/v1/leases", `{"resource":"export"}`, wrongKey, 401},
		{s, "POST", "/v1/leases", `{"tenant":"victim","resource":"export"}`, acme, 403},
		{s, "PUT", "/v1/leases/" + strings.Repeat("0", 24), ``, nil, 404},
		{s, "GET", "/v1/authz/read", ``, wrongKey, 401},
		{p, "GET", "/read", ``, wrongKey, 401},
		{p, "GET", "/read", ``, nil, 401}, // a key is required
	}
	before := requestCommands(t, srv.Addr)
	for range 20 {
		for _, b := range bads {
			if a := b.srv.do(b.method, b.path, b.body, b.headers...); a.status != b.status {
				t.Fatalf("%s %s %s: %d, want %d: %.200s", b.method, b.path, b.body, a.status, b.status, a.raw)
			}
		}
	}
	cost := requestCommands(t, srv.Addr) - before
	report(t, fmt.Sprintf("Redis calls for %d malformed, unauthenticated or foreign requests", 20*len(bads)), cost)
	if cost != 0 {
		t.Errorf("%d bad requests cost Redis %d calls, want 0", 20*len(bads), cost)
	}
	if reached.Load() != 0 {
		t.Errorf("%d bad requests reached the upstream", reached.Load())
	}

	// Refusals: acme's reads exhausted, then refused 200 times on each
	// front end; each server learns the refusal with one call.
	for range 2 {
		if a := s.do("POST", "/v1/check", `{"action":"read"}`, acme...); a.status != 200 {
			t.Fatalf("a read: %d %s", a.status, a.raw)
		}
	}
	const n = 200
	for _, fe := range []struct {
		name               string
		srv                *server
		method, path, body string
		most               int64
	}{
		{"/v1/check", s, "POST", "/v1/check", `{"action":"read"}`, 1},
		{"/v1/authz", s, "GET", "/v1/authz/read", ``, 0}, // the same server: the refusal is known
		{"/v1/acquire (a fixed window)", s, "POST", "/v1/acquire", `{"action":"read","max_wait_ms":0}`, 0},
		{"admit proxy", p, "GET", "/read", ``, 1}, // another server: it learns it once
	} {
		before := requestCommands(t, srv.Addr)
		for i := range n {
			if a := fe.srv.do(fe.method, fe.path, fe.body, acme...); a.status != 429 {
				t.Fatalf("%s, refusal %d: %d %.200s", fe.name, i, a.status, a.raw)
			}
		}
		cost := requestCommands(t, srv.Addr) - before
		report(t, fmt.Sprintf("Redis calls for %d refusals through %s", n, fe.name), cost)
		if cost > fe.most {
			t.Errorf("%d refusals through %s cost Redis %d calls, want at most %d", n, fe.name, cost, fe.most)
		}
	}
	if reached.Load() != 0 {
		t.Errorf("%d refused requests reached the upstream", reached.Load())
	}

	// A bucket's refused booking (/v1/acquire reserves, then reads the
	// levels: 2 calls) is remembered by the server until its wait could
	// be within max_wait; a full concurrency limit, whose capacity comes
	// back with any release, by the store for a quarter of a second at
	// most (once: 2 and 1 calls per refusal).
	for range 2 {
		if a := s.do("POST", "/v1/check", `{"action":"upload"}`, acme...); a.status != 200 {
			t.Fatalf("an upload: %d %s", a.status, a.raw)
		}
	}
	if a := s.do("POST", "/v1/leases", `{"resource":"export"}`, acme...); a.status != 201 {
		t.Fatalf("a lease: %d %s", a.status, a.raw)
	}
	for _, fe := range []struct {
		name, path, body string
		per              time.Duration // a call learns the refusal for this long at least
	}{
		{"/v1/acquire (a token bucket)", "/v1/acquire", `{"action":"upload","max_wait_ms":0}`, time.Hour},
		{"/v1/leases", "/v1/leases", `{"resource":"export"}`, 250 * time.Millisecond},
	} {
		before := requestCommands(t, srv.Addr)
		start := time.Now()
		for i := range n {
			if a := s.do("POST", fe.path, fe.body, acme...); a.status != 429 {
				t.Fatalf("%s, refusal %d: %d %.200s", fe.name, i, a.status, a.raw)
			}
		}
		cost := requestCommands(t, srv.Addr) - before
		report(t, fmt.Sprintf("Redis calls for %d refusals through %s", n, fe.name), cost)
		// The first refusal's calls, then one a period at most.
		if most := 2 + 2*int64(time.Since(start)/fe.per); cost > most {
			t.Errorf("%d refusals through %s in %v cost Redis %d calls, want at most %d", n, fe.name, time.Since(start).Round(time.Millisecond), cost, most)
		}
	}
}
