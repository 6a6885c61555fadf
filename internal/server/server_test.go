package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
)

func n(v int64) *int64 { return &v }

func tb(name, scope string, actions []string, rate string, burst int64) policy.RuleSpec {
	return policy.RuleSpec{Name: name, Scope: scope, Actions: actions, Algorithm: "token_bucket", Rate: rate, Burst: n(burst)}
}

func testSpec() *policy.Spec {
	yes := true
	return &policy.Spec{
		Global: []policy.RuleSpec{tb("global", "global", nil, "1000/s", 100)},
		Tiers: map[string]policy.TierSpec{
			"small": {Rules: []policy.RuleSpec{
				tb("user-req", "user", nil, "1/min", 2),
				tb("docs", "tenant", []string{"doc"}, "1/min", 1),
				tb("fast", "tenant", []string{"fast"}, "20/s", 1),
				{Name: "exports", Scope: "tenant", Actions: []string{"export"}, Algorithm: "concurrency", Max: n(1), LeaseTTL: "1m"},
				{Name: "shadowed", Scope: "tenant", Actions: []string{"shadow"}, Algorithm: "fixed_window", Limit: n(1), Window: "1h", Shadow: &yes},
				{Name: "logins", Scope: "ip", Actions: []string{"login"}, Algorithm: "sliding_log", Limit: n(1), Window: "1h"},
			}},
			"big": {Rules: []policy.RuleSpec{
				tb("user-req", "user", nil, "1/min", 5),
				tb("docs", "tenant", []string{"doc"}, "1/min", 3),
			}},
		},
		Tenants: map[string]policy.TenantSpec{
			"t1":    {Tier: "small"},
			"t2":    {Tier: "big"},
			"keyed": {Tier: "small", APIKeysSHA256: []string{policy.HashKey("secret-key")}},
		},
	}
}

type harness struct {
	t       testing.TB
	url     string
	srv     *Server
	catalog *policy.Catalog
	store   *memstore.Store
	log     *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func start(t testing.TB, spec *policy.Spec, token string, opts ...func(*Options)) *harness {
	t.Helper()
	store := memstore.New(nil)
	cat, err := policy.NewCatalog(context.Background(), spec, &policy.FileStore{Path: t.TempDir() + "/catalog.json"})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, store: store, catalog: cat, log: &syncBuffer{}}
	o := Options{Store: store, Catalog: cat, AdminToken: token, DecisionLog: h.log, MaxWait: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Stats:  func() StoreStats { st := store.Stats(); return StoreStats{Keys: st.Keys} }}
	for _, f := range opts {
		f(&o)
	}
	if h.srv, err = New(o); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h.srv)
	h.url = ts.URL
	t.Cleanup(func() { ts.Close(); h.srv.Close(); store.Close() })
	return h
}

type answer struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

// send makes a request with headers hdr (name, value, ...) and returns
// the response with its body read.
func (h *harness) send(method, path, body string, hdr ...string) (*http.Response, []byte) {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp, raw
}

func (h *harness) do(method, path, body string, hdr ...string) answer {
	h.t.Helper()
	resp, raw := h.send(method, path, body, hdr...)
	a := answer{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &a.body); err != nil {
			h.t.Fatalf("%s %s: answer is not a JSON object: %q", method, path, raw)
		}
	}
	if a.status >= 400 && a.status != 429 {
		if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
			h.t.Errorf("%s %s: status %d with Content-Type %q, want application/problem+json", method, path, a.status, ct)
		}
		if a.body["detail"] == "" || a.body["status"] != float64(a.status) {
			h.t.Errorf("%s %s: problem without detail or status: %s", method, path, raw)
		}
	}
	return a
}

func (h *harness) want(a answer, status int, what string) {
	h.t.Helper()
	if a.status != status {
		h.t.Fatalf("%s: status %d, want %d: %s", what, a.status, status, a.raw)
	}
}

func TestCheckAdmitsThenRefuses(t *testing.T) {
	h := start(t, testSpec(), "")
	body := `{"tenant":"t1","user":"u1","action":"read"}`
	for i, rem := range []float64{1, 0} {
		a := h.do("POST", "/v1/check", body)
		h.want(a, 200, "check")
		if a.body["allowed"] != true || a.body["remaining"] != rem || a.body["limit"] != float64(2) {
			t.Errorf("check %d: %s", i, a.raw)
		}
	}
	a := h.do("POST", "/v1/check", body)
	h.want(a, 429, "third check")
	if retry := a.body["retry_after_ms"].(float64); a.body["denied_by"] != "user-req" || a.body["allowed"] != false || retry < 59000 || retry > 60000 {
		t.Errorf("refusal: %s", a.raw)
	}
	if got := a.header.Get("Retry-After"); got != "60" {
		t.Errorf("Retry-After = %q, want 60", got)
	}
	if got, want := a.header.Get("RateLimit-Policy"), `"global";q=100;w=1, "user-req";q=2;w=120`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q", got, want)
	}
	if !regexp.MustCompile(`^"global";r=\d+;t=\d+, "user-req";r=0;t=120$`).MatchString(a.header.Get("RateLimit")) {
		t.Errorf("RateLimit = %q", a.header.Get("RateLimit"))
	}
	rules := a.body["rules"].([]any)
	if len(rules) != 2 || rules[1].(map[string]any)["scope"] != "user" || rules[0].(map[string]any)["allowed"] != true {
		t.Errorf("rules: %v", rules)
	}
	// Another user of the same tenant has a bucket of its own.
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1","user":"u2"}`), 200, "other user")
}

// TestReport: POST /v1/report charges a cost known after the work as a
// debit: never refused, applied past the limit, so that the next checks
// are refused until the debt is repaid; rules that take no debits are not
// charged.
func TestReport(t *testing.T) {
	h := start(t, testSpec(), "")
	// Tier big: user-req burst 5, docs burst 3 (1/min each), global 100.
	// The report is charged, and answered 429 as information: it left
	// rules over their limits, which refuse until the next 4 minutes.
	a := h.do("POST", "/v1/report", `{"tenant":"t2","user":"u1","action":"doc","cost":7}`)
	h.want(a, 429, "report")
	if a.body["allowed"] != true || a.body["remaining"] != float64(0) || a.header.Get("Retry-After") != "240" {
		t.Errorf("report: %s Retry-After %q", a.raw, a.header.Get("Retry-After"))
	}
	fits := map[string]any{}
	for _, r := range a.body["rules"].([]any) {
		m := r.(map[string]any)
		fits[m["name"].(string)] = m["allowed"]
	}
	if fits["global"] != true || fits["user-req"] != false || fits["docs"] != false {
		t.Errorf("what each debit fitted: %v", fits)
	}
	// docs owes 4 of 3 (capped at one burst of debt: 3): a request of 1
	// waits for 4 tokens, 4 minutes.
	a = h.do("POST", "/v1/check", `{"tenant":"t2","user":"u2","action":"doc"}`)
	h.want(a, 429, "check after the report")
	if a.body["denied_by"] != "docs" || a.header.Get("Retry-After") != "240" {
		t.Errorf("refusal after a report: %s Retry-After %q", a.raw, a.header.Get("Retry-After"))
	}
	// "debit": true on a check is the same.
	h.want(h.do("POST", "/v1/check", `{"tenant":"t2","user":"u3","debit":true}`), 200, "debit on check")

	// A sliding log takes no debits: a report of a login is charged to
	// the global bucket only, and the login still passes.
	a = h.do("POST", "/v1/report", `{"tenant":"t1","ip":"192.0.2.1","action":"login","cost":5}`)
	h.want(a, 200, "report of a login") // within the global bucket
	if rules := a.body["rules"].([]any); len(rules) != 1 || rules[0].(map[string]any)["name"] != "global" {
		t.Errorf("a report of a login charged %v", rules)
	}
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1","ip":"192.0.2.1","action":"login"}`), 200, "login after its report")

	h.want(h.do("POST", "/v1/report", `{"tenant":"t2","cost":1000000001}`), 400, "report past MaxCost")
	h.want(h.do("POST", "/v1/report", `{"tenant":"t2"}`), 400, "report without a cost")
}

func TestCheckBadInput(t *testing.T) {
	h := start(t, testSpec(), "")
	long := strings.Repeat("x", policy.MaxValueLen+1)
	for _, tc := range []struct {
		body   string
		status int
	}{
		{``, 400},
		{`{"tenant":"t1","bogus":1}`, 400},
		{`{"tenant":"t1"} {"tenant":"t1"}`, 400},
		{`{"tenant":"t1"}x`, 400},
		{`{"tenant":1}`, 400},
		{`{"tenant":"t1","cost":"1"}`, 400},
		{`{"tenant":"t1","cost":1.5}`, 400},
		{`[]`, 400},
		{`{"tenant":"t1","user":"` + long + `"}`, 400},
		{`{"tenant":"t1","cost":-1}`, 400},
		{`{"tenant":"t1","user":"u","cost":3}`, 400}, // more than user-req's burst
		{`{"tenant":"t1","cost":2000000000}`, 400},
		{`{"tenant":"t1","attributes":{"a":"` + long + `"}}`, 400},
		{`{"tenant":"nobody"}`, 403},
		{`{"tenant":"t1","user":"` + strings.Repeat("y", 70<<10) + `"}`, 413},
	} {
		a := h.do("POST", "/v1/check", tc.body)
		if a.status != tc.status {
			t.Errorf("body %.60q: status %d, want %d: %s", tc.body, a.status, tc.status, a.raw)
		}
	}
	h.want(h.do("GET", "/v1/check", ""), 405, "GET /v1/check")
	h.want(h.do("GET", "/nope", ""), 404, "unknown path")
}

func TestUnknownTenantDefaultTierAndAnonymous(t *testing.T) {
	spec := testSpec()
	spec.UnknownTenant = "big"
	h := start(t, spec, "")
	a := h.do("POST", "/v1/check", `{"tenant":"newcomer","user":"u"}`)
	h.want(a, 200, "unknown tenant with a default tier")
	if a.body["tier"] != "big" || a.body["limit"] != float64(5) {
		t.Errorf("default tier: %s", a.raw)
	}
	a = h.do("POST", "/v1/check", `{"user":"u","ip":"192.0.2.1"}`)
	h.want(a, 200, "anonymous")
	if rules := a.body["rules"].([]any); len(rules) != 1 || rules[0].(map[string]any)["name"] != "global" {
		t.Errorf("anonymous request charged %v, want the global rule only", rules)
	}
}

func TestTierSwitchAppliesToNextRequest(t *testing.T) {
	h := start(t, testSpec(), "")
	doc := `{"tenant":"t1","action":"doc"}`
	h.want(h.do("POST", "/v1/check", doc), 200, "first doc")
	h.want(h.do("POST", "/v1/check", doc), 429, "second doc on small")
	a := h.do("PUT", "/v1/admin/tenants/t1", `{"tier":"big"}`)
	h.want(a, 200, "switch tier")
	if a.body["tier"] != "big" || a.body["source"] != "admin" {
		t.Errorf("PUT answer: %s", a.raw)
	}
	a = h.do("POST", "/v1/check", doc)
	h.want(a, 200, "doc on big")
	if a.body["limit"] != float64(3) || a.body["tier"] != "big" {
		t.Errorf("after the switch: %s", a.raw)
	}
	// An override changes one parameter for this tenant only.
	h.want(h.do("PUT", "/v1/admin/tenants/t2", `{"tier":"big","overrides":[{"name":"docs","burst":7}]}`), 200, "override")
	if a := h.do("POST", "/v1/check", `{"tenant":"t2","action":"doc"}`); a.body["limit"] != float64(7) {
		t.Errorf("override not applied: %s", a.raw)
	}
	for _, bad := range []string{
		`{"tier":"gold"}`, `{"tier":"big","overrides":[{"name":"nope","burst":1}]}`,
		`{"tier":"big","overrides":[{"name":"docs","rate":"fast"}]}`, `{"tier":"big","overrides":[{"name":"docs","algorithm":"gcra"}]}`,
		`{"tier":"big","api_keys_sha256":[]}`,
	} {
		h.want(h.do("PUT", "/v1/admin/tenants/t2", bad), 400, "bad tenant "+bad)
	}
	if a := h.do("POST", "/v1/check", `{"tenant":"t2","action":"doc"}`); a.body["limit"] != float64(7) {
		t.Errorf("a refused change altered the tenant: %s", a.raw)
	}
}

func TestAPIKeys(t *testing.T) {
	h := start(t, testSpec(), "")
	body := `{"tenant":"keyed","user":"u"}`
	a := h.do("POST", "/v1/check", body)
	h.want(a, 401, "no key")
	if a.header.Get("WWW-Authenticate") == "" {
		t.Error("401 without WWW-Authenticate")
	}
	h.want(h.do("POST", "/v1/check", body, "X-API-Key", "wrong"), 401, "unknown key")
	h.want(h.do("POST", "/v1/check", body, "X-API-Key", "secret-key"), 200, "right key")
	h.want(h.do("POST", "/v1/check", body, "Authorization", "Bearer secret-key"), 200, "bearer key")
	a = h.do("POST", "/v1/check", `{"user":"u2"}`, "X-API-Key", "secret-key")
	h.want(a, 200, "key names the tenant")
	if a.body["tenant"] != "keyed" {
		t.Errorf("tenant from key: %s", a.raw)
	}
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1"}`, "X-API-Key", "secret-key"), 403, "another tenant's key")

	a = h.do("POST", "/v1/admin/tenants/t1/api-keys", "")
	h.want(a, 201, "create key")
	key := a.body["api_key"].(string)
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1"}`), 401, "t1 now has a key")
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1"}`, "X-API-Key", key), 200, "t1 with its new key")
	if strings.Contains(h.do("GET", "/v1/admin/tenants/t1", "").raw, key) {
		t.Error("the admin API shows a key after creating it")
	}
	h.want(h.do("POST", "/v1/admin/tenants/ghost/api-keys", ""), 404, "key for unknown tenant")
}

func TestLeases(t *testing.T) {
	h := start(t, testSpec(), "")
	lease := `{"tenant":"t1","resource":"export","ttl_ms":60000}`
	a := h.do("POST", "/v1/leases", lease)
	h.want(a, 201, "first lease")
	id, _ := a.body["lease_id"].(string)
	if id == "" || a.body["expires_at"] == nil {
		t.Fatalf("lease answer: %s", a.raw)
	}
	a = h.do("POST", "/v1/leases", lease)
	h.want(a, 429, "second lease over max 1")
	if a.header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	h.want(h.do("PUT", "/v1/leases/"+id, ""), 200, "renew")
	h.want(h.do("DELETE", "/v1/leases/"+id, ""), 204, "release")
	h.want(h.do("DELETE", "/v1/leases/"+id, ""), 404, "release twice")
	h.want(h.do("PUT", "/v1/leases/"+id, ""), 404, "renew released")
	h.want(h.do("POST", "/v1/leases", lease), 201, "lease after release")
	h.want(h.do("POST", "/v1/leases", `{"tenant":"t1","resource":"nothing"}`), 404, "no concurrency rule")
	h.want(h.do("POST", "/v1/leases", `{"tenant":"t1","resource":"export","ttl_ms":-1}`), 400, "negative ttl")
	// Concurrency rules are not charged by checks.
	a = h.do("POST", "/v1/check", `{"tenant":"t1","action":"export"}`)
	h.want(a, 200, "check of a leased resource")
}

func TestAcquireWaits(t *testing.T) {
	h := start(t, testSpec(), "")
	fast := `{"tenant":"t1","action":"fast","max_wait_ms":1000}`
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1","action":"fast"}`), 200, "take the only token")
	took := time.Now()
	a := h.do("POST", "/v1/acquire", fast)
	h.want(a, 200, "acquire waits for the next token")
	// The next token comes 50ms after the first was taken: acquire waited
	// for it, unless the machine was so slow that it had come already.
	if w := a.body["waited_ms"].(float64); w <= 0 && time.Since(took) < 50*time.Millisecond {
		t.Errorf("acquire admitted at once %v after the only token was taken; the next is 50ms away", time.Since(took))
	}
	// The docs bucket refills in a minute: too long for 100ms.
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1","action":"doc"}`), 200, "take the doc token")
	a = h.do("POST", "/v1/acquire", `{"tenant":"t1","action":"doc","max_wait_ms":100}`)
	h.want(a, 429, "acquire cannot wait a minute")
	if a.body["denied_by"] != "docs" || a.header.Get("Retry-After") == "" {
		t.Errorf("acquire refusal: %s", a.raw)
	}
	// A non-reservable rule (sliding log) is retried instead.
	h.want(h.do("POST", "/v1/acquire", `{"tenant":"t1","ip":"192.0.2.9","action":"login","max_wait_ms":10}`), 200, "first login")
	h.want(h.do("POST", "/v1/acquire", `{"tenant":"t1","ip":"192.0.2.9","action":"login","max_wait_ms":10}`), 429, "second login")
	h.want(h.do("POST", "/v1/acquire", `{"tenant":"t1","max_wait_ms":999999}`), 400, "max_wait_ms over the cap")
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1","max_wait_ms":10}`), 400, "max_wait_ms on check")
}

func TestShadowAndDryRun(t *testing.T) {
	h := start(t, testSpec(), "")
	for i := 0; i < 2; i++ {
		a := h.do("POST", "/v1/check", `{"tenant":"t1","action":"shadow"}`)
		h.want(a, 200, "shadow rule never refuses")
		r := a.body["rules"].([]any)[1].(map[string]any)
		if wantAllowed := i == 0; r["allowed"] != wantAllowed || r["shadow"] != true {
			t.Errorf("shadow check %d: %s", i, a.raw)
		}
	}
	dry := `{"tenant":"t1","action":"doc","dry_run":true}`
	for i := 0; i < 3; i++ {
		h.want(h.do("POST", "/v1/check", dry), 200, "dry runs charge nothing")
	}
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1","action":"doc"}`), 200, "real check after dry runs")
	h.want(h.do("POST", "/v1/check", dry), 429, "dry run of an empty bucket")
}

func TestAdminAuth(t *testing.T) {
	h := start(t, testSpec(), "s3cret")
	a := h.do("GET", "/v1/admin/tenants", "")
	h.want(a, 401, "no token")
	h.want(h.do("GET", "/v1/admin/tenants", "", "Authorization", "Bearer nope"), 401, "wrong token")
	a = h.do("GET", "/v1/admin/tenants", "", "Authorization", "Bearer s3cret")
	h.want(a, 200, "right token")
	if len(a.body["tenants"].([]any)) != 3 {
		t.Errorf("tenants: %s", a.raw)
	}
	// The admin token lets a trusted caller check for a keyed tenant.
	h.want(h.do("POST", "/v1/check", `{"tenant":"keyed"}`, "Authorization", "Bearer s3cret"), 200, "admin checks for keyed")

	// Without a token, only loopback clients reach the admin API.
	open := start(t, testSpec(), "")
	for _, tc := range []struct {
		remote string
		status int
	}{{"127.0.0.1:5000", 200}, {"[::1]:5000", 200}, {"10.1.2.3:5000", 403}, {"[2001:db8::1]:80", 403}} {
		req := httptest.NewRequest("GET", "/v1/admin/tiers", nil)
		req.RemoteAddr = tc.remote
		rec := httptest.NewRecorder()
		open.srv.ServeHTTP(rec, req)
		if rec.Code != tc.status {
			t.Errorf("admin from %s without a token: %d, want %d", tc.remote, rec.Code, tc.status)
		}
	}
}

func TestAdminCatalogStateReset(t *testing.T) {
	h := start(t, testSpec(), "")
	h.want(h.do("GET", "/v1/admin/tenants/ghost", ""), 404, "unknown tenant")
	h.want(h.do("DELETE", "/v1/admin/tenants/ghost", ""), 404, "delete unknown tenant")
	h.want(h.do("PUT", "/v1/admin/tenants/bad%20id", `{"tier":"big"}`), 400, "bad tenant id")
	a := h.do("PUT", "/v1/admin/tenants/t9", `{"tier":"small"}`)
	h.want(a, 200, "create tenant")
	h.want(h.do("POST", "/v1/check", `{"tenant":"t9"}`), 200, "new tenant is checked")
	h.want(h.do("DELETE", "/v1/admin/tenants/t9", ""), 204, "delete tenant")
	h.want(h.do("POST", "/v1/check", `{"tenant":"t9"}`), 403, "deleted tenant")

	a = h.do("GET", "/v1/admin/tiers/small", "")
	h.want(a, 200, "get tier")
	if a.body["tenants"] != float64(2) || len(a.body["rules"].([]any)) != 6 {
		t.Errorf("tier: %s", a.raw)
	}
	h.want(h.do("GET", "/v1/admin/tiers/gold", ""), 404, "unknown tier")
	h.want(h.do("PUT", "/v1/admin/tiers/gold", `{"rules":[{"name":"x","scope":"user","algorithm":"token_bucket","rate":"1/s"}]}`), 400, "tier rule without burst")
	a = h.do("PUT", "/v1/admin/tiers/small", `{"rules":[{"name":"user-req","scope":"user","algorithm":"token_bucket","rate":"1/min","burst":9}]}`)
	h.want(a, 200, "replace tier")
	if a := h.do("POST", "/v1/check", `{"tenant":"t1","user":"u"}`); a.body["limit"] != float64(9) {
		t.Errorf("tier change not applied: %s", a.raw)
	}
	h.want(h.do("GET", "/v1/admin/tiers", ""), 200, "list tiers")

	a = h.do("GET", "/v1/admin/state?tenant=t1&user=u", "")
	h.want(a, 200, "state")
	b := a.body["buckets"].([]any)
	if len(b) != 2 || b[1].(map[string]any)["remaining"] != float64(8) {
		t.Fatalf("state: %s", a.raw)
	}
	a = h.do("POST", "/v1/admin/reset", `{"tenant":"t1","user":"u","rules":["user-req"]}`)
	h.want(a, 200, "reset")
	a = h.do("GET", "/v1/admin/state?tenant=t1&user=u", "")
	if a.body["buckets"].([]any)[1].(map[string]any)["remaining"] != float64(9) {
		t.Errorf("after reset: %s", a.raw)
	}
	h.want(h.do("POST", "/v1/admin/reset", `{"tenant":"t1","oops":true}`), 400, "reset with unknown field")
	h.want(h.do("GET", "/v1/admin/state?tenant=ghost", ""), 403, "state of unknown tenant")
}

func TestHealthReadyMetricsDecisionLog(t *testing.T) {
	h := start(t, testSpec(), "")
	h.want(h.do("GET", "/healthz", ""), 200, "healthz")
	a := h.do("GET", "/readyz", "")
	h.want(a, 200, "readyz")
	if a.body["config_error"] != nil {
		t.Errorf("ready: %s", a.raw)
	}
	h.srv.SetConfigError(io.ErrUnexpectedEOF)
	if a := h.do("GET", "/readyz", ""); !strings.Contains(a.raw, "unexpected EOF") || a.status != 200 {
		t.Errorf("readyz after a bad reload: %d %s", a.status, a.raw)
	}
	h.do("POST", "/v1/check", `{"tenant":"t1","action":"doc"}`)
	h.do("POST", "/v1/check", `{"tenant":"t1","action":"doc"}`)
	resp, err := http.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`admit_decisions_total{result="allowed",rule="docs",tier="small"} 1`,
		`admit_decisions_total{result="refused",rule="docs",tier="small"} 1`,
		`admit_requests_total{endpoint="check",result="refused"} 1`,
		`admit_decision_duration_seconds_count{endpoint="check"} 2`,
		`admit_config_reloads_total{result="error"} 1`,
		`admit_store_keys `,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(string(body), `tenant="t1"`) {
		t.Error("a tenant label without tenant_metrics")
	}
	h.srv.Close() // flushes the decision log
	lines := strings.Split(strings.TrimSpace(h.log.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("decision log has %d lines, want 2: %q", len(lines), lines)
	}
	var e decisionEntry
	if err := json.Unmarshal([]byte(lines[1]), &e); err != nil || e.ClaimID == "" || e.Tenant != "t1" || e.Action != "doc" || e.Result != "refused" || e.Rule != "docs" {
		t.Errorf("decision log line %q (%v)", lines[1], err)
	}
}

// TestHammerOneTenant checks the server's exact admission bound: many
// clients at once on one tenant bucket admit exactly its burst.
func TestHammerOneTenant(t *testing.T) {
	spec := testSpec()
	spec.Tiers["small"].Rules[1] = tb("docs", "tenant", []string{"doc"}, "1/h", 40)
	h := start(t, spec, "")
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				resp, err := http.Post(h.url+"/v1/check", "application/json", strings.NewReader(`{"tenant":"t1","action":"doc"}`))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if codes[200] != 40 || codes[429] != 120 {
		t.Errorf("160 requests on a burst of 40: %v", codes)
	}
}

func FuzzCheckBody(f *testing.F) {
	for _, s := range []string{
		`{"tenant":"t1","user":"u","action":"doc","cost":1}`, `{"tenant":"keyed"}`, `{"ip":"::1","action":"login"}`,
		`{"tenant":"t1","attributes":{"plan":"x"},"dry_run":true}`, `{"cost":0}`, `{"tenant":"t1","cost":99}`, `nul`, `{"a":`,
	} {
		f.Add(s)
	}
	h := start(f, testSpec(), "")
	f.Fuzz(func(t *testing.T, body string) {
		req := httptest.NewRequest("POST", "/v1/check", strings.NewReader(body))
		rec := httptest.NewRecorder()
		h.srv.ServeHTTP(rec, req)
		switch {
		case rec.Code >= 500:
			t.Fatalf("body %q: status %d: %s", body, rec.Code, rec.Body)
		case rec.Code == 200 || rec.Code == 429:
			var d struct {
				Allowed *bool `json:"allowed"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &d); err != nil || d.Allowed == nil || *d.Allowed != (rec.Code == 200) {
				t.Fatalf("body %q: status %d with answer %s", body, rec.Code, rec.Body)
			}
		default:
			if rec.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("body %q: status %d without a problem: %s", body, rec.Code, rec.Body)
			}
		}
	})
}

// FuzzAdminBody: any tenant or tier id and body sent to the admin API is
// answered with a 2xx or a 4xx problem, never a 5xx or a panic, and a
// refused change leaves the catalog as it was.
func FuzzAdminBody(f *testing.F) {
	for _, s := range []struct{ kind, id, body string }{
		{"tenants", "acme", `{"tier":"big"}`},
		{"tenants", "t1", `{"tier":"small","overrides":[{"name":"user-req","rate":"5/s"}]}`},
		{"tenants", "x", `{"tier":"small","overrides":[{"name":"user-req","algorithm":"gcra"}]}`},
		{"tiers", "gold", `{"rules":[{"name":"r","scope":"tenant","algorithm":"token_bucket","rate":"1/s","burst":2}]}`},
		{"tiers", "small", `{"rules":[{"name":"r","scope":"attribute:plan","algorithm":"fixed_window","limit":3,"window":"1m"}],"gateway":{"tenant_connections":-1}}`},
		{"tenants", "a b", `{"tier":"big"}`}, {"tiers", "t", `nul`}, {"tenants", "%00", `{}`},
	} {
		f.Add(s.kind, s.id, s.body)
	}
	h := start(f, testSpec(), "")
	f.Fuzz(func(t *testing.T, kind, id, body string) {
		if kind != "tenants" && kind != "tiers" {
			kind = "tenants"
		}
		before := h.catalog.Policy()
		req := httptest.NewRequest("PUT", "/v1/admin/"+kind+"/x", strings.NewReader(body))
		req.SetPathValue("id", id)
		req.URL.Path = "/v1/admin/" + kind + "/" + url.PathEscape(id)
		req.RemoteAddr = "127.0.0.1:1"
		rec := httptest.NewRecorder()
		h.srv.ServeHTTP(rec, req)
		switch {
		case rec.Code >= 500:
			t.Fatalf("PUT %s %q %q: status %d: %s", kind, id, body, rec.Code, rec.Body)
		case rec.Code >= 400:
			if rec.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("PUT %s %q %q: status %d without a problem: %s", kind, id, body, rec.Code, rec.Body)
			}
			if h.catalog.Policy() != before {
				t.Fatalf("PUT %s %q %q: refused with %d, yet the catalog changed", kind, id, body, rec.Code)
			}
		}
	})
}
