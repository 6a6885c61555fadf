package server

import (
	"io"
	"net/http"
	"regexp"
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

// behind names the proxy in front of /v1/authz (Options.ForwardAuth).
func behind(proxy string) func(*Options) {
	return func(o *Options) { o.ForwardAuth = proxy }
}

// TestAuthzTraefik: the original request in X-Forwarded-*, the client in
// X-Forwarded-For of a trusted proxy.
func TestAuthzTraefik(t *testing.T) {
	h := start(t, authzSpec(), "", trustLoopback(t), behind("traefik"))
	client := func(ip string) []string {
		return []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/page?x=1", "X-Forwarded-For", "6.6.6.6, " + ip}
	}
	for i := range 2 {
		code, hdr, body := authz(t, h.url+"/v1/authz", client("198.51.100.7")...)
		if code != 200 || hdr.Get("RateLimit") == "" || !regexp.MustCompile(`^"per-ip";q=2;w=120;pk=:[A-Za-z0-9+/]{12}:$`).MatchString(hdr.Get("RateLimit-Policy")) {
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
	if code, _, body := authz(t, h.url+"/v1/authz", "X-Forwarded-Uri", "no-slash"); code != 200 {
		t.Fatalf("X-Forwarded-Uri to a server behind Envoy, which sends none: %d %s", code, body)
	}
	traefik := start(t, authzSpec(), "", trustLoopback(t), behind("traefik"))
	if code, _, body := authz(t, traefik.url+"/v1/authz", "X-Forwarded-Uri", "no-slash"); code != 400 {
		t.Fatalf("bad X-Forwarded-Uri: %d %s", code, body)
	}
	if code, _, body := authz(t, traefik.url+"/v1/authz", "X-Forwarded-Method", "GE T"); code != 400 {
		t.Fatalf("bad X-Forwarded-Method: %d %s", code, body)
	}
	// The decisions show in the metrics.
	_, _, metrics := authz(t, h.url+"/metrics")
	if !strings.Contains(metrics, `admit_requests_total{endpoint="authz",result="refused"}`) {
		t.Fatal("authz decisions are not in /metrics")
	}
}

// TestAuthzReadsOnlyItsProxysHeaders: the original method and URI come
// from the headers of the proxy the server is configured for, and only
// from a trusted peer. Every proxy passes the client's own headers through
// to the auth request and sets only its own set, so a client behind nginx
// that adds X-Forwarded-Uri: /static/a.css must still be decided as the
// POST /login it made.
func TestAuthzReadsOnlyItsProxysHeaders(t *testing.T) {
	spec := authzSpec()
	spec.Global = append(spec.Global, policy.RuleSpec{Name: "logins", Scope: "ip", Actions: []string{"upload"},
		Algorithm: "fixed_window", Limit: n(1), Window: "1h"})
	spoof := []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/static/a.css", "X-Original-Method", "GET", "X-Original-URI", "/static/a.css"}
	for _, tc := range []struct {
		proxy   string
		trusted bool
		honest  []string // how the proxy names POST /files/x
	}{
		{"nginx", true, []string{"X-Original-Method", "POST", "X-Original-URI", "/files/x"}},
		{"haproxy", true, []string{"X-Original-Method", "POST", "X-Original-URI", "/files/x"}},
		{"traefik", true, []string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/files/x"}},
		{"caddy", true, []string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/files/x"}},
		{"envoy", true, nil},
		{"nginx", false, nil}, // an untrusted peer's headers are not read
	} {
		opts := []func(*Options){behind(tc.proxy), trustLoopback(t)}
		if !tc.trusted {
			opts = []func(*Options){behind(tc.proxy), func(o *Options) {
				o.HTTP.Actions = []httplimit.Action{{Pattern: "POST /files/", Name: "upload"}}
			}}
		}
		h := start(t, spec, "", opts...)
		path := "/v1/authz"
		if tc.honest == nil {
			path = "/v1/authz/files/x" // the original request is the request itself
		}
		// The proxy's own headers win over a client's spoofed ones,
		// which a real proxy passes along; here the client's come
		// first and the proxy's set replaces them, as proxy_set_header
		// does.
		hdr := append(append([]string{"X-Forwarded-For", "198.51.100.9"}, spoof...), tc.honest...)
		req, _ := http.NewRequest("POST", h.url+path, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		for i, want := range []int{200, 429, 429} {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("%s (trusted %v): request %d with spoofed original headers: %d, want %d (decided as POST /files/x)", tc.proxy, tc.trusted, i, resp.StatusCode, want)
			}
		}
	}
}

// TestAuthzUserHeaderOnlyFromItsProxy: the user header is read only when
// http.forward_auth names the proxy that asks (whose configuration sets or
// clears it), and only from a trusted peer. A proxy nobody named may pass
// the client's own header, and a client that names its user could spend
// another user's limit, or take a fresh one at every request.
func TestAuthzUserHeaderOnlyFromItsProxy(t *testing.T) {
	spec := authzSpec()
	spec.Tiers["small"].Rules[0] = tb("per-user", "user", nil, "1/min", 1) // and no limit without a user
	for _, tc := range []struct {
		proxy    string
		trusted  bool
		believed bool
	}{
		{"", true, false},
		{"nginx", true, true},
		{"envoy", true, true},
		{"caddy", false, false},
	} {
		opts := []func(*Options){behind(tc.proxy), func(o *Options) { o.HTTP.UserHeader = "X-User-Id" }}
		if tc.trusted {
			opts = append(opts, trustLoopback(t))
		}
		h := start(t, spec, "", opts...)
		var codes []int
		for i := range 2 {
			// From a new address each time: only the user's rule can
			// refuse.
			code, _, _ := authz(t, h.url+"/v1/authz/x", "X-API-Key", "secret-key", "X-User-Id", "victim",
				"X-Forwarded-For", "198.51.100."+string(rune('1'+i)), "X-Original-URI", "/x", "X-Forwarded-Uri", "/x")
			codes = append(codes, code)
		}
		// Believed, the victim's limit of 1 refuses the second request;
		// ignored, no user rule applies.
		if want := map[bool]int{true: 429, false: 200}[tc.believed]; codes[1] != want {
			t.Errorf("forward_auth %q (trusted %v): %v for two requests naming user victim, want the second %d", tc.proxy, tc.trusted, codes, want)
		}
	}
}

// TestAuthzOriginalURIIsAPath: the original URI a proxy sends is a
// request-target, a path: "//login" is the path "//login", which the app
// behind squeezes to /login, and so the login action. Read as a URI
// reference it was the host "login" with an empty path, of no action, and
// POST //login passed the per-address login limit through nginx, Caddy
// and HAProxy. Envoy's path under /v1/authz is read the same way, not
// redirected to the path ServeMux would clean.
func TestAuthzOriginalURIIsAPath(t *testing.T) {
	spec := authzSpec()
	spec.Global = []policy.RuleSpec{{Name: "logins", Scope: "ip", Actions: []string{"login"},
		Algorithm: "fixed_window", Limit: n(2), Window: "1h"}}
	logins := func(o *Options) {
		o.HTTP.Actions = []httplimit.Action{{Pattern: "POST /login", Name: "login"}}
	}
	noRedirects := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	spellings := []string{"//login", "//login/", "//LOGIN", "//login.json", "//login;x", "///login", "//login?next=/", "/a//..//login"}
	for _, proxy := range []string{"nginx", "haproxy", "traefik", "caddy", "envoy"} {
		h := start(t, spec, "", trustLoopback(t), logins, behind(proxy))
		ask := func(uri string) int {
			path, hdr := "/v1/authz", []string{"X-Original-Method", "POST", "X-Original-URI", uri}
			switch proxy {
			case "traefik", "caddy":
				hdr = []string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", uri}
			case "envoy":
				path, hdr = "/v1/authz"+uri, nil
			}
			req, _ := http.NewRequest("POST", h.url+path, nil)
			for i := 0; i+1 < len(hdr); i += 2 {
				req.Header.Set(hdr[i], hdr[i+1])
			}
			req.Header.Set("X-Forwarded-For", "198.51.100.30")
			resp, err := noRedirects.Do(req) // a proxy asking follows none
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 && resp.StatusCode != 429 {
				t.Errorf("%s: POST %s: %d %s", proxy, uri, resp.StatusCode, resp.Header.Get("Location"))
			}
			return resp.StatusCode
		}
		for i := range 2 {
			if code := ask("/login"); code != 200 {
				t.Fatalf("%s: login %d: %d", proxy, i+1, code)
			}
		}
		for _, uri := range spellings {
			if code := ask(uri); code != 429 {
				t.Errorf("%s: POST %s after 2 logins: %d, want 429 (the login action)", proxy, uri, code)
			}
		}
		if code := ask("//static/a.css"); code != 200 {
			t.Errorf("%s: POST //static/a.css: %d, want 200 (no login)", proxy, code)
		}
	}
}
