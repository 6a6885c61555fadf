package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/admitdev/admit/redistest"
)

// apiCall is one request of TestOpenAPI and the status it must get.
type apiCall struct {
	method, path, body string
	header             map[string]string
	status             int
	// malformed requests break the document's request schema on purpose:
	// only their answers are checked.
	malformed bool
	// as names the operation whose answers a 405 is checked against.
	as string
	// answerHeaders must be in the answer: the document says only which
	// headers an answer may carry when the request asked for them.
	answerHeaders []string
}

// openapiLimits is the Limitador limits file of TestOpenAPI's Limitador
// servers: two GETs a minute per user of shop, a monthly quota of shop
// (Admit's fields, which /limits writes), and a limit whose variable fails
// on a value that is not a number.
const openapiLimits = `- namespace: shop
  max_value: 2
  seconds: 60
  name: per-user
  conditions: ["descriptors[0]['method'] == 'GET'"]
  variables: ["descriptors[0]['user']"]
- namespace: shop
  id: shop-monthly
  max_value: 100000
  seconds: 0
  conditions: []
  variables: []
  algorithm: quota
  period: month
  time_zone: Europe/Paris
  distribution: leased
- namespace: shop/tokens
  max_value: 100
  seconds: 60
  conditions: []
  variables: ["int(descriptors[0]['n'])"]
`

// TestOpenAPI runs admit serve, reads the OpenAPI document it serves,
// validates it, and calls every operation in it, admitted and refused and
// in error, checking each answer (status, headers, body) against the
// document: neither can change without the other.
func TestOpenAPI(t *testing.T) {
	const token = "e2e-admin-token"
	p := startAdmitEnv(t, []string{"ADMIT_ADMIN_TOKEN=" + token})
	// A second server on a Redis that is stopped: the answers of an outage.
	redis := redistest.Start(t)
	down := startAdmitEnv(t, []string{"ADMIT_ADMIN_TOKEN=" + token}, "--store", "redis://"+redis.Addr)
	// A third whose rule fails closed: unready while Redis is down.
	closedCfg := filepath.Join(t.TempDir(), "closed.yaml")
	if err := os.WriteFile(closedCfg, []byte("version: 1\nstore:\n  on_error: closed\ntiers:\n  free:\n    rules:\n"+
		"      - {name: calls, scope: tenant, algorithm: token_bucket, rate: 1/s, burst: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	closed := startAdmitEnv(t, []string{"ADMIT_ADMIN_TOKEN=" + token}, "--store", "redis://"+redis.Addr, "--config", closedCfg)
	// Two that serve Limitador's HTTP API (--limitador-config), on memory
	// and on the Redis that is stopped.
	const serviceToken = "e2e-service-token"
	limits := filepath.Join(t.TempDir(), "limits.yaml")
	writeTestFile(t, limits, openapiLimits)
	limEnv := []string{"ADMIT_ADMIN_TOKEN=" + token, "ADMIT_SERVICE_TOKEN=" + serviceToken}
	lim := startAdmitEnv(t, limEnv, "--limitador-config", limits)
	limDown := startAdmitEnv(t, limEnv, "--store", "redis://"+redis.Addr, "--limitador-config", limits)
	redis.Kill()
	ctx := context.Background()

	doc, router := servedSpec(t, p.url, down.url, closed.url, lim.url, limDown.url)

	admin := map[string]string{"Authorization": "Bearer " + token}
	seen := map[string][]int{} // operation → statuses answered
	var doAt func(base string, c apiCall) []byte
	do := func(c apiCall) []byte {
		t.Helper()
		return doAt(p.url, c)
	}
	doAt = func(base string, c apiCall) []byte {
		t.Helper()
		req, err := http.NewRequest(c.method, base+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		if c.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body []byte
		if resp.StatusCode != http.StatusSwitchingProtocols { // a 101's body is the WebSocket
			body, _ = io.ReadAll(resp.Body)
		}
		resp.Body.Close()
		name := c.method + " " + c.path
		if resp.StatusCode != c.status {
			t.Errorf("%s: %d, want %d: %s", name, resp.StatusCode, c.status, body)
			return body
		}
		for _, h := range c.answerHeaders {
			if resp.Header.Get(h) == "" {
				t.Errorf("%s → %d: no %s header", name, resp.StatusCode, h)
			}
		}
		// Route a copy: the router needs the body, the call is done.
		rreq := req.Clone(ctx)
		rreq.Body = io.NopCloser(strings.NewReader(c.body))
		if c.as != "" {
			rreq.Method = c.as
		}
		route, params, err := router.FindRoute(rreq)
		if err != nil {
			t.Errorf("%s: not in the document: %v", name, err)
			return body
		}
		in := &openapi3filter.RequestValidationInput{
			Request: rreq, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true},
		}
		if !c.malformed && c.as == "" {
			if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
				t.Errorf("%s: the test's request does not fit the document: %v", name, err)
			}
		}
		out := &openapi3filter.ResponseValidationInput{
			RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
			Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
		}
		out.SetBodyBytes(body)
		if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
			t.Errorf("%s → %d does not fit the document: %v\n%s", name, resp.StatusCode, err, body)
		}
		op := operationKey(route)
		seen[op] = append(seen[op], resp.StatusCode)
		return body
	}
	field := func(body []byte, name string) string {
		var m map[string]any
		_ = json.Unmarshal(body, &m)
		s, _ := m[name].(string)
		return s
	}

	for _, c := range []apiCall{
		{method: "GET", path: "/healthz", status: 200},
		{method: "GET", path: "/readyz", status: 200},
		{method: "GET", path: "/metrics", status: 200},
		{method: "GET", path: "/openapi.yaml", status: 200},

		{method: "POST", path: "/v1/check", body: `{"tenant":"t1234","user":"u1","action":"search","attributes":{"region":"eu"}}`, status: 200},
		{method: "POST", path: "/v1/check", body: `{"tenant":"t1234","bogus":1}`, status: 400, malformed: true},
		{method: "POST", path: "/v1/check", body: `{"tenant":"t1234","cost":-1}`, status: 400, malformed: true},
		{method: "POST", path: "/v1/check", body: `{"tenant":"t1234"}`, header: map[string]string{"X-API-Key": "no-such-key"}, status: 401},
		{method: "POST", path: "/v1/check", body: `{"tenant":"ghost"}`, status: 403},
		{method: "POST", path: "/v1/check", body: `{"tenant":"` + strings.Repeat("x", 70<<10) + `"}`, status: 413, malformed: true},
		{method: "GET", path: "/v1/check", status: 405, as: "POST"},
		{method: "POST", path: "/v1/check", body: `{"tenant":"tenant-1","action":"invoke-doc-summary-ai","cost":2}`, status: 200},
		{method: "POST", path: "/v1/check", body: `{"tenant":"tenant-1","action":"invoke-doc-summary-ai"}`, status: 429},
		{method: "POST", path: "/v1/check", body: `{"tenant":"tenant-2","action":"search","dry_run":true,"cost":0}`, status: 200},

		{method: "POST", path: "/v1/report", body: `{"tenant":"tenant-2","action":"x","cost":1}`, status: 200},
		{method: "POST", path: "/v1/report", body: `{"tenant":"tenant-2","action":"x"}`, status: 400, malformed: true},
		{method: "POST", path: "/v1/report", body: `{"tenant":"tenant-2","action":"invoke-doc-summary-ai","cost":90}`, status: 200},

		{method: "POST", path: "/v1/acquire", body: `{"tenant":"t1234","max_wait_ms":100}`, status: 200},
		{method: "POST", path: "/v1/acquire", body: `{"tenant":"t1234","max_wait_ms":999999}`, status: 400, malformed: true},
		{method: "POST", path: "/v1/acquire", body: `{"tenant":"tenant-1","action":"invoke-doc-summary-ai","max_wait_ms":0}`, status: 429},

		{method: "GET", path: "/v1/usage?tenant=t1234&action=invoke-doc-summary-ai", status: 200},
		{method: "GET", path: "/v1/usage?tenant=tenant-1&user=u&action=search", status: 200},
		{method: "GET", path: "/v1/usage?user=u", status: 400, malformed: true},
		{method: "GET", path: "/v1/usage?tenant=ghost", status: 403},

		{method: "GET", path: "/v1/authz", header: map[string]string{"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/search"}, status: 200},
		{method: "POST", path: "/v1/authz", status: 200},
		{method: "POST", path: "/v1/authz", header: map[string]string{"X-API-Key": "no-such-key"}, status: 401},
		{method: "POST", path: "/v1/authz/search", status: 200},
		{method: "POST", path: "/v1/authz/search", header: map[string]string{"X-API-Key": "no-such-key"}, status: 401},
		{method: "GET", path: "/v1/authz/search", status: 200},
		{method: "GET", path: "/v1/authz/search", header: map[string]string{"X-API-Key": "no-such-key"}, status: 401},
		{method: "GET", path: "/v1/authz", header: map[string]string{"X-API-Key": "no-such-key"}, status: 401},
		{method: "GET", path: "/v1/authz?deny_status=418", status: 400, malformed: true},

		{method: "GET", path: "/demo/tenants", status: 200},
		{method: "GET", path: "/v1/ws?tenant=t1234", status: 426},
		{method: "GET", path: "/v1/ws/preflight?tenant=t1234", status: 401},
		{method: "GET", path: "/v1/ws/preflight?tenant=ghost&session=x", status: 403},
		{method: "PUT", path: "/v1/sessions", body: `{"tenant":"ghost"}`, status: 403},
		{method: "PUT", path: "/v1/sessions", body: `{}`, status: 400, malformed: true},
		{method: "DELETE", path: "/v1/sessions/t1234/no-such-session", status: 404},

		{method: "GET", path: "/v1/admin/tenants", status: 401},
		{method: "GET", path: "/v1/admin/tenants", header: admin, status: 200},
		{method: "GET", path: "/v1/admin/tenants/t1234", header: admin, status: 200},
		{method: "GET", path: "/v1/admin/tenants/ghost", header: admin, status: 404},
		{method: "PUT", path: "/v1/admin/tenants/newco", header: admin, body: `{"tier":"premium","overrides":[{"name":"user-requests","rate":"600/s"}]}`, status: 200},
		{method: "PUT", path: "/v1/admin/tenants/newco", header: admin, body: `{"tier":"platinum"}`, status: 400},
		{method: "PUT", path: "/v1/admin/tenants/newco", header: admin, body: `{"tier":1}`, status: 400, malformed: true},
		{method: "POST", path: "/v1/admin/tenants/newco/api-keys", header: admin, status: 201},
		{method: "POST", path: "/v1/admin/tenants/ghost/api-keys", header: admin, status: 404},
		{method: "DELETE", path: "/v1/admin/tenants/newco/api-keys/000000000000", header: admin, status: 404},
		{method: "DELETE", path: "/v1/admin/tenants/newco", header: admin, status: 204},
		{method: "DELETE", path: "/v1/admin/tenants/newco", header: admin, status: 404},
		{method: "GET", path: "/v1/admin/tiers", header: admin, status: 200},
		{method: "GET", path: "/v1/admin/tiers", status: 401},
		{method: "GET", path: "/v1/admin/tiers/free", header: admin, status: 200},
		{method: "GET", path: "/v1/admin/tiers/platinum", header: admin, status: 404},
		{method: "PUT", path: "/v1/admin/tiers/trial", header: admin, body: `{"rules":[{"name":"tenant-requests","scope":"tenant","algorithm":"fixed_window","limit":100,"window":"1m"}],"gateway":{"tenant_connections":5}}`, status: 200},
		{method: "PUT", path: "/v1/admin/tiers/trial", header: admin, body: `{"rules":[{"name":"r","scope":"tenant","algorithm":"token_bucket","rate":"1/s","burst":0}]}`, status: 400},
		{method: "GET", path: "/v1/admin/state?tenant=t1234&action=invoke-doc-summary-ai", header: admin, status: 200},
		{method: "GET", path: "/v1/admin/state?tenant=ghost", header: admin, status: 403},
		{method: "POST", path: "/v1/admin/reset", header: admin, body: `{"tenant":"tenant-1","action":"invoke-doc-summary-ai","rules":["doc-summaries"]}`, status: 200},
		{method: "POST", path: "/v1/admin/reset", header: admin, body: `{"tenant":"tenant-1","rule":"x"}`, status: 400, malformed: true},
		{method: "GET", path: "/v1/admin/usage?tenant=t1234", header: admin, status: 200},
		{method: "GET", path: "/v1/admin/usage?tenant=t1234&format=csv", header: admin, status: 200},
		{method: "GET", path: "/v1/admin/usage?tenant=t1234&from=yesterday", header: admin, status: 400},
		{method: "GET", path: "/v1/admin/usage", header: admin, status: 400, malformed: true},
		{method: "GET", path: "/v1/admin/dashboard", header: admin, status: 200},
		{method: "GET", path: "/v1/admin/dashboard?tenant=tenant-1", header: admin, status: 200},
		{method: "GET", path: "/v1/admin/dashboard", status: 401},
		{method: "POST", path: "/v1/admin/simulate", header: admin, body: `{"rules":["token_bucket rate=2/2s burst=5"],"pattern":"bursts n=2 every=1s","independent":true}`, status: 200},
		{method: "POST", path: "/v1/admin/simulate", header: admin, body: `{"tenant":"t1234","action":"search","format":"json"}`, status: 200},
		{method: "POST", path: "/v1/admin/simulate", header: admin, body: `{"rules":["token_bucket"]}`, status: 400},
		{method: "GET", path: "/", status: 200},
	} {
		do(c)
	}

	// Leases: take both slots of tenant-1's exports, renew, release.
	lease := apiCall{method: "POST", path: "/v1/leases", body: `{"tenant":"tenant-1","resource":"export","ttl_ms":5000}`, status: 201}
	id := field(do(lease), "lease_id")
	do(lease)
	lease.status = 429
	do(lease)
	do(apiCall{method: "POST", path: "/v1/leases", body: `{"tenant":"tenant-1","resource":"nothing-limits-this"}`, status: 404})
	do(apiCall{method: "PUT", path: "/v1/leases/" + url.PathEscape(id), status: 200})
	do(apiCall{method: "PUT", path: "/v1/leases/no-such-lease", status: 404})
	do(apiCall{method: "DELETE", path: "/v1/leases/" + url.PathEscape(id), status: 204})
	do(apiCall{method: "DELETE", path: "/v1/leases/" + url.PathEscape(id), status: 404})

	// API keys revoked one by one, never the last.
	keys := apiCall{method: "POST", path: "/v1/admin/tenants/tenant-3/api-keys", header: admin, status: 201}
	first, second := field(do(keys), "key_id"), field(do(keys), "key_id")
	do(apiCall{method: "DELETE", path: "/v1/admin/tenants/tenant-3/api-keys/" + first, header: admin, status: 204})
	do(apiCall{method: "DELETE", path: "/v1/admin/tenants/tenant-3/api-keys/" + second, header: admin, status: 409})

	// Bans and the heaviest callers.
	banID := field(do(apiCall{method: "POST", path: "/v1/admin/bans", header: admin, body: `{"scope":"ip","value":"192.0.2.200","ttl":"10m","reason":"openapi"}`, status: 201}), "id")
	do(apiCall{method: "POST", path: "/v1/admin/bans", header: admin, body: `{"scope":"session","value":"x","ttl":"10m"}`, status: 400, malformed: true})
	do(apiCall{method: "GET", path: "/v1/admin/bans", header: admin, status: 200})
	do(apiCall{method: "GET", path: "/v1/admin/bans", status: 401})
	do(apiCall{method: "GET", path: "/v1/admin/bans/" + banID, header: admin, status: 200})
	do(apiCall{method: "GET", path: "/v1/admin/bans/nope", header: admin, status: 404})
	do(apiCall{method: "POST", path: "/v1/check", body: `{"tenant":"t1234","ip":"192.0.2.200"}`, status: 429})
	do(apiCall{method: "DELETE", path: "/v1/admin/bans/" + banID, header: admin, status: 204})
	do(apiCall{method: "DELETE", path: "/v1/admin/bans/" + banID, header: admin, status: 404})
	do(apiCall{method: "DELETE", path: "/v1/admin/bans?source=admin", header: admin, status: 200})
	do(apiCall{method: "DELETE", path: "/v1/admin/bans", header: admin, status: 400})
	do(apiCall{method: "GET", path: "/v1/admin/top?rule=global-requests&window=5m", header: admin, status: 200})
	do(apiCall{method: "GET", path: "/v1/admin/top?rule=no-such-rule", header: admin, status: 404})
	do(apiCall{method: "GET", path: "/v1/admin/top?rule=global-requests&window=1h", header: admin, status: 400})

	// Sessions and the WebSocket upgrade.
	session := field(do(apiCall{method: "PUT", path: "/v1/sessions", body: `{"tenant":"t1234"}`, status: 201}), "session_id")
	q := "?tenant=t1234&session=" + url.QueryEscape(session)
	do(apiCall{method: "GET", path: "/v1/ws/preflight" + q, status: 200})
	do(apiCall{method: "GET", path: "/v1/ws" + q, status: 101, header: map[string]string{
		"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
	}})
	do(apiCall{method: "DELETE", path: "/v1/sessions/t1234/" + url.PathEscape(session), status: 204})

	// Redis is down: decisions fail open (the demo's on_error), saying
	// so, and the server is ready all the same; one with a rule that
	// fails closed is not.
	doAt(down.url, apiCall{method: "POST", path: "/v1/check", body: `{"tenant":"t1234"}`, status: 200})
	doAt(down.url, apiCall{method: "GET", path: "/readyz", status: 200})
	doAt(closed.url, apiCall{method: "GET", path: "/readyz", status: 503})
	doAt(down.url, apiCall{method: "GET", path: "/v1/admin/state?tenant=t1234", header: admin, status: 503})

	// Limitador's HTTP API. shop's per-user limit takes two GETs of a user
	// a minute. A client on loopback that reaches the server directly is
	// the platform's; one a proxy forwarded (X-Forwarded-For) needs a
	// service or the admin token, except for /status.
	forwarded := map[string]string{"X-Forwarded-For": "198.51.100.7"}
	forwardedService := map[string]string{"X-Forwarded-For": "198.51.100.7", "Authorization": "Bearer " + serviceToken}
	forwardedAdmin := map[string]string{"X-Forwarded-For": "198.51.100.7", "Authorization": "Bearer " + token}
	shop := func(user, more string) string {
		return `{"namespace":"shop","values":{"method":"GET","user":"` + user + `"},"delta":1` + more + `}`
	}
	draft03 := []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}
	ietf := []string{"RateLimit", "RateLimit-Policy"}
	tooMany := map[string]string{}
	for i := range 33 {
		tooMany[strconv.Itoa(i)] = "v"
	}
	tooManyValues, _ := json.Marshal(map[string]any{"namespace": "shop", "values": tooMany, "delta": 1})
	for _, c := range []apiCall{
		{method: "GET", path: "/status", status: 200},
		{method: "GET", path: "/status", header: forwarded, status: 200},
		{method: "GET", path: "/limits/shop", status: 200},
		{method: "GET", path: "/limits/shop%2Ftokens", header: forwardedService, status: 200},
		{method: "GET", path: "/limits/nothing", status: 200},
		{method: "GET", path: "/limits/shop", header: forwarded, status: 401},

		{method: "POST", path: "/check", body: shop("alice", ""), status: 200},
		{method: "POST", path: "/check_and_report", body: shop("alice", `,"response_headers":"DraftVersion03"`), status: 200, answerHeaders: draft03},
		{method: "POST", path: "/report", body: shop("alice", `,"future_field":true`), status: 200}, // alice: 2 of 2
		{method: "POST", path: "/check", body: shop("alice", ""), status: 429},
		{method: "POST", path: "/check_and_report", body: shop("alice", `,"response_headers":"DraftVersion03"`), status: 429, answerHeaders: draft03},
		{method: "POST", path: "/check_and_report", body: shop("alice", `,"response_headers":"IETF"`), status: 429, answerHeaders: ietf},
		{method: "POST", path: "/check_and_report", body: shop("bob", `,"response_headers":"IETF"`), header: forwardedService, status: 200, answerHeaders: ietf},
		{method: "POST", path: "/check_and_report", body: shop("bob", ""), status: 200},
		{method: "POST", path: "/report", body: shop("bob", ""), header: forwardedAdmin, status: 200}, // bob: 3 of 2, counted all the same
		{method: "POST", path: "/check_and_report", body: shop("bob", ""), status: 429},
		{method: "POST", path: "/check", body: `{"namespace":"nothing","values":{},"delta":1}`, status: 200},

		{method: "POST", path: "/check", body: `{"namespace":"shop","values":{}}`, status: 400, malformed: true},
		{method: "POST", path: "/check", body: `{"namespace":"shop","values":null,"delta":1}`, status: 400, malformed: true},
		{method: "POST", path: "/check", body: string(tooManyValues), status: 400, malformed: true},
		{method: "POST", path: "/check", body: shop("alice", ""), header: map[string]string{"Content-Type": "text/plain"}, status: 400, malformed: true},
		{method: "POST", path: "/report", body: `{"namespace":"shop","values":{"user":1},"delta":1}`, status: 400, malformed: true},
		{method: "POST", path: "/report", body: `{"namespace":"` + strings.Repeat("x", 70<<10) + `","values":{},"delta":1}`, status: 400, malformed: true},
		{method: "POST", path: "/check_and_report", body: `{"namespace":"shop","values":{},"delta":-1}`, status: 400, malformed: true},
		// Well formed, but the limit's variable fails on "abc".
		{method: "POST", path: "/check_and_report", body: `{"namespace":"shop/tokens","values":{"n":"abc"},"delta":1}`, status: 400},

		{method: "POST", path: "/check", body: shop("carol", ""), header: forwarded, status: 401},
		{method: "POST", path: "/report", body: shop("carol", ""), header: forwarded, status: 401},
		{method: "POST", path: "/check_and_report", body: shop("carol", ""), header: forwarded, status: 401},
		{method: "GET", path: "/counters/shop", header: forwarded, status: 401},
	} {
		doAt(lim.url, c)
	}
	var counters []struct {
		SetVariables map[string]string `json:"set_variables"`
		Remaining    int64             `json:"remaining"`
	}
	if err := json.Unmarshal(doAt(lim.url, apiCall{method: "GET", path: "/counters/shop", header: forwardedService, status: 200}), &counters); err != nil {
		t.Errorf("GET /counters/shop: %v", err)
	}
	users := map[string]int64{}
	for _, c := range counters {
		if u, ok := c.SetVariables["descriptors[0]['user']"]; ok {
			users[u] = c.Remaining
		}
	}
	if want := map[string]int64{"alice": 0, "bob": 0}; !maps.Equal(users, want) {
		t.Errorf("GET /counters/shop: per-user counters %v, want %v", users, want)
	}

	// Redis is down: the status and the limits need no store; the counters
	// and the decisions do, and fail as Limitador's do, whatever
	// store.on_error says: 503.
	doAt(limDown.url, apiCall{method: "GET", path: "/status", status: 200})
	doAt(limDown.url, apiCall{method: "GET", path: "/limits/shop", status: 200})
	doAt(limDown.url, apiCall{method: "GET", path: "/counters/shop", status: 503})
	for _, path := range []string{"/check", "/report", "/check_and_report"} {
		doAt(limDown.url, apiCall{method: "POST", path: path, body: shop("dave", ""), status: 503})
	}

	// Every operation was called, and answered with success and with an
	// error where the document has one.
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			key := method + " " + path
			got := seen[key]
			if len(got) == 0 {
				if !(strings.HasPrefix(path, "/v1/authz") && method != "GET" && method != "POST") {
					t.Errorf("%s was never called", key)
				}
				continue
			}
			hasError := slices.ContainsFunc(slices.Collect(mapsKeys(op.Responses.Map())), func(s string) bool { return s >= "400" })
			if hasError && !slices.ContainsFunc(got, func(s int) bool { return s >= 400 }) {
				t.Errorf("%s answered only %v: call it so that it fails too", key, got)
			}
			if !slices.ContainsFunc(got, func(s int) bool { return s < 300 }) {
				t.Errorf("%s answered only %v: call it so that it succeeds too", key, got)
			}
		}
	}
}

// servedSpec reads the OpenAPI document the server at urls[0] serves,
// checks that it is valid OpenAPI 3.1, and routes requests to urls.
func servedSpec(t *testing.T, urls ...string) (*openapi3.T, routers.Router) {
	t.Helper()
	resp, err := http.Get(urls[0] + "/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/yaml" {
		t.Fatalf("/openapi.yaml: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	doc, err := openapi3.NewLoader().LoadFromData(spec)
	if err != nil {
		t.Fatal(err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("document version %s, want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the document is not valid OpenAPI: %v", err)
	}
	for _, u := range urls {
		doc.Servers = append(doc.Servers, &openapi3.Server{URL: u})
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return doc, router
}

func operationKey(r *routers.Route) string { return r.Method + " " + r.Path }

// TestOpenAPICatchesDrift shows that the check of TestOpenAPI can fail: an
// answer with a field the document does not have is refused.
func TestOpenAPICatchesDrift(t *testing.T) {
	p := startAdmit(t)
	ctx := context.Background()
	_, router := servedSpec(t, p.url)
	req, _ := http.NewRequest("POST", p.url+"/v1/check", bytes.NewReader([]byte(`{"tenant":"t1234"}`)))
	route, params, err := router.FindRoute(req)
	if err != nil {
		t.Fatal(err)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	for _, c := range []struct {
		status int
		body   string
	}{
		{200, `{"allowed":true,"limit":1,"remaining":0,"reset_after_ms":0,"retry_after_ms":0,"denied_by":"","claim_id":"x","rules":[],"extra":1}`},
		{200, `{"allowed":"yes","limit":1,"remaining":0,"reset_after_ms":0,"retry_after_ms":0,"denied_by":"","claim_id":"x","rules":[]}`},
		{418, `{}`},
	} {
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: c.status,
			Header: http.Header{"Content-Type": {"application/json"}}, Options: &openapi3filter.Options{IncludeResponseStatus: true}}
		out.SetBodyBytes([]byte(c.body))
		if err := openapi3filter.ValidateResponse(ctx, out); err == nil {
			t.Errorf("%d %s fits the document", c.status, c.body)
		}
	}
}
