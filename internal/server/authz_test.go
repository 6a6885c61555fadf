package server

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/policy"
)

func authzSpec() *policy.Spec {
	return &policy.Spec{
		Global: []policy.RuleSpec{tb("per-ip", "ip", nil, "1/min", 2)},
		Tiers: map[string]policy.TierSpec{"small": {Rules: []policy.RuleSpec{
			tb("tenant-req", "tenant", nil, "1/min", 5),
			tb("uploads", "tenant", []string{"upload"}, "1/min", 1),
		}}},
		Tenants: map[string]policy.TenantSpec{
			"keyed": {Tier: "small", APIKeysSHA256: []string{policy.HashKey("secret-key")}},
		},
	}
}

func authz(t *testing.T, url string, headers ...string) (int, http.Header, string) {
	t.Helper()
	return send(t, "GET", url, headers...)
}

func send(t *testing.T, method, url string, headers ...string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func trustLoopback(t *testing.T) func(*Options) {
	return func(o *Options) {
		p, err := httplimit.ParseProxies([]string{"127.0.0.0/8", "::1"})
		if err != nil {
			t.Fatal(err)
		}
		o.HTTP.TrustedProxies = p
		o.HTTP.Actions = []httplimit.Action{{Pattern: "POST /files/", Name: "upload"}}
	}
}

// TestAuthzTraefik: the original request in X-Forwarded-*, the client in
// X-Forwarded-For of a trusted proxy.
func TestAuthzTraefik(t *testing.T) {
	h := start(t, authzSpec(), "", trustLoopback(t))
	client := func(ip string) []string {
		return []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/page?x=1", "X-Forwarded-For", "6.6.6.6, " + ip}
	}
	for i := range 2 {
		code, hdr, body := authz(t, h.url+"/v1/authz", client("198.51.100.7")...)
		if code != 200 || hdr.Get("RateLimit") == "" || hdr.Get("RateLimit-Policy") != `"per-ip";q=2;w=120` {
			t.Fatalf("request %d: %d %v %s", i, code, hdr, body)
		}
	}
	code, hdr, body := authz(t, h.url+"/v1/authz", client("198.51.100.7")...)
	if code != 429 || hdr.Get("Retry-After") == "" || !strings.Contains(body, `"denied_by":"per-ip"`) {
		t.Fatalf("3rd request of one client: %d %v %s", code, hdr, body)
	}
	// The client is the rightmost untrusted hop, not what it claims.
	if code, _, _ := authz(t, h.url+"/v1/authz", client("198.51.100.8")...); code != 200 {
		t.Fatalf("another client: %d", code)
	}
	// nginx: refusals as 403.
	if code, _, _ := authz(t, h.url+"/v1/authz?deny_status=403", client("198.51.100.7")...); code != 403 {
		t.Fatalf("deny_status=403: %d", code)
	}
	if code, _, body := authz(t, h.url+"/v1/authz?deny_status=500", client("198.51.100.7")...); code != 400 || !strings.Contains(body, "deny_status") {
		t.Fatalf("deny_status=500: %d %s", code, body)
	}
}

// TestAuthzUntrustedPeer: without trusted proxies X-Forwarded-For is
// ignored and the peer is the client.
func TestAuthzUntrustedPeer(t *testing.T) {
	h := start(t, authzSpec(), "")
	for i, ip := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.3"} {
		code, _, _ := authz(t, h.url+"/v1/authz", "X-Forwarded-For", ip)
		if want := map[bool]int{true: 200, false: 429}[i < 2]; code != want {
			t.Fatalf("spoofed client %s: %d, want %d (the peer's bucket)", ip, code, want)
		}
	}
}

// TestAuthzEnvoyAndKeys: Envoy's ext_authz sends the original method and
// path under the path prefix; an API key selects its tenant.
func TestAuthzEnvoyAndKeys(t *testing.T) {
	h := start(t, authzSpec(), "", trustLoopback(t))
	post := func(path string, headers ...string) (int, http.Header, string) {
		return send(t, "POST", h.url+path, headers...)
	}
	code, hdr, body := post("/v1/authz/files/a.txt", "X-API-Key", "secret-key", "X-Forwarded-For", "198.51.100.20")
	if code != 200 || !strings.Contains(hdr.Get("RateLimit-Policy"), `"uploads";q=1`) {
		t.Fatalf("first upload: %d %v %s", code, hdr, body)
	}
	code, _, body = post("/v1/authz/files/b.txt", "X-API-Key", "secret-key", "X-Forwarded-For", "198.51.100.21")
	if code != 429 || !strings.Contains(body, "uploads") {
		t.Fatalf("second upload: %d %s", code, body)
	}
	if code, _, _ := post("/v1/authz/files/b.txt", "X-API-Key", "not-a-key"); code != 401 {
		t.Fatalf("unknown key: %d", code)
	}
	if code, _, body := authz(t, h.url+"/v1/authz", "X-Forwarded-Uri", "no-slash"); code != 400 {
		t.Fatalf("bad X-Forwarded-Uri: %d %s", code, body)
	}
	if code, _, body := authz(t, h.url+"/v1/authz", "X-Forwarded-Method", "GE T"); code != 400 {
		t.Fatalf("bad X-Forwarded-Method: %d %s", code, body)
	}
	// The decisions show in the metrics.
	_, _, metrics := authz(t, h.url+"/metrics")
	if !strings.Contains(metrics, `admit_requests_total{endpoint="authz",result="refused"}`) {
		t.Fatal("authz decisions are not in /metrics")
	}
}
