package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/admitdev/admit/policy"
)

// authConfig: tenant open has no API keys, tenants keyed and other have
// one each; every tenant may do anything often, and take export leases.
func authConfig(t *testing.T) string {
	cfg := `version: 1
tiers:
  roomy:
    rules:
      - name: tenant-requests
        scope: tenant
        algorithm: token_bucket
        rate: 100/s
        burst: 1000
      - name: exports
        scope: tenant
        actions: [export]
        algorithm: concurrency
        max: 1000
tenants:
  open: {tier: roomy}
  keyed:
    tier: roomy
    api_keys_sha256: ["` + policy.HashKey("keyed-key") + `"]
  other:
    tier: roomy
    api_keys_sha256: ["` + policy.HashKey("other-key") + `"]
`
	path := filepath.Join(t.TempDir(), "admit.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAuthenticationRule: the one rule (docs/api.md#authentication) as one
// table, asked of every front end of admit serve and of admit proxy. Each
// front end answers "ok", "401" or "403" (gRPC UNAUTHENTICATED and
// PERMISSION_DENIED are 401 and 403); "" marks a case a front end cannot
// express (forward-auth and the proxy learn the tenant only from a key).
func TestAuthenticationRule(t *testing.T) {
	cfg := authConfig(t)
	srv := startServe(t, "--config", cfg, "--data-dir", t.TempDir())
	up := startUpstream(t)
	px := startCmd(t, "proxy", "--listen", "127.0.0.1:0", "--upstream", up.URL, "--config", cfg, "--data-dir", t.TempDir())
	rls := rlsClient(t, srv.grpc)

	post := func(path, body, key string) string {
		req, _ := http.NewRequest("POST", srv.url+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		return httpOutcome(t, req)
	}
	get := func(url, key string) string {
		req, _ := http.NewRequest("GET", url, nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		return httpOutcome(t, req)
	}
	tenantField := func(tenant string) string {
		if tenant == "" {
			return ""
		}
		return `"tenant":` + strconv.Quote(tenant) + `,`
	}
	// A session of each tenant, for the WebSocket preflight.
	sessions := map[string]string{}
	for tenant, key := range map[string]string{"open": "", "keyed": "keyed-key"} {
		req, _ := http.NewRequest("PUT", srv.url+"/v1/sessions", strings.NewReader(`{"tenant":"`+tenant+`"}`))
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var s struct {
			ID string `json:"session_id"`
		}
		err = json.NewDecoder(resp.Body).Decode(&s)
		resp.Body.Close()
		if resp.StatusCode != 201 || err != nil {
			t.Fatalf("session of %s: %d %v", tenant, resp.StatusCode, err)
		}
		sessions[tenant] = s.ID
	}

	frontEnds := []struct {
		name string
		ask  func(tenant, key string) string
	}{
		{"POST /v1/check", func(tenant, key string) string {
			return post("/v1/check", `{`+tenantField(tenant)+`"user":"u"}`, key)
		}},
		{"POST /v1/acquire", func(tenant, key string) string {
			return post("/v1/acquire", `{`+tenantField(tenant)+`"max_wait_ms":10}`, key)
		}},
		{"POST /v1/leases", func(tenant, key string) string {
			if tenant == "" && key == "" {
				return "" // a lease is always some tenant's
			}
			return post("/v1/leases", `{`+tenantField(tenant)+`"resource":"export","ttl_ms":1000}`, key)
		}},
		{"PUT /v1/sessions", func(tenant, key string) string {
			if tenant == "" {
				return "" // a session names its tenant
			}
			req, _ := http.NewRequest("PUT", srv.url+"/v1/sessions", strings.NewReader(`{"tenant":"`+tenant+`"}`))
			if key != "" {
				req.Header.Set("X-API-Key", key)
			}
			return httpOutcome(t, req)
		}},
		{"GET /v1/ws/preflight", func(tenant, key string) string {
			sid := sessions[tenant]
			if tenant == "" || sid == "" {
				return ""
			}
			return get(srv.url+"/v1/ws/preflight?tenant="+tenant+"&session="+sid, key)
		}},
		{"GET /v1/authz", func(tenant, key string) string {
			if tenant != "" {
				return ""
			}
			return get(srv.url+"/v1/authz/anything", key)
		}},
		{"admit proxy", func(tenant, key string) string {
			if tenant != "" {
				return ""
			}
			return get(px.url+"/echo", key)
		}},
		{"gRPC ShouldRateLimit", func(tenant, key string) string {
			d := &rlext.RateLimitDescriptor{}
			if tenant != "" {
				d.Entries = append(d.Entries, &rlext.RateLimitDescriptor_Entry{Key: "tenant", Value: tenant})
			}
			if key != "" {
				d.Entries = append(d.Entries, &rlext.RateLimitDescriptor_Entry{Key: "api_key", Value: key})
			}
			d.Entries = append(d.Entries, &rlext.RateLimitDescriptor_Entry{Key: "user", Value: "u"})
			_, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "admit", Descriptors: []*rlext.RateLimitDescriptor{d}})
			switch status.Code(err) {
			case codes.OK:
				return "ok"
			case codes.Unauthenticated:
				return "401"
			case codes.PermissionDenied:
				return "403"
			}
			t.Fatalf("gRPC %q %q: %v", tenant, key, err)
			return ""
		}},
	}
	for _, tc := range []struct {
		what, tenant, key, want string
	}{
		{"a tenant without keys, no key", "open", "", "ok"},
		{"a tenant without keys, an unknown key", "open", "wrongkey", "401"},
		{"a tenant with keys, no key", "keyed", "", "401"},
		{"a tenant with keys, an unknown key", "keyed", "wrongkey", "401"},
		{"a tenant with keys, its key", "keyed", "keyed-key", "ok"},
		{"a tenant with keys, another tenant's key", "keyed", "other-key", "403"},
		{"a tenant without keys, another tenant's key", "open", "other-key", "403"},
		{"no tenant, a known key (the key's tenant)", "", "keyed-key", "ok"},
		{"no tenant, an unknown key", "", "wrongkey", "401"},
	} {
		for _, fe := range frontEnds {
			want := tc.want
			if fe.name == "GET /v1/ws/preflight" && tc.key == "" {
				want = "ok" // the session is the credential: the tenant's key created it
			}
			got := fe.ask(tc.tenant, tc.key)
			if got != "" && got != want {
				t.Errorf("%s: %s: %s, want %s", fe.name, tc.what, got, want)
			}
		}
	}
}

// httpOutcome sends req and names its answer: "ok" for 2xx, else the status.
func httpOutcome(t *testing.T, req *http.Request) string {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		return "ok"
	}
	if resp.StatusCode == 401 && resp.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("%s %s: 401 without WWW-Authenticate", req.Method, req.URL.Path)
	}
	return strconv.Itoa(resp.StatusCode)
}
