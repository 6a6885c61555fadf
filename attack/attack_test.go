package attack

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/proctest"
	"github.com/admitdev/admit/redistest"
)

// admitBin is the admit binary TestMain builds.
var admitBin string

func TestMain(m *testing.M) { proctest.Main(m, &admitBin) }

const (
	adminToken   = "attack-admin-token"
	serviceToken = "attack-service-token"
)

// suiteConfig: tenants acme (the attacker) and victim, each with an API
// key, of tier free; a global bucket every tenant shares, a per-IP login
// limit across tenants and a global concurrency limit; unknown tenants get
// tier free (the demo's laxest setting), and the tenant metric label is
// on.
var suiteConfig = `version: 1
server:
  service_tokens: ["` + serviceToken + `"]
  tenant_metrics: true
defaults:
  unknown_tenant: free
global:
  - {name: global-requests, scope: global, algorithm: token_bucket, rate: 1/h, burst: 1000}
  - {name: logins-per-ip, scope: ip, actions: [login], algorithm: fixed_window, limit: 2, window: 1h}
  - {name: global-exports, scope: global, actions: [export], algorithm: concurrency, max: 10, lease_ttl: 30s}
tiers:
  free:
    rules:
      - {name: tenant-requests, scope: tenant, algorithm: token_bucket, rate: 1/h, burst: 200}
      - {name: exports, scope: tenant, actions: [export], algorithm: concurrency, max: 2, lease_ttl: 30s}
    gateway:
      tenant_sessions: 5
tenants:
  acme: {tier: free, api_keys_sha256: ["` + policy.HashKey("acme-key") + `"]}
  victim: {tier: free, api_keys_sha256: ["` + policy.HashKey("victim-key") + `"]}
`

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// server is an admit serve process.
type server struct {
	*proctest.Proc
	t *testing.T
}

// serve starts admit serve with the suite's configuration (or cfg) and
// args, the admin token in its environment unless noToken.
func serve(t *testing.T, cfg string, noToken bool, args ...string) *server {
	t.Helper()
	if cfg == "" {
		cfg = suiteConfig
	}
	httpAddr, grpcAddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
	env := []string{"ADMIT_ADMIN_TOKEN=" + adminToken}
	if noToken {
		env = []string{"ADMIT_ADMIN_TOKEN="}
	}
	args = append([]string{"serve", "--config", writeFile(t, "admit.yaml", cfg), "--data-dir", t.TempDir(), "--http", httpAddr, "--grpc", grpcAddr}, args...)
	p := proctest.Start(t, admitBin, httpAddr, env, args...)
	p.GRPC = grpcAddr
	return &server{Proc: p, t: t}
}

// patientStore returns cfg (the suite's when empty) with a Redis timeout
// of 5 s, for the tests that count the Redis commands a flood costs: at
// the default 50 ms a call timed out on a loaded machine (once, at start,
// under make test with other work running) is decided by on_error and
// reconciled with Redis later, in the middle of the counts. They measure
// which requests reach Redis, not how fast it answers.
func patientStore(cfg string) string {
	if cfg == "" {
		cfg = suiteConfig
	}
	return cfg + "store:\n  redis:\n    timeout: 5s\n"
}

// answer is an HTTP answer, its JSON body decoded when it has one.
type answer struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

// do sends a request with headers (name, value, …) and reads the answer.
func (s *server) do(method, path, body string, headers ...string) answer {
	s.t.Helper()
	req, err := http.NewRequest(method, s.URL+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := proctest.Client.Do(req)
	if err != nil {
		s.t.Fatalf("%s %.80s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	_ = json.Unmarshal(raw, &a.body)
	return a
}

var (
	admin   = []string{"Authorization", "Bearer " + adminToken}
	service = []string{"Authorization", "Bearer " + serviceToken}
	acme    = []string{"X-API-Key", "acme-key"}
)

// report logs a figure of the suite, as docs/security.md quotes it.
func report(t *testing.T, what string, v any) {
	t.Logf("report\t%s\t%s\t%v", t.Name(), what, v)
}

// commandCalls returns how many times the Redis at addr ran each of
// names since it started (INFO commandstats).
func commandCalls(t *testing.T, addr string, names ...string) int64 {
	t.Helper()
	calls, err := redistest.CommandCalls(addr)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, name := range names {
		n += calls[name]
	}
	return n
}

// TestLeaseIDAmplification: a lease id is a capability anyone may present
// without a credential, and renewing or releasing costs Redis two commands
// per group the id names. A made-up id (100,000 ".g" tags once made
// 200,001 Redis commands from one request) costs Redis nothing; a real
// one costs two.
func TestLeaseIDAmplification(t *testing.T) {
	srv := redistest.Start(t)
	s := serve(t, patientStore(""), false, "--store", "redis://"+srv.Addr)
	raw := strings.Repeat("0", 24)
	lease := []string{"hkeys", "fcall"}
	before := commandCalls(t, srv.Addr, lease...)
	for _, tc := range []struct {
		what, id string
		status   int
	}{
		{"100,000 tags (a 200 KB path)", raw + strings.Repeat(".g", 100_000), http.StatusRequestHeaderFieldsTooLarge},
		{"20,000 tags (40 KB)", raw + strings.Repeat(".g", 20_000), http.StatusNotFound},
		{"two tags on a standalone server", raw + ".0123456789abcdef.g", http.StatusNotFound},
		{"a repeated tag", raw + ".g.g", http.StatusNotFound},
		{"a tag of another form", raw + ".ZZZZZZZZZZZZZZZZ", http.StatusNotFound},
	} {
		for _, method := range []string{"DELETE", "PUT"} {
			if a := s.do(method, "/v1/leases/"+tc.id, ""); a.status != tc.status {
				t.Errorf("%s %s: %d, want %d: %.200s", method, tc.what, a.status, tc.status, a.raw)
			}
		}
	}
	forged := commandCalls(t, srv.Addr, lease...) - before
	report(t, "Redis commands for 10 requests with made-up lease ids", forged)
	if forged != 0 {
		t.Errorf("made-up lease ids cost Redis %d commands, want 0", forged)
	}
	// A real lease: taken by acme, released at a cost of 2 commands.
	a := s.do("POST", "/v1/leases", `{"resource":"export"}`, acme...)
	if a.status != http.StatusCreated {
		t.Fatalf("a lease: %d %s", a.status, a.raw)
	}
	before = commandCalls(t, srv.Addr, lease...)
	if a := s.do("DELETE", "/v1/leases/"+a.body["lease_id"].(string), "", acme...); a.status != http.StatusNoContent {
		t.Fatalf("release: %d %s", a.status, a.raw)
	}
	real := commandCalls(t, srv.Addr, lease...) - before
	report(t, "Redis commands to release a real lease", real)
	if real != 2 {
		t.Errorf("releasing a lease cost %d commands, want 2 (HKEYS, FCALL)", real)
	}
}

// TestLeaseIDAmplificationCluster: on Redis Cluster a lease of admit
// serve lives in at most two hash-tag groups (its tenant's and the global
// one), and its id names them, but an id may name up to 32: a made-up one
// of 32 tags once cost Redis 64 commands (HKEYS and FCALL a tag), without
// a credential. Serve now refuses, at no cost to Redis, every id it could
// not have issued: more than one tenant's tag, or more than two tags.
func TestLeaseIDAmplificationCluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr
	}
	s := serve(t, patientStore(""), false, "--store", "redis+cluster://"+strings.Join(addrs, ","))
	calls := func() (n int64) {
		for _, a := range addrs {
			n += commandCalls(t, a, "hkeys", "fcall")
		}
		return n
	}
	raw := strings.Repeat("0", 24)
	tag := func(i int) string { return fmt.Sprintf(".%016x", 0x1000+i) }
	var tags32 strings.Builder
	for i := range 31 {
		tags32.WriteString(tag(i))
	}
	tags32.WriteString(".g")
	before := calls()
	for _, tc := range []struct{ what, id string }{
		{"32 tags", raw + tags32.String()},
		{"two tenants' tags", raw + tag(1) + tag(2)},
		{"two tenants' tags and the global one", raw + tag(1) + tag(2) + ".g"},
	} {
		for _, method := range []string{"DELETE", "PUT"} {
			if a := s.do(method, "/v1/leases/"+tc.id, ""); a.status != http.StatusNotFound {
				t.Errorf("%s %s: %d, want 404: %.200s", method, tc.what, a.status, a.raw)
			}
		}
	}
	forged := calls() - before
	report(t, "Redis commands for 6 requests with made-up lease ids of 2 to 32 tags (Cluster)", forged)
	if forged != 0 {
		t.Errorf("made-up lease ids cost Redis %d commands, want 0", forged)
	}
	// A real lease, of a tenant rule and a global one: two groups
	// (after its taker's fingerprint), released by its taker at a cost of
	// 4 commands.
	a := s.do("POST", "/v1/leases", `{"resource":"export"}`, acme...)
	id, _ := a.body["lease_id"].(string)
	if a.status != http.StatusCreated || strings.Count(id, ".") != 3 {
		t.Fatalf("a lease in two groups: %d %s", a.status, a.raw)
	}
	before = calls()
	if a := s.do("DELETE", "/v1/leases/"+id, "", acme...); a.status != http.StatusNoContent {
		t.Fatalf("release: %d %s", a.status, a.raw)
	}
	real := calls() - before
	report(t, "Redis commands to release a real lease of two groups (Cluster)", real)
	if real != 4 {
		t.Errorf("releasing a lease of two groups cost %d commands, want 4", real)
	}
}

// TestSharedBucketsHoldAgainstATenant: with its own API key, tenant acme
// names the victim's address for the per-IP login limit every tenant
// shares, debits the global bucket a million at a time and asks for a
// lease of a year. None of it reaches the victim: the platform's backend
// (a service token) finds the victim's logins and the global bucket as
// they were.
func TestSharedBucketsHoldAgainstATenant(t *testing.T) {
	s := serve(t, "", false)
	for range 5 {
		if a := s.do("POST", "/v1/check", `{"action":"login","ip":"203.0.113.9"}`, acme...); a.status != 200 {
			t.Fatalf("acme's login naming the victim's ip: %d %s", a.status, a.raw)
		}
	}
	if a := s.do("POST", "/v1/report", `{"cost":1000000}`, acme...); a.status != 400 || !strings.Contains(a.raw, "max_cost") {
		t.Errorf("a debit of a million: %d %s, want 400 naming max_cost", a.status, a.raw)
	}
	for range 10 {
		s.do("POST", "/v1/report", `{"cost":200}`, acme...) // the most its own bucket takes, ten times
	}
	state := s.do("GET", "/v1/admin/state?tenant=victim", "", admin...)
	level := -1.0
	for _, b := range state.body["buckets"].([]any) {
		if m := b.(map[string]any); m["name"] == "global-requests" {
			level = m["remaining"].(float64)
		}
	}
	report(t, "the global bucket after acme's attack (of 1000)", level)
	if level < 990 {
		t.Errorf("the global bucket holds %v of 1000 after acme's debits, want it untouched but for acme's 5 checks", level)
	}
	admitted := 0
	for range 3 {
		if a := s.do("POST", "/v1/check", `{"tenant":"victim","action":"login","ip":"203.0.113.9"}`, service...); a.status == 200 {
			admitted++
		}
	}
	report(t, "victim's logins from the named address admitted (limit 2)", admitted)
	if admitted != 2 {
		t.Errorf("the victim's logins through the backend: %d admitted, want the limit, 2", admitted)
	}
	a := s.do("POST", "/v1/leases", `{"resource":"export","ttl_ms":31536000000}`, acme...)
	exp, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(a.body["expires_at"]))
	report(t, "a lease asked for a year lasts", time.Until(exp).Round(time.Second))
	if a.status != 201 || time.Until(exp) > 31*time.Second {
		t.Errorf("a lease of a year: %d, expires in %v, want the rule's 30s", a.status, time.Until(exp))
	}
	held := 1
	for range 10 {
		if a := s.do("POST", "/v1/leases", `{"resource":"export"}`, acme...); a.status == 201 {
			held++
		}
	}
	report(t, "global export slots acme holds (of 10)", held)
	if held != 2 {
		t.Errorf("acme holds %d of the 10 global export slots, want its own max, 2", held)
	}
}

// TestUsageOfSharedBuckets: GET /v1/usage read the buckets every tenant
// shares for whoever asked: without a credential, naming any tenant a
// default tier takes and any address, it told how many logins an
// address had made (the per-IP login limit of all tenants) and how full
// the global bucket was. Those are the platform's to read, with a service
// or admin token; a tenant's key reads its own tenant's buckets alone.
func TestUsageOfSharedBuckets(t *testing.T) {
	s := serve(t, "", false)
	if a := s.do("POST", "/v1/check", `{"tenant":"victim","action":"login","ip":"203.0.113.9"}`, service...); a.status != 200 {
		t.Fatalf("the victim's login: %d %s", a.status, a.raw)
	}
	rules := func(a answer) []string {
		var names []string
		list, _ := a.body["rules"].([]any)
		for _, r := range list {
			names = append(names, r.(map[string]any)["name"].(string))
		}
		return names
	}
	const query = "/v1/usage?action=login&ip=203.0.113.9&tenant="
	for _, tc := range []struct {
		who     string
		tenant  string
		headers []string
		status  int
		rules   string
	}{
		{"anonymous, naming a tenant of the default tier", "nobody", nil, 200, "tenant-requests"},
		{"acme's key", "acme", acme, 200, "tenant-requests"},
		{"acme's key naming the victim", "victim", acme, 403, ""},
		{"anonymous, naming the victim", "victim", nil, 401, ""},
		{"a service token", "victim", service, 200, "global-requests logins-per-ip tenant-requests"},
		{"the admin token", "victim", admin, 200, "global-requests logins-per-ip tenant-requests"},
	} {
		a := s.do("GET", query+tc.tenant, "", tc.headers...)
		got := strings.Join(rules(a), " ")
		if a.status != tc.status || got != tc.rules {
			t.Errorf("%s: %d %v, want %d %q: %.200s", tc.who, a.status, got, tc.status, tc.rules, a.raw)
		}
		if tc.who == "anonymous, naming a tenant of the default tier" {
			report(t, "rules an anonymous caller reads (tenant's only)", got)
		}
	}
}

// TestDuplicateJSONKeys: a body that names a field twice was decoded, the
// last value winning, though a proxy, a WAF or the platform's own code in
// front may read the first: {"tenant":"victim","cost":1,"cost":1000}
// passes a check of cost 1. Every body Admit decodes refuses a key that an
// object holds twice (after unescaping; for the API's fields, in any case,
// as encoding/json matches them), 400 naming the key: the decision API,
// the admin API, and the LLM bodies admit proxy forwards.
func TestDuplicateJSONKeys(t *testing.T) {
	s := serve(t, "", false)
	for _, tc := range []struct{ method, path, body, key string }{
		{"POST", "/v1/check", `{"tenant":"victim","cost":1,"cost":1000}`, "cost"},
		{"POST", "/v1/check", `{"tenant":"nobody","Tenant":"victim"}`, "Tenant"},
		{"POST", "/v1/check", `{"\u0074enant":"nobody","tenant":"victim"}`, "tenant"},
		{"POST", "/v1/check", `{"tenant":"nobody","attributes":{"plan":"free","plan":"enterprise"}}`, "plan"},
		{"POST", "/v1/report", `{"tenant":"nobody","cost":1,"cost":2}`, "cost"},
		{"POST", "/v1/leases", `{"resource":"export","resource":"login"}`, "resource"},
		{"PUT", "/v1/admin/tenants/newco", `{"tier":"free","tier":"gold"}`, "tier"},
	} {
		a := s.do(tc.method, tc.path, tc.body, admin...)
		if a.status != 400 || a.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(a.raw, `duplicate key \"`+tc.key+`\"`) {
			t.Errorf("%s %s %s: %d %s, want 400 naming %q", tc.method, tc.path, tc.body, a.status, a.raw, tc.key)
		}
	}
	if a := s.do("POST", "/v1/check", `{"tenant":"nobody","attributes":{"a":"1","b":"2"},"user":"u"}`); a.status != 200 {
		t.Errorf("a body without duplicates: %d %s", a.status, a.raw)
	}

	p, up, _ := llmProxy(t)
	code, body := post(t, p.URL+"/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"model":"o1"}`, acmeBearer...)
	report(t, "an LLM call naming its model twice", code)
	if code != 400 || !strings.Contains(body, `duplicate key \"model\"`) || up.Calls() != 0 {
		t.Errorf("an LLM call naming its model twice: %d %s (%d reached the provider)", code, body, up.Calls())
	}
}

// TestSessionsPerTenant: one tenant creating sessions as fast as it can
// gets its tier's tenant_sessions, and another tenant still gets its own.
func TestSessionsPerTenant(t *testing.T) {
	s := serve(t, "", false)
	created := 0
	for range 50 {
		if a := s.do("PUT", "/v1/sessions", `{"tenant":"acme"}`, acme...); a.status == 201 {
			created++
		} else if a.status != 429 || a.header.Get("Retry-After") == "" {
			t.Fatalf("a session past the cap: %d %s", a.status, a.raw)
		}
	}
	report(t, "sessions acme created of 50 asked (tenant_sessions 5)", created)
	if created != 5 {
		t.Errorf("acme created %d sessions, want 5", created)
	}
	if a := s.do("PUT", "/v1/sessions", `{"tenant":"victim"}`, "X-API-Key", "victim-key"); a.status != 201 {
		t.Errorf("the victim's session: %d %s", a.status, a.raw)
	}
}

// TestAdminAPIWithoutToken: without a token the admin API is closed, even
// to loopback; opened to loopback by --admin-loopback, it still refuses
// what a proxy or sidecar on the host forwards and what a web page makes a
// browser send — and none of those requests changed anything.
func TestAdminAPIWithoutToken(t *testing.T) {
	closed := serve(t, "", true)
	if a := closed.do("POST", "/v1/admin/tenants/acme/api-keys", "{}"); a.status != 401 {
		t.Errorf("no token, no flag: %d, want 401", a.status)
	}
	s := serve(t, "", true, "--admin-loopback")
	for _, tc := range []struct {
		what    string
		headers []string
		status  int
	}{
		{"a TLS terminator's forwarded request", []string{"Content-Type", "application/json", "X-Forwarded-For", "198.51.100.7"}, 403},
		{"an Envoy sidecar's request", []string{"Content-Type", "application/json", "X-Envoy-Expected-Rq-Timeout-Ms", "15000"}, 403},
		{"a no-cors text/plain POST from a page", []string{"Content-Type", "text/plain;charset=UTF-8", "Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site"}, 403},
		{"a text/plain POST", []string{"Content-Type", "text/plain"}, 415},
		{"DNS rebinding", []string{"Content-Type", "application/json", "Host", "evil.example"}, 403},
	} {
		req, _ := http.NewRequest("POST", s.URL+"/v1/admin/tenants/acme/api-keys", strings.NewReader("{}"))
		for i := 0; i+1 < len(tc.headers); i += 2 {
			if tc.headers[i] == "Host" {
				req.Host = tc.headers[i+1]
				continue
			}
			req.Header.Set(tc.headers[i], tc.headers[i+1])
		}
		resp, err := proctest.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d, want %d", tc.what, resp.StatusCode, tc.status)
		}
	}
	a := s.do("GET", "/v1/admin/tenants/acme", "")
	report(t, "acme's API keys after the refused requests (of 1)", a.body["api_keys"])
	if a.status != 200 || a.body["api_keys"] != float64(1) {
		t.Errorf("acme after the attempts: %d %s, want its one key", a.status, a.raw)
	}
}

// TestSimulateBounded: the simulator draws a picture of each rule, and a
// pattern may ask for millions of requests: both are refused before any
// work, so that a flood of such requests leaves the server's memory as it
// was; admit simulate refuses what it cannot run too.
func TestSimulateBounded(t *testing.T) {
	s := serve(t, "", false)
	rules := `"` + strings.Repeat(`fixed_window limit=1 window=1s","`, 8) + `fixed_window limit=1 window=1s"`
	before := s.Metric(t, "go_memstats_alloc_bytes_total")
	for range 20 {
		if a := s.do("POST", "/v1/admin/simulate", `{"rules":[`+rules+`]}`, admin...); a.status != 400 {
			t.Fatalf("9 rules: %d %s", a.status, a.raw)
		}
		if a := s.do("POST", "/v1/admin/simulate", `{"rules":["fixed_window limit=1 window=1s"],"pattern":"constant rate=2700/s duration=1h"}`, admin...); a.status != 400 {
			t.Fatalf("9.7 M requests: %d %s", a.status, a.raw)
		}
		// Once estimated at 0.015 requests (1/h while on, on half the
		// time), this pattern sends one at the start of each of its 15 M
		// on periods of 1 ns: 4 GB of events, generated before the bound
		// was checked.
		if a := s.do("POST", "/v1/admin/simulate", `{"rules":["fixed_window limit=1 window=1s"],"pattern":"onoff rate=1/h on=1ns off=1ns duration=30ms"}`, admin...); a.status != 400 || !strings.Contains(a.raw, "200000") {
			t.Fatalf("15 M requests of 1 ns on periods: %d %s, want 400 naming the bound", a.status, a.raw)
		}
	}
	// Bytes allocated, not held, so that no collection hides the work: a
	// simulation of 9.7 M requests would allocate gigabytes.
	alloc := s.Metric(t, "go_memstats_alloc_bytes_total") - before
	report(t, "bytes allocated for 60 refused simulations", alloc)
	if alloc > 64<<20 {
		t.Errorf("%.0f bytes allocated for refused simulations", alloc)
	}
	// admit simulate refuses them too, before it generates them: the
	// pattern above, and one that --duration stretches past the bound
	// after the pattern was checked.
	for _, args := range [][]string{
		{"--pattern", "onoff rate=1/h on=1ns off=1ns duration=30ms"},
		{"--pattern", "constant rate=1000000/s", "--duration", "1000h"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		out, code := runAdmit(ctx, append([]string{"simulate", "--rule", "fixed_window limit=1 window=1s"}, args...)...)
		cancel()
		if code != 2 || !strings.Contains(out, "at most 2000000") {
			t.Errorf("admit simulate %q: exit %d: %.300s, want 2 naming the bound", args, code, out)
		}
	}

	// The rest of what a run holds: a picture of 100,000 × 100,000 pixels
	// (once a 40 GB allocation, and the process killed), an animation of
	// a million frames (out of memory), nine rules, and a log whose
	// every request is another user's, through eight rules keyed by user
	// (a state per request and rule).
	dir := t.TempDir()
	rule := []string{"--rule", "fixed_window limit=1 window=1s"}
	var userRules []string
	for i := range 8 {
		userRules = append(userRules, "--rule", fmt.Sprintf("sliding_window limit=10 window=1m scope=user name=u%d", i))
	}
	var logb strings.Builder
	logb.WriteString("time,tenant,user\n")
	for i := range 125_001 {
		fmt.Fprintf(&logb, "%d.%06d,acme,user%d\n", 1_700_000_000+i/1000, i%1000*1000, i)
	}
	userLog := writeFile(t, "users.csv", logb.String())
	for _, tc := range []struct {
		args  []string
		bound string
	}{
		{slices.Concat(rule, []string{"--width", "100000", "--height", "100000", "--out", filepath.Join(dir, "x.png")}), "from 100 to 4096"},
		{slices.Concat(rule, []string{"--gif", filepath.Join(dir, "x.gif"), "--frames", "1000000"}), "at most 200 frames"},
		{slices.Concat(rule, []string{"--gif", filepath.Join(dir, "x.gif"), "--frames", "200", "--width", "4096", "--height", "4096"}), "at most 134217728"},
		{slices.Concat(userRules, rule), "9 rules: at most 8"},
		{slices.Concat(userRules, []string{"--log", userLog}), "more than 1000000 keys"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		out, code := runAdmit(ctx, append([]string{"simulate"}, tc.args...)...)
		cancel()
		if code != 2 || !strings.Contains(out, tc.bound) {
			t.Errorf("admit simulate %q: exit %d: %.300s, want 2 naming %q", tc.args, code, out, tc.bound)
		}
	}
	// At the bounds: 2,000,000 requests through eight rules, drawn, in
	// less than 1 GB (once 3.5 GB for 9.9 million).
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := execCommand(ctx, append([]string{"simulate", "--user", "u", "--pattern", "constant rate=100000/s duration=20s", "--out", filepath.Join(dir, "big.png")}, userRules...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("2,000,000 requests through 8 rules: %v: %.300s", err, out)
	}
	rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10
	report(t, "peak memory of admit simulate at its bounds (2,000,000 requests, 8 rules), MB", rss>>20)
	if rss > 1<<30 {
		t.Errorf("admit simulate at its bounds took %d MB, want at most 1 GB", rss>>20)
	}
}

// TestTenantMetricsBounded: with server.tenant_metrics, a thousand tenant
// names that no catalog holds (a default tier takes them) create no
// series of their own.
func TestTenantMetricsBounded(t *testing.T) {
	metrics := proctest.FreeAddr(t)
	s := serve(t, "", false, "--metrics", metrics)
	for i := range 1000 {
		s.do("POST", "/v1/check", fmt.Sprintf(`{"tenant":"invented-%d"}`, i))
	}
	series := strings.Count(scrape(t, "http://"+metrics+"/metrics"), "\nadmit_tenant_decisions_total{")
	report(t, "tenant series after 1,000 invented tenants", series)
	if series > 2 {
		t.Errorf("%d tenant series after 1,000 invented tenants, want at most 2 (_default_tier × allowed, refused)", series)
	}
}

// TestMetricsOffTheAPIPort: the API's address is the one tenants and
// anonymous clients reach, and its /metrics showed every tenant's id and
// volume (admit_tenant_decisions_total{tenant="victim"}). The tenant
// series are served on the metrics address alone (--metrics); the API's
// /metrics keeps the series that name no tenant, and with a metrics
// address set, serves none.
func TestMetricsOffTheAPIPort(t *testing.T) {
	s := serve(t, "", false)
	for _, h := range [][]string{acme, {"X-API-Key", "victim-key"}} {
		if a := s.do("POST", "/v1/check", `{}`, h...); a.status != 200 {
			t.Fatalf("a check: %d %s", a.status, a.raw)
		}
	}
	public := s.Metrics(t)
	if strings.Contains(public, "admit_tenant_decisions_total") || strings.Contains(public, "victim") || !strings.Contains(public, "\nadmit_requests_total{") {
		t.Errorf("the API's /metrics names tenants, or lacks the request counts:\n%.2000s", public)
	}
	if !strings.Contains(s.Output.String(), "tenant series are served only on the metrics address") {
		t.Error("tenant_metrics without --metrics was not warned of")
	}

	metrics := proctest.FreeAddr(t)
	s = serve(t, "", false, "--metrics", metrics)
	if a := s.do("POST", "/v1/check", `{}`, "X-API-Key", "victim-key"); a.status != 200 {
		t.Fatalf("a check: %d %s", a.status, a.raw)
	}
	if a := s.do("GET", "/metrics", ""); a.status != 404 {
		t.Errorf("the API's /metrics with a metrics address: %d %.200s", a.status, a.raw)
	}
	all := scrape(t, "http://"+metrics+"/metrics")
	report(t, "the metrics address's victim series", strings.Count(all, `tenant="victim"`))
	if !strings.Contains(all, `admit_tenant_decisions_total{result="allowed",tenant="victim"} 1`) || !strings.Contains(all, "\nadmit_requests_total{") {
		t.Errorf("the metrics address lacks the tenant or request series:\n%.2000s", all)
	}
}

// scrape reads a /metrics page, a newline first (as proctest.Proc.Metrics).
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := proctest.Client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return "\n" + string(b)
}

// TestSecretsNeverPrinted: a Redis password is in no log line and no
// error, whatever the URL's form, even one that does not parse (a "/" or
// "?" not percent-encoded in a password once ended the part hidden, and
// the rest was printed at start-up); neither are the admin and service
// tokens.
func TestSecretsNeverPrinted(t *testing.T) {
	for url, mentions := range map[string]string{
		"redis://:pw/s3cret@127.0.0.1:1":                     "percent-encode",
		"redis://user:pw?s3cret@127.0.0.1:1/0":               "percent-encode",
		"redis+sentinel://u:pw/s3cret?x@m@127.0.0.1:1":       "percent-encode",
		"redis+cluster://:pw/s3cret@127.0.0.1:1,127.0.0.1:2": "percent-encode",
		"rediss://u:pw#s3cret/x?y@h:1?tls_ca_file=/none":     "percent-encode",
		"redis://:pw%2Fs3cret@127.0.0.1:1":                   "127.0.0.1:1", // percent-encoded: serves
		"redis://:pw%zzs3cret@127.0.0.1:1":                   "escape",
		"redis://127.0.0.1:1?password=s3cret":                "127.0.0.1:1?***",
		"redis://pw-s3cret@127.0.0.1:1":                      "127.0.0.1:1", // serves, deciding by on_error
		"redis://user:pw-s3cret@127.0.0.1:1/0":               "127.0.0.1:1",
		"redis+sentinel://:pw-s3cret@m@127.0.0.1:1":          "127.0.0.1:1",
		"memcached://user:pw-s3cret@h":                       "memcached://***@h", // refused
		"redis://pw-s3cret@h:99999":                          "redis://***@h:99999",
		"rediss://u:pw-s3cret@h:1?tls_ca_file=/none":         "/none",
		"redis+sentinel://mymaster:pw-s3cret@127.0.0.1:1":    "the master's name holds", // once shown as the master's name
		"redis+sentinel://:pw@mymaster:s3cret@127.0.0.1:1":   "redis+sentinel://***@***@127.0.0.1:1",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, _ := runAdmit(ctx, "serve", "--config", writeFile(t, "admit.yaml", suiteConfig), "--data-dir", t.TempDir(),
			"--http", proctest.FreeAddr(t), "--grpc", proctest.FreeAddr(t), "--store", url)
		cancel()
		if !strings.Contains(out, mentions) || strings.Contains(out, "s3cret") || strings.Contains(out, adminToken) || strings.Contains(out, serviceToken) {
			t.Errorf("--store %s: want the output to name %q and no secret:\n%s", url, mentions, out)
		}
	}
	// admit ratelimit's REDIS_URL, envoyproxy/ratelimit's list of hosts
	// (after the master's name for Sentinel): a password written into it
	// once showed as the master's name.
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "rl", "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeTo(t, filepath.Join(root, "rl", "config", "rl.yaml"), "domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100}\n")
	for _, env := range [][]string{
		{"REDIS_TYPE=SENTINEL", "REDIS_URL=mymaster:pw-s3cret,127.0.0.1:1"},
		{"REDIS_TYPE=SENTINEL", "REDIS_URL=mymaster:pw-s3cret"},
		{"REDIS_TYPE=SINGLE", "REDIS_URL=user:pw-s3cret@127.0.0.1:1,127.0.0.1:2"},
		{"REDIS_TYPE=SENTINEL", "REDIS_URL=mymaster,127.0.0.1:1", "REDIS_AUTH=user:pw-s3cret"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cmd := execCommand(ctx, "ratelimit")
		_, port, _ := net.SplitHostPort(proctest.FreeAddr(t))
		_, grpcPort, _ := net.SplitHostPort(proctest.FreeAddr(t))
		cmd.Env = append(os.Environ(), append(env, "RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=rl", "HOST=127.0.0.1", "PORT="+port,
			"GRPC_HOST=127.0.0.1", "GRPC_PORT="+grpcPort, "ADMIT_DATA_DIR="+t.TempDir())...)
		out := &proctest.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		deadline := time.After(5 * time.Second)
	wait:
		for !strings.Contains(out.String(), "admit serving") {
			select {
			case <-done:
				break wait
			case <-deadline:
				break wait
			case <-time.After(20 * time.Millisecond):
			}
		}
		cancel()
		<-done
		if strings.Contains(out.String(), "s3cret") || out.String() == "" {
			t.Errorf("admit ratelimit with %v: want output and no secret:\n%s", env, out)
		}
	}
}

// TestDurationsDoNotWrap: a window or period too long for int64
// nanoseconds is refused with its line, never wrapped around into
// minutes.
func TestDurationsDoNotWrap(t *testing.T) {
	cfg := writeFile(t, "admit.yaml", "version: 1\ntiers:\n  free:\n    rules:\n      - {name: m, scope: tenant, algorithm: fixed_window, limit: 10, window: 213504d}\n")
	out, code := runAdmit(context.Background(), "config", "validate", cfg)
	if code != 1 || !strings.Contains(out, ":5:") || !strings.Contains(out, "longer than") {
		t.Errorf("a window of 213504d: exit %d: %s", code, out)
	}
}

// runAdmit runs the admit binary until it exits, or until it logs that it
// is serving (then it is stopped) or ctx ends, and returns its output and
// exit code.
func runAdmit(ctx context.Context, args ...string) (string, int) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := execCommand(ctx, args...)
	out := &proctest.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return err.Error(), -1
	}
	done := make(chan struct{})
	go func() {
		for !strings.Contains(out.String(), "admit serving") {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		cancel()
	}()
	err := cmd.Wait()
	close(done)
	code := 0
	if err != nil {
		code = cmd.ProcessState.ExitCode()
	}
	return out.String(), code
}
