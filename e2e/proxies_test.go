package e2e

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/admitdev/admit/policy"
)

// The forward-auth set-ups of docs/http.md, as files the docs print and
// these tests run: nginx (auth_request), Caddy (forward_auth) and HAProxy
// (a Lua action) in front of an app, asking admit serve about every
// request. Each names Admit at 127.0.0.1:8080, the app at 127.0.0.1:3000
// and listens on port 8000; the tests put their own addresses there.
const forwardAuthDir = "../deploy/forward-auth"

// proxyConfig is Admit's configuration behind proxy: it trusts the proxy
// on loopback, reads that proxy's headers and a user header, limits
// logins per client address across all tenants and comments per user of
// tenant acme, and has a shedding class header.
func proxyConfig(proxy string) string {
	return `version: 1
server:
  trusted_proxies: ["127.0.0.1"]
http:
  forward_auth: ` + proxy + `
  user_header: X-User-Id
  actions:
    - {match: "POST /login", action: login}
    - {match: "POST /comments", action: comment}
global:
  - {name: logins-per-ip, scope: ip, actions: [login], algorithm: fixed_window, limit: 2, window: 1h}
tiers:
  t:
    rules:
      - {name: comments-per-user, scope: user, actions: [comment], algorithm: fixed_window, limit: 2, window: 1h}
tenants:
  acme: {tier: t, api_keys_sha256: ["` + policy.HashKey("acme-key") + `"]}
shedding:
  - {name: app, classes: {header: X-Priority}}
`
}

// identityHeaders are the headers a client may send hoping Admit reads
// them as the proxy's word: the user header and the shedding class
// header, and their underscore spellings.
var identityHeaders = []string{"X-User-Id", "X-Priority", "X_User_Id", "X_Priority"}

// headerTap records the identity headers of the requests it passes on to
// a server: what Admit, or the app, was told.
type headerTap struct {
	mu   sync.Mutex
	seen []string
}

func (h *headerTap) record(r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for name, v := range r.Header {
		for _, id := range identityHeaders {
			if strings.EqualFold(name, id) {
				h.seen = append(h.seen, name+": "+strings.Join(v, ","))
			}
		}
	}
}

func (h *headerTap) headers() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.seen)
}

// tapAdmit serves a reverse proxy to Admit on loopback that records what
// reaches Admit, and returns its address. Admit trusts loopback, so the
// proxy in front and the tap are both trusted hops.
func tapAdmit(t *testing.T, admitURL string, tap *headerTap) string {
	t.Helper()
	u, err := url.Parse(admitURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tap.record(r)
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// snippet reads a file of deploy/forward-auth with the test's addresses
// in place of the documented ones.
func snippet(t *testing.T, name string, addrs map[string]string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(forwardAuthDir, name))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for from, to := range addrs {
		if !strings.Contains(s, from) {
			t.Fatalf("%s does not contain %q", name, from)
		}
		s = strings.ReplaceAll(s, from, to)
	}
	return s
}

// startProcess runs a proxy in the foreground, in a process group of its
// own, until the test ends (its group killed by the process's PID), and
// waits until it accepts connections on addr. Its output goes to a file,
// which workers it forks may hold open.
func startProcess(t *testing.T, addr string, env []string, name string, args ...string) {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found: the forward-auth tests run the real proxies (apt-get install nginx caddy haproxy; make deps does)", name)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	logPath := filepath.Join(t.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	out := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out())
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-done:
			t.Fatalf("%s exited: %s", name, out())
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not listen on %s within 15s", name, addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freePort returns a port free a moment ago on host.
func freePort(t *testing.T, host string) string {
	t.Helper()
	// Above the kernel's range for clients and port 0 (32768–60999 by
	// default), which any connection the tests make could take meanwhile.
	for range 100 {
		port := strconv.Itoa(61000 + rand.IntN(4500))
		if ln, err := net.Listen("tcp", net.JoinHostPort(host, port)); err == nil {
			ln.Close()
			return port
		}
	}
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// TestForwardAuthBehindRealProxies: nginx, Caddy and HAProxy run the
// configurations docs/http.md prints, in front of admit serve, and are
// driven from a network namespace — an honest client logging in, then the
// same client spoofing every header it could hope Admit believes: the
// original method and URI of each proxy's set (the attack nginx once let
// through), its own address in X-Forwarded-For, Forwarded and X-Real-IP,
// underscore spellings, repeated headers, and a header too large to carry;
// and, with a key of tenant acme, a user and a priority of its choosing
// (nginx and Caddy once passed the client's X-User-Id to Admit, which
// believed it). The per-address login limit holds, keyed by the client's
// address; no refused request reaches the app; the user the client names
// is charged nothing, and neither Admit nor the app ever sees the user or
// priority headers the client sent.
func TestForwardAuthBehindRealProxies(t *testing.T) {
	ns := newNetns(t)
	var reached atomic.Int64
	appTap := &headerTap{}
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		appTap.record(r)
		_, _ = io.WriteString(w, "app")
	})}
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = app.Serve(appLn) }()
	t.Cleanup(func() { app.Close() })

	for _, proxy := range []string{"nginx", "caddy", "haproxy"} {
		t.Run(proxy, func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), "admit.yaml")
			if err := os.WriteFile(cfg, []byte(proxyConfig(proxy)), 0o600); err != nil {
				t.Fatal(err)
			}
			admit := startAdmitEnv(t, []string{"ADMIT_ADMIN_TOKEN=proxies-token"}, "--config", cfg)
			admitTap := &headerTap{}
			admitAddr := tapAdmit(t, admit.url, admitTap)
			listen := ns.hostIP + ":" + freePort(t, ns.hostIP)
			dir := t.TempDir()
			switch proxy {
			case "nginx":
				site := snippet(t, "nginx.conf", map[string]string{"listen 8000;": "listen " + listen + ";", "127.0.0.1:8080": admitAddr, "127.0.0.1:3000": appLn.Addr().String()})
				writeTestFile(t, filepath.Join(dir, "site.conf"), site)
				// The main context nginx.conf needs around a server block.
				main := "user root;\nworker_processes 1;\nerror_log " + dir + "/error.log;\npid " + dir + "/nginx.pid;\nevents {}\nhttp {\n  access_log off;\n  client_body_temp_path " + dir + "/body;\n  proxy_temp_path " + dir + "/proxy;\n  include " + dir + "/site.conf;\n}\n"
				writeTestFile(t, filepath.Join(dir, "nginx.conf"), main)
				startProcess(t, listen, nil, "nginx", "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-g", "daemon off;")
			case "caddy":
				site := snippet(t, "Caddyfile", map[string]string{"http://:8000": "http://" + listen, "127.0.0.1:8080": admitAddr, "127.0.0.1:3000": appLn.Addr().String()})
				// Global options a test needs: no admin endpoint on :2019.
				writeTestFile(t, filepath.Join(dir, "Caddyfile"), "{\n\tadmin off\n}\n"+site)
				startProcess(t, listen, []string{"HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir}, "caddy", "run", "--config", filepath.Join(dir, "Caddyfile"), "--adapter", "caddyfile")
			case "haproxy":
				lua := filepath.Join(dir, "admit-authz.lua")
				writeTestFile(t, lua, snippet(t, "admit-authz.lua", map[string]string{"127.0.0.1:8080": admitAddr}))
				writeTestFile(t, filepath.Join(dir, "haproxy.cfg"), snippet(t, "haproxy.cfg", map[string]string{"bind :8000": "bind " + listen, "/etc/haproxy/admit-authz.lua": lua, "127.0.0.1:3000": appLn.Addr().String()}))
				startProcess(t, listen, nil, "haproxy", "-f", filepath.Join(dir, "haproxy.cfg"), "-db")
			}
			client := ns.client()
			url := "http://" + listen
			send := func(method, path string, headers ...string) (*http.Response, string) {
				t.Helper()
				req, _ := http.NewRequest(method, url+path, nil)
				for i := 0; i+1 < len(headers); i += 2 {
					req.Header.Add(headers[i], headers[i+1])
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatalf("%s %s through %s: %v", method, path, proxy, err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp, string(b)
			}
			before := reached.Load()
			// The honest client: two logins, then refused with the
			// wait and the limit's state.
			for i, want := range []int{200, 200, 429} {
				resp, body := send("POST", "/login")
				if resp.StatusCode != want {
					t.Fatalf("honest login %d: %d, want %d: %s", i, resp.StatusCode, want, body)
				}
				if want == 429 && (resp.Header.Get("Retry-After") == "" || !strings.Contains(resp.Header.Get("RateLimit"), `"logins-per-ip";r=0`)) {
					t.Errorf("a refusal without Retry-After or RateLimit: %v", resp.Header)
				}
			}
			// The hostile client: every spoof, alone and all at once.
			spoofs := [][]string{
				{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/static/a.css"},
				{"X-Original-Method", "GET", "X-Original-URI", "/static/a.css"},
				{"X-Original-Method", "GET", "X-Original-URI", "/static/a.css", "X-Original-Host", "other.example"},
				{"X-Forwarded-For", "198.51.100.77"},
				{"Forwarded", "for=198.51.100.77"},
				{"X-Real-IP", "198.51.100.77"},
				{"X_Forwarded_For", "198.51.100.77", "X_Original_URI", "/static/a.css"},
				{"X-Original-URI", "/static/a.css", "X-Original-URI", "/static/b.css", "X-Forwarded-For", "198.51.100.77", "X-Forwarded-For", "198.51.100.78"},
				{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/static/a.css", "X-Original-Method", "GET", "X-Original-URI", "/static/a.css",
					"X-Forwarded-For", "198.51.100.77", "Forwarded", "for=198.51.100.77", "X-Real-IP", "198.51.100.77", "X-Forwarded-Host", "other.example"},
			}
			for _, h := range spoofs {
				if resp, body := send("POST", "/login", h...); resp.StatusCode != 429 {
					t.Errorf("a login spoofing %v: %d, want 429: %.200s", h, resp.StatusCode, body)
				}
			}
			// The login path behind a leading "//", which the app squeezes
			// to /login: Admit read such an original URI as a host
			// ("login") and an empty path, of no action, and all passed.
			slashed := []string{"//login", "//login/", "//LOGIN", "//login.json", "//login;x"}
			for _, p := range slashed {
				if resp, body := send("POST", p); resp.StatusCode != 429 {
					t.Errorf("POST %s after 2 logins: %d, want 429: %.200s", p, resp.StatusCode, body)
				}
			}
			// A header too large for any proxy: refused there with a 4xx,
			// or the connection closed while the client still writes it
			// (HAProxy), never passed on.
			big, _ := http.NewRequest("POST", url+"/login", nil)
			big.Header.Set("X-Original-URI", strings.Repeat("a", 100<<10))
			if resp, err := client.Do(big); err == nil {
				resp.Body.Close()
				if resp.StatusCode < 400 || resp.StatusCode >= 500 {
					t.Errorf("a 100 KB header: %d, want a 4xx", resp.StatusCode)
				}
			}
			if got := reached.Load() - before; got != 2 {
				t.Errorf("the app was reached %d times, want only the 2 admitted logins", got)
			}
			// Other pages are not logins, and pass.
			if resp, body := send("GET", "/static/a.css"); resp.StatusCode != 200 || body != "app" {
				t.Errorf("GET /static/a.css: %d %q", resp.StatusCode, body)
			}
			// The limit is keyed by the client's address in the
			// namespace, not the proxy's.
			if left := remaining(t, admit.url, "action=login&ip="+ns.clientIP, "logins-per-ip"); left != 0 {
				t.Errorf("the login bucket of %s: %d left, want it used up", ns.clientIP, left)
			}
			// A client of acme names its user and priority: the proxy
			// clears both, so the victim's comments are not spent and
			// no user rule applies (believed, the third was 429).
			for i := range 3 {
				if resp, body := send("POST", "/comments", "X-API-Key", "acme-key", "X-User-Id", "victim", "X-Priority", "critical",
					"X_User_Id", "victim", "X_Priority", "critical"); resp.StatusCode != 200 {
					t.Errorf("comment %d naming user victim: %d, want 200 (no user, no per-user rule): %.200s", i, resp.StatusCode, body)
				}
			}
			if left := remaining(t, admit.url, "tenant=acme&user=victim&action=comment", "comments-per-user"); left != 2 {
				t.Errorf("the victim's comments: %d left, want 2: the client's X-User-Id reached the decision", left)
			}
			if seen := admitTap.headers(); len(seen) > 0 {
				t.Errorf("Admit was sent the client's own %q", seen)
			}
			if seen := appTap.headers(); len(seen) > 0 {
				t.Errorf("the app was sent the client's own %q", seen)
			}
			if !t.Failed() {
				t.Logf("%s: the client at %s was refused after 2 logins, through %d spoofs and %d spellings of //login; its user and priority reached neither Admit nor the app", proxy, ns.clientIP, len(spoofs), len(slashed))
			}
		})
	}
}

// remaining returns what is left of the bucket of rule among the buckets
// of admit serve's /v1/admin/state?query.
func remaining(t *testing.T, admitURL, query, rule string) int64 {
	t.Helper()
	req, _ := http.NewRequest("GET", admitURL+"/v1/admin/state?"+query, nil)
	req.Header.Set("Authorization", "Bearer proxies-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var state struct {
		Buckets []struct {
			Name      string `json:"name"`
			Remaining int64  `json:"remaining"`
		} `json:"buckets"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&state); err != nil {
		t.Fatal(err)
	}
	for _, b := range state.Buckets {
		if b.Name == rule {
			return b.Remaining
		}
	}
	t.Fatalf("no bucket %s in /v1/admin/state?%s: %+v", rule, query, state)
	return 0
}

// TestForwardAuthSnippetsInDocs: docs/http.md prints each configuration
// the proxies test runs, as it is in deploy/forward-auth.
func TestForwardAuthSnippetsInDocs(t *testing.T) {
	doc, err := os.ReadFile("../docs/http.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nginx.conf", "Caddyfile", "haproxy.cfg", "admit-authz.lua"} {
		b, err := os.ReadFile(filepath.Join(forwardAuthDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), strings.TrimSpace(string(b))) {
			t.Errorf("docs/http.md does not print %s as deploy/forward-auth has it", name)
		}
	}
}

func writeTestFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}
