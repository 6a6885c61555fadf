package attack

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit/proctest"
)

// TestActionSpellings: admit proxy limits POST /login to 2 per client
// address. The client then logs in as frameworks also route a login
// (Rails, Express, Spring, Servlet containers): a trailing slash, upper
// case, a ;parameter, a .json format, doubled slashes. Each is the login
// action, refused, and never reaches the upstream.
func TestActionSpellings(t *testing.T) {
	var reached atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			reached.Add(1)
		}
	}))
	defer up.Close()
	cfg := "version: 1\nhttp:\n  actions:\n    - {match: \"POST /login\", action: login}\n    - {match: \"/\", action: other}\n" +
		"global:\n  - {name: logins-per-ip, scope: ip, actions: [login], algorithm: fixed_window, limit: 2, window: 1h}\n" +
		"  - {name: all, scope: ip, algorithm: token_bucket, rate: 1/s, burst: 1000}\n"
	listen := proctest.FreeAddr(t)
	p := proctest.Start(t, admitBin, listen, nil, "proxy", "--listen", listen, "--upstream", up.URL, "--keys-optional",
		"--data-dir", t.TempDir(), "--config", writeFile(t, "admit.yaml", cfg))
	post := func(path string) int {
		req, _ := http.NewRequest("POST", p.URL+path, nil)
		resp, err := proctest.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 2 {
		if code := post("/login"); code != 200 {
			t.Fatalf("login %d: %d", i, code)
		}
	}
	spellings := []string{"/login/", "/LOGIN", "/Login", "/login;jsessionid=1", "/login.json", "/LOGIN.JSON/", "//login", "/a/../login", "/%4Cogin"}
	var passed []string
	for _, s := range spellings {
		if code := post(s); code != 429 {
			passed = append(passed, fmt.Sprintf("%s: %d", s, code))
		}
	}
	report(t, "of 9 spellings of POST /login after 2 logins, not refused", len(passed))
	if len(passed) > 0 || reached.Load() != 2 {
		t.Errorf("spellings of /login past its limit: %v; the upstream saw %d logins, want 2", passed, reached.Load())
	}
	if code := post("/logins"); code != 200 {
		t.Errorf("POST /logins, another path: %d", code)
	}
}

// TestProxyForwardsOnlyRequests: admit proxy forwards neither a CONNECT
// (a tunnel to a host of the client's choosing) nor the preface of
// HTTP/2 with prior knowledge, which an HTTP/1 port reads as "PRI *" (once
// both reached the upstream, as "CONNECT /" and "PRI /%2A"); neither costs
// a decision.
func TestProxyForwardsOnlyRequests(t *testing.T) {
	var reached []string
	var claims http.Header
	var mu sync.Mutex
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			mu.Lock()
			reached = append(reached, r.Method+" "+r.RequestURI)
			claims = r.Header.Clone()
			mu.Unlock()
		}
	}))
	defer up.Close()
	cfg := "version: 1\nhttp:\n  user_header: X-User-Id\n  actions:\n    - {match: \"/x\", action: any}\n" +
		"shedding:\n  - {name: all, classes: {header: X-Priority}}\n" +
		"global:\n  - {name: all, scope: ip, actions: [any], algorithm: fixed_window, limit: 1, window: 1h}\n"
	listen := proctest.FreeAddr(t)
	proctest.Start(t, admitBin, listen, nil, "proxy", "--listen", listen, "--upstream", up.URL, "--keys-optional",
		"--data-dir", t.TempDir(), "--config", writeFile(t, "admit.yaml", cfg))
	raw := func(req string) string {
		c, err := net.Dial("tcp", listen)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: %v", req, err)
		}
		resp.Body.Close()
		return resp.Status + " " + resp.Header.Get("Content-Type")
	}
	for req, want := range map[string]string{
		"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n": "501 Not Implemented application/problem+json",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n":                                    "505 HTTP Version Not Supported application/problem+json",
		"GET /x\\..\\login HTTP/1.1\r\nHost: app\r\n\r\n":                     "400 Bad Request application/problem+json",
		"GET /login%00 HTTP/1.1\r\nHost: app\r\n\r\n":                         "400 Bad Request application/problem+json",
		"TRACE /x HTTP/1.1\r\nHost: app\r\n\r\n":                              "501 Not Implemented application/problem+json",
	} {
		if got := raw(req); got != want {
			t.Errorf("%q: %s, want %s", strings.SplitN(req, "\r\n", 2)[0], got, want)
		}
	}
	// The one request the limit allows is still there: neither cost a
	// decision.
	// It carries what a client claims of itself, which the upstream must
	// not see from a peer that is no trusted proxy, and an upgrade to h2c,
	// which would take the connection's later requests past the limits.
	req := "GET /x HTTP/1.1\r\nHost: app\r\nX-User-Id: victim\r\nX-Priority: critical\r\nX-Real-IP: 10.9.9.9\r\n" +
		"True-Client-IP: 10.9.9.9\r\nX-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\n" +
		"X_Priority: critical\r\nX-HTTP-Method-Override: POST\r\nX-Forwarded-User: victim\r\nX-Tenant-Id: other\r\n" +
		"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
	if got := raw(req); !strings.HasPrefix(got, "200 ") {
		t.Errorf("GET /x after them: %s, want 200 (the limit of 1 untouched)", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reached) != 1 || reached[0] != "GET /x" {
		t.Errorf("the upstream saw %q, want only GET /x", reached)
	}
	for _, h := range []string{"X-User-Id", "X-Priority", "X_priority", "X-Real-Ip", "True-Client-Ip", "X-Original-Url", "X-Rewrite-Url",
		"X-Http-Method-Override", "X-Forwarded-User", "X-Tenant-Id", "Upgrade", "Http2-Settings"} {
		if v := claims[h]; len(v) > 0 {
			t.Errorf("the upstream got %s: %s from a client that is no trusted proxy", h, v)
		}
	}
}
