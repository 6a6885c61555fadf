package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/catalog"
	"github.com/admitdev/admit/proctest"
)

func n(v int64) *int64 { return &v }

func tb(name, scope string, actions []string, rate string, burst int64) policy.RuleSpec {
	return policy.RuleSpec{Name: name, Scope: scope, Actions: actions, Algorithm: "token_bucket", Rate: rate, Burst: n(burst)}
}

func withMaxCost(r policy.RuleSpec, most int64) policy.RuleSpec {
	r.MaxCost = &most
	return r
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
				withMaxCost(tb("user-req", "user", nil, "1/min", 5), 10),
				withMaxCost(tb("docs", "tenant", []string{"doc"}, "1/min", 3), 10),
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
	catalog *catalog.Catalog
	store   *memstore.Store
	log     *syncBuffer
}

// syncBuffer collects logs; it is safe for concurrent use.
type syncBuffer = proctest.Buffer

func start(t testing.TB, spec *policy.Spec, token string, opts ...func(*Options)) *harness {
	t.Helper()
	store := memstore.New(nil)
	cat, err := catalog.New(context.Background(), spec, &catalog.FileStore{Path: t.TempDir() + "/catalog.json"})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, store: store, catalog: cat, log: &syncBuffer{}}
	// Without a token, the tests reach the admin API as a client on this
	// host (TestAdminAuth tests the guard itself).
	o := Options{Store: store, Catalog: cat, AdminToken: token, AdminLoopback: token == "", DecisionLog: h.log, MaxWait: 2 * time.Second,
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
	if method != "GET" {
		req.Header.Set("Content-Type", "application/json")
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
	if got := a.header.Get("RateLimit-Policy"); !regexp.MustCompile(`^"global";q=100;w=1;pk=:[A-Za-z0-9+/]{12}:, "user-req";q=2;w=120;pk=:[A-Za-z0-9+/]{12}:$`).MatchString(got) {
		t.Errorf("RateLimit-Policy = %q", got)
	}
	if !regexp.MustCompile(`^"global";r=\d+;t=\d+;pk=:[A-Za-z0-9+/]{12}:, "user-req";r=0;t=120;pk=:[A-Za-z0-9+/]{12}:$`).MatchString(a.header.Get("RateLimit")) {
		t.Errorf("RateLimit = %q", a.header.Get("RateLimit"))
	}
	// The refusal is a problem of the quota-exceeded type as well.
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json", ct)
	}
	if v, _ := a.body["violated-policies"].([]any); a.body["type"] != "https://iana.org/assignments/http-problem-types#quota-exceeded" ||
		a.body["status"] != float64(429) || len(v) != 1 || v[0] != "user-req" {
		t.Errorf("refusal: not a quota-exceeded problem naming user-req: %s", a.raw)
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
	h := start(t, testSpec(), "", func(o *Options) { o.ServiceTokens = []string{"backend"} })
	// Tier big: user-req burst 5, docs burst 3 (1/min each, max_cost
	// 10), global 100. The report is charged, and answered 200 with
	// over_limit: it left rules over their limits, which refuse until
	// the next 4 minutes. (A 429 would be charged again by a client that
	// retries 429s.)
	a := h.do("POST", "/v1/report", `{"tenant":"t2","user":"u1","action":"doc","cost":7}`)
	h.want(a, 200, "report")
	if a.body["allowed"] != true || a.body["over_limit"] != true || a.body["remaining"] != float64(0) || a.body["retry_after_ms"] != float64(240000) {
		t.Errorf("report: %s", a.raw)
	}
	fits := map[string]any{}
	for _, r := range a.body["rules"].([]any) {
		m := r.(map[string]any)
		fits[m["name"].(string)] = m["allowed"]
	}
	// The global bucket, which every tenant shares, takes no debit from
	// a caller without a service token: a debit is never refused, so one
	// tenant could keep it empty for all.
	if _, charged := fits["global"]; charged || fits["user-req"] != false || fits["docs"] != false {
		t.Errorf("what each debit fitted: %v, want user-req and docs over, global not charged", fits)
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

	// A sliding log takes no debits: a platform backend's report of a
	// login is charged to the global bucket only, and the login still
	// passes.
	a = h.do("POST", "/v1/report", `{"tenant":"t1","ip":"192.0.2.1","action":"login","cost":5}`, "Authorization", "Bearer backend")
	h.want(a, 200, "report of a login") // within the global bucket
	if rules := a.body["rules"].([]any); len(rules) != 1 || rules[0].(map[string]any)["name"] != "global" {
		t.Errorf("a report of a login charged %v", rules)
	}
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1","ip":"192.0.2.1","action":"login"}`), 200, "login after its report")

	a = h.do("POST", "/v1/report", `{"tenant":"t2","user":"u9","cost":11}`)
	h.want(a, 400, "report past the rules' max_cost")
	if !strings.Contains(a.raw, "max_cost 10") {
		t.Errorf("report past max_cost: %s, want the bound named", a.raw)
	}
	h.want(h.do("POST", "/v1/report", `{"tenant":"t2","cost":1000000001}`), 400, "report past MaxCost")
	h.want(h.do("POST", "/v1/report", `{"tenant":"t2"}`), 400, "report without a cost")
}

func TestCheckBadInput(t *testing.T) {
	h := start(t, testSpec(), "")
	long := strings.Repeat("x", bounds.MaxValueLen+1)
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
		{`{"tenant":"t1","user":"a","user":"b"}`, 400},               // a key twice: who read which?
		{`{"tenant":"t1","USER":"a","user":"b"}`, 400},               // the decoder matches any case
		{`{"tenant":"t1","attributes":{"a":"1","\u0061":"2"}}`, 400}, // the same once unescaped
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
	// The tenant's bucket keeps what it holds, drained, under big's
	// rule of the same name: refused until big's rate refills a token,
	// never for longer, and never refilled by the move itself.
	a = h.do("POST", "/v1/check", doc)
	h.want(a, 429, "doc on big, drained on small")
	if a.body["limit"] != float64(3) || a.body["tier"] != "big" || a.body["retry_after_ms"].(float64) > 60000 {
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

	// Revoking one key leaves the others; the revoked one is unknown.
	a = h.do("POST", "/v1/admin/tenants/t1/api-keys", "")
	h.want(a, 201, "a second key")
	second, secondID := a.body["api_key"].(string), a.body["key_id"].(string)
	if ids := h.do("GET", "/v1/admin/tenants/t1", "").body["api_key_ids"].([]any); len(ids) != 2 || ids[1] != secondID {
		t.Fatalf("key ids %v, want 2 ending with %s", ids, secondID)
	}
	h.want(h.do("DELETE", "/v1/admin/tenants/t1/api-keys/"+secondID, ""), 204, "revoke the second key")
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1"}`, "X-API-Key", second), 401, "the revoked key")
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1"}`, "X-API-Key", key), 200, "the key not revoked")
	h.want(h.do("DELETE", "/v1/admin/tenants/t1/api-keys/"+secondID, ""), 404, "revoke twice")
	h.want(h.do("DELETE", "/v1/admin/tenants/t1/api-keys/abc", ""), 404, "a key id that names nothing")
	// The last key stays: without keys a tenant would need none.
	h.want(h.do("DELETE", "/v1/admin/tenants/t1/api-keys/"+catalog.APIKeyID(policy.HashKey(key)), ""), 409, "revoke the last key")
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1"}`), 401, "t1 after refusing to revoke its last key")
	// A key from the configuration can be revoked too.
	h.want(h.do("POST", "/v1/admin/tenants/keyed/api-keys", ""), 201, "a second key for keyed")
	id := catalog.APIKeyID(policy.HashKey("secret-key"))
	h.want(h.do("DELETE", "/v1/admin/tenants/keyed/api-keys/"+id, ""), 204, "revoke a configured key")
	h.want(h.do("POST", "/v1/check", body, "X-API-Key", "secret-key"), 401, "the revoked configured key")
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

	// The admin token is also a service token, but a service token opens
	// no admin route.
	svc := start(t, testSpec(), "s3cret", func(o *Options) { o.ServiceTokens = []string{"backend"} })
	h.want(svc.do("POST", "/v1/check", `{"tenant":"keyed"}`, "Authorization", "Bearer backend"), 200, "service checks for keyed")
	h.want(svc.do("GET", "/v1/admin/tenants", "", "Authorization", "Bearer backend"), 401, "service token on the admin API")

	// A body that is not JSON is refused before it is read, even with
	// the token.
	h.want(h.do("POST", "/v1/admin/reset", `{"tenant":"t1"}`, "Authorization", "Bearer s3cret", "Content-Type", "text/plain"), 415, "text/plain body")
	h.want(h.do("POST", "/v1/admin/reset", `{"tenant":"t1"}`, "Authorization", "Bearer s3cret", "Content-Type", "application/json; charset=utf-8"), 200, "JSON with a charset")

	// Without a token the admin API is closed, from loopback too.
	closed := start(t, testSpec(), "", func(o *Options) { o.AdminLoopback = false })
	a = closed.do("GET", "/v1/admin/tiers", "")
	h.want(a, 401, "no token, no --admin-loopback")
	if !strings.Contains(a.raw, "--admin-loopback") {
		t.Errorf("the refusal does not say how to open the admin API: %s", a.raw)
	}

	// With AdminLoopback, only a client on this host that reaches the
	// server directly gets in: not a proxy, sidecar or TLS terminator on
	// the host, nor a page in a browser on it.
	open := start(t, testSpec(), "", func(o *Options) {
		o.HTTP.TrustedProxies, _ = httplimit.ParseProxies([]string{"127.0.0.2"})
	})
	for _, tc := range []struct {
		what, method, remote, host string
		hdr                        []string
		status                     int
	}{
		{"127.0.0.1", "GET", "127.0.0.1:5000", "127.0.0.1:8080", nil, 200},
		{"::1", "GET", "[::1]:5000", "[::1]:8080", nil, 200},
		{"localhost", "GET", "127.0.0.1:5000", "localhost:8080", nil, 200},
		{"another host", "GET", "10.1.2.3:5000", "127.0.0.1:8080", nil, 403},
		{"another host over IPv6", "GET", "[2001:db8::1]:80", "[::1]:8080", nil, 403},
		{"Istio's sidecar", "GET", "127.0.0.6:5000", "127.0.0.1:8080", nil, 403},
		{"a trusted proxy", "GET", "127.0.0.2:5000", "127.0.0.1:8080", nil, 403},
		{"a forwarded request", "GET", "127.0.0.1:5000", "127.0.0.1:8080", []string{"X-Forwarded-For", "203.0.113.1"}, 403},
		{"an Envoy request", "GET", "127.0.0.1:5000", "127.0.0.1:8080", []string{"X-Envoy-Internal", "true"}, 403},
		{"a Forwarded request", "GET", "127.0.0.1:5000", "127.0.0.1:8080", []string{"Forwarded", "for=203.0.113.1"}, 403},
		{"DNS rebinding", "GET", "127.0.0.1:5000", "evil.example:8080", nil, 403},
		{"another site's page", "POST", "127.0.0.1:5000", "127.0.0.1:8080", []string{"Sec-Fetch-Site", "cross-site", "Content-Type", "application/json"}, 403},
		{"another origin", "POST", "127.0.0.1:5000", "127.0.0.1:8080", []string{"Origin", "http://evil.example", "Content-Type", "application/json"}, 403},
		{"a no-cors text/plain POST", "POST", "127.0.0.1:5000", "127.0.0.1:8080", []string{"Content-Type", "text/plain;charset=UTF-8"}, 415},
		{"a POST without a type", "POST", "127.0.0.1:5000", "127.0.0.1:8080", nil, 415},
		{"the dashboard's own POST", "POST", "127.0.0.1:5000", "127.0.0.1:8080", []string{"Origin", "http://127.0.0.1:8080", "Sec-Fetch-Site", "same-origin", "Content-Type", "application/json"}, 201},
	} {
		path := "/v1/admin/tiers"
		if tc.method == "POST" {
			path = "/v1/admin/tenants/t1/api-keys"
		}
		req := httptest.NewRequest(tc.method, path, nil)
		req.RemoteAddr, req.Host = tc.remote, tc.host
		for i := 0; i+1 < len(tc.hdr); i += 2 {
			req.Header.Set(tc.hdr[i], tc.hdr[i+1])
		}
		rec := httptest.NewRecorder()
		open.srv.ServeHTTP(rec, req)
		if rec.Code != tc.status {
			t.Errorf("admin without a token, %s: %d, want %d: %s", tc.what, rec.Code, tc.status, rec.Body)
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

// TestSharedKeysUntrusted: a caller without a service token reaches no
// key that other tenants share with a value it chose — an ip it names for
// a global per-ip rule, a debit of the global bucket — and holds a lease
// no longer than its rule's lease_ttl; the platform's backend, with a
// service token, names what it likes.
func TestSharedKeysUntrusted(t *testing.T) {
	spec := &policy.Spec{
		Global: []policy.RuleSpec{
			tb("global", "global", nil, "1/h", 100),
			{Name: "logins-per-ip", Scope: "ip", Actions: []string{"login"}, Algorithm: "fixed_window", Limit: n(2), Window: "1h"},
			{Name: "global-exports", Scope: "global", Actions: []string{"export"}, Algorithm: "concurrency", Max: n(5), LeaseTTL: "30s"},
		},
		Tiers:   map[string]policy.TierSpec{"t": {Rules: []policy.RuleSpec{tb("tenant", "tenant", nil, "1/h", 50)}}},
		Tenants: map[string]policy.TenantSpec{"acme": {Tier: "t"}, "victim": {Tier: "t"}},
	}
	h := start(t, spec, "", func(o *Options) { o.ServiceTokens = []string{"backend"} })
	backend := []string{"Authorization", "Bearer backend"}
	login := `{"tenant":"%s","action":"login","ip":"203.0.113.9"}`

	// acme names the victim's address: its own rules are charged, the
	// per-ip rule every tenant shares is not.
	for range 5 {
		a := h.do("POST", "/v1/check", fmt.Sprintf(login, "acme"))
		h.want(a, 200, "acme's login naming another's ip")
		for _, r := range a.body["rules"].([]any) {
			if name := r.(map[string]any)["name"]; name == "logins-per-ip" {
				t.Fatalf("an untrusted caller's ip reached logins-per-ip: %s", a.raw)
			}
		}
	}
	// A debit of a million: refused above max_cost; within it, the
	// global bucket is not debited.
	h.want(h.do("POST", "/v1/report", `{"tenant":"acme","cost":1000000}`), 400, "a debit of a million")
	a := h.do("POST", "/v1/report", `{"tenant":"acme","cost":50}`)
	h.want(a, 200, "a debit within max_cost, leaving acme over its own limit")
	if rules := a.body["rules"].([]any); len(rules) != 1 || rules[0].(map[string]any)["name"] != "tenant" {
		t.Errorf("an untrusted debit charged %v, want acme's own bucket only", rules)
	}
	// The victim's logins from that address, decided by the platform's
	// backend, find the shared buckets untouched.
	for i, want := range []int{200, 200, 429} {
		a := h.do("POST", "/v1/check", fmt.Sprintf(login, "victim"), backend...)
		h.want(a, want, fmt.Sprintf("victim's login %d through the backend", i))
		if i == 0 {
			for _, r := range a.body["rules"].([]any) {
				m := r.(map[string]any)
				if m["name"] == "global" && m["shared_remaining"].(float64) < 90 {
					t.Errorf("the global bucket holds %v after acme's calls, want at least 90 of 100", m["shared_remaining"])
				}
			}
		}
	}

	// A lease asked for a year lasts the rule's lease_ttl.
	a = h.do("POST", "/v1/leases", `{"tenant":"acme","resource":"export","ttl_ms":31536000000}`)
	h.want(a, 201, "a lease of a year")
	exp, err := time.Parse(time.RFC3339Nano, a.body["expires_at"].(string))
	if err != nil || time.Until(exp) > 31*time.Second {
		t.Errorf("a lease asked for a year expires at %v (%v), want within the rule's 30s", a.body["expires_at"], err)
	}
	h.want(h.do("POST", "/v1/leases", `{"tenant":"acme","resource":"export","ttl_ms":9223372036854775807}`), 400, "a TTL that overflows")
}

// TestTenantMetricsBounded: the tenant label names the catalog's tenants;
// tenants of the default tier, whose ids come from requests, share one
// label, so that no caller can make series without bound. The tenant
// series are served by MetricsHandler alone, never at the API's /metrics,
// which any client reaches; with MetricsElsewhere that answers 404.
func TestTenantMetricsBounded(t *testing.T) {
	spec := testSpec()
	spec.UnknownTenant = "small"
	// Tenants only a default tier knows, named without a credential, are
	// the anonymous callers of the shared global bucket: its burst holds
	// their share of it beside t1's.
	spec.Global[0] = tb("global", "global", nil, "1000/s", 1000)
	h := start(t, spec, "", func(o *Options) { o.TenantMetrics = true })
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1"}`), 200, "a catalog tenant")
	for i := range 100 {
		h.want(h.do("POST", "/v1/check", fmt.Sprintf(`{"tenant":"made-up-%d"}`, i)), 200, "a default-tier tenant")
	}
	if _, public := h.send("GET", "/metrics", ""); strings.Contains(string(public), "admit_tenant_decisions_total") ||
		!strings.Contains(string(public), `admit_requests_total{endpoint="check",result="allowed"} 101`) {
		t.Errorf("the API's /metrics, with tenant series or without the others:\n%s", public)
	}
	rec := httptest.NewRecorder()
	h.srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	raw := rec.Body.Bytes()
	if !strings.Contains(string(raw), `admit_requests_total{endpoint="check",result="allowed"} 101`) {
		t.Errorf("MetricsHandler lacks the API's series")
	}
	series := regexp.MustCompile(`(?m)^admit_tenant_decisions_total\{.*$`).FindAllString(string(raw), -1)
	if len(series) != 2 || !strings.Contains(string(raw), `admit_tenant_decisions_total{result="allowed",tenant="_default_tier"} 100`) ||
		!strings.Contains(string(raw), `admit_tenant_decisions_total{result="allowed",tenant="t1"} 1`) {
		t.Errorf("tenant series after 101 tenants: %q", series)
	}
	elsewhere := start(t, spec, "", func(o *Options) { o.TenantMetrics, o.MetricsElsewhere = true, true })
	elsewhere.want(elsewhere.do("GET", "/metrics", ""), 404, "the API's /metrics with the metrics elsewhere")
}

// grudging refuses every decision and says to come back at once, as a
// key whose freed capacity others keep taking does; it counts decisions.
type grudging struct {
	*memstore.Store
	decisions atomic.Int64
}

func (g *grudging) Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	g.decisions.Add(1)
	d.Reset()
	for _, c := range charges {
		d.Results = append(d.Results, admit.Result{Rule: c.Rule.Name, Limit: c.Rule.Capacity()})
	}
	engine.Summarize(d)
	return nil
}

// TestAcquirePollsBounded: /v1/acquire on a rule it cannot book (a
// sliding log) polls the store, and a refusal that says "now" does not
// make it poll without pause: each round waits at least twice the last
// (from 5 ms to 1 s), so a two-second wait is at most a dozen decisions.
func TestAcquirePollsBounded(t *testing.T) {
	spec := &policy.Spec{
		Tiers:   map[string]policy.TierSpec{"t": {Rules: []policy.RuleSpec{{Name: "log", Scope: "tenant", Algorithm: "sliding_log", Limit: n(1), Window: "1h"}}}},
		Tenants: map[string]policy.TenantSpec{"t1": {Tier: "t"}},
	}
	g := &grudging{Store: memstore.New(nil)}
	defer g.Store.Close()
	h := start(t, spec, "", func(o *Options) { o.Store = g })
	a := h.do("POST", "/v1/acquire", `{"tenant":"t1","max_wait_ms":2000}`)
	h.want(a, 429, "acquire of a key never free")
	if n := g.decisions.Load(); n < 2 || n > 12 {
		t.Errorf("a 2 s acquire made %d decisions, want from 2 to 12", n)
	}
}
