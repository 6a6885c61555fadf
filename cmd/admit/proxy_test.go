package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit/configtest"
	"github.com/admitdev/admit/policy"
)

const proxyKey = "ak_proxy_test_key"

// proxyConfig: tenant acme (with a key) may make 3 requests a minute;
// loopback is a trusted proxy.
func proxyConfig(t *testing.T) string {
	cfg := `version: 1
server:
  trusted_proxies: ["127.0.0.1/32"]
http:
  actions:
    - match: "GET /stream"
      action: stream
tiers:
  free:
    rules:
      - name: tenant-requests
        scope: tenant
        algorithm: token_bucket
        rate: 1/min
        burst: 3
      - name: streams
        scope: tenant
        actions: [stream]
        algorithm: token_bucket
        rate: 1/min
        burst: 10
tenants:
  acme:
    tier: free
    api_keys_sha256: ["` + policy.HashKey(proxyKey) + `"]
`
	path := filepath.Join(t.TempDir(), "admit.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// upstream is a real HTTP server: /echo says what it saw, /stream sends a
// first chunk and holds the rest until release, /ws upgrades and echoes.
type upstream struct {
	*httptest.Server
	hits    atomic.Int64
	release chan struct{}
}

func startUpstream(t *testing.T) *upstream {
	u := &upstream{release: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		w.Header().Set("X-Seen-XFF", r.Header.Get("X-Forwarded-For"))
		w.Header().Set("X-Seen-Underscore", strings.Join(r.Header["X_forwarded_for"], ","))
		_, _ = io.WriteString(w, "echo "+r.URL.RequestURI())
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		_, _ = io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		select {
		case <-u.release:
		case <-time.After(10 * time.Second):
		}
		_, _ = io.WriteString(w, "second\n")
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "want an upgrade", 400)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		line, err := brw.ReadString('\n')
		if err != nil {
			return
		}
		_, _ = brw.WriteString("echo: " + line)
		_ = brw.Flush()
	})
	u.Server = httptest.NewServer(mux)
	t.Cleanup(u.Close)
	return u
}

func get(t *testing.T, url string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestProxyEndToEnd(t *testing.T) {
	up := startUpstream(t)
	p := startCmd(t, "proxy", "--listen", "127.0.0.1:0", "--upstream", up.URL, "--config", proxyConfig(t), "--data-dir", t.TempDir())

	// No key, unknown key: 401, and the upstream never hears of it.
	if resp, _ := get(t, p.url+"/echo"); resp.StatusCode != 401 {
		t.Fatalf("no key: %d", resp.StatusCode)
	}
	if resp, _ := get(t, p.url+"/echo", "X-API-Key", "ak_wrong"); resp.StatusCode != 401 {
		t.Fatalf("unknown key: %d", resp.StatusCode)
	}
	if n := up.hits.Load(); n != 0 {
		t.Fatalf("the upstream got %d requests without a valid key", n)
	}

	// Admitted: forwarded, with RateLimit headers; the forwarding chain of
	// the trusted peer (loopback) is kept and extended.
	resp, body := get(t, p.url+"/echo?q=1", "X-API-Key", proxyKey, "X-Forwarded-For", "198.51.100.7", "X_Forwarded_For", "6.6.6.6")
	if resp.StatusCode != 200 || body != "echo /echo?q=1" || !strings.HasPrefix(resp.Header.Get("RateLimit"), `"tenant-requests";r=2;t=60;pk=:`) {
		t.Fatalf("admitted: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if xff := resp.Header.Get("X-Seen-XFF"); xff != "198.51.100.7, 127.0.0.1" {
		t.Fatalf("upstream saw X-Forwarded-For %q", xff)
	}
	if u := resp.Header.Get("X-Seen-Underscore"); u != "" {
		t.Fatalf("upstream saw X_Forwarded_For %q", u)
	}

	// Streaming: the first chunk arrives while the upstream still holds
	// the second.
	req, _ := http.NewRequest("GET", p.url+"/stream", nil)
	req.Header.Set("X-API-Key", proxyKey)
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(sresp.Body)
	first := make(chan string, 1)
	go func() { l, _ := br.ReadString('\n'); first <- l }()
	select {
	case l := <-first:
		if l != "first\n" {
			t.Fatalf("first chunk %q", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first chunk did not stream through")
	}
	close(up.release)
	if rest, _ := io.ReadAll(br); string(rest) != "second\n" {
		t.Fatalf("rest of the stream %q", rest)
	}
	sresp.Body.Close()

	// WebSocket upgrade passes through, both ways.
	conn, err := net.Dial("tcp", strings.TrimPrefix(p.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nX-API-Key: "+proxyKey+"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	cr := bufio.NewReader(conn)
	wsResp, err := http.ReadResponse(cr, nil)
	if err != nil || wsResp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", wsResp, err)
	}
	_, _ = io.WriteString(conn, "hello\n")
	if l, err := cr.ReadString('\n'); l != "echo: hello\n" {
		t.Fatalf("through the upgraded connection: %q %v", l, err)
	}

	// The tenant's 3 are spent (echo, stream, ws): refused, never forwarded.
	before := up.hits.Load()
	resp, body = get(t, p.url+"/echo", "Authorization", "Bearer "+proxyKey)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "tenant-requests") {
		t.Fatalf("4th request: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if up.hits.Load() != before {
		t.Fatal("a refused request reached the upstream")
	}
}

func TestProxyKeysOptionalAndUpstreamDown(t *testing.T) {
	up := startUpstream(t)
	p := startCmd(t, "proxy", "--listen", "127.0.0.1:0", "--upstream", up.URL, "--keys-optional", "--data-dir", t.TempDir())
	if resp, body := get(t, p.url+"/echo"); resp.StatusCode != 200 || body != "echo /echo" {
		t.Fatalf("anonymous with --keys-optional: %d %s", resp.StatusCode, body)
	}
	up.Close()
	if resp, body := get(t, p.url+"/echo"); resp.StatusCode != 502 || !strings.Contains(body, "upstream") {
		t.Fatalf("upstream down: %d %s", resp.StatusCode, body)
	}
}

func TestProxyFlags(t *testing.T) {
	for _, args := range [][]string{
		{"proxy"},
		{"proxy", "--upstream", "ftp://x"},
		{"proxy", "--upstream", "http://"},
	} {
		var stderr lockedBuffer
		if code := run(t.Context(), args, &env{stdout: io.Discard, stderr: &stderr, getenv: func(string) string { return "" }}); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
		if !strings.Contains(stderr.String(), "upstream") {
			t.Errorf("%v: %s", args, stderr.String())
		}
	}
}

// TestProxyRefusesUnreachableActions: for admit proxy, whose actions come
// only from http.actions routes, a rule naming an action no route produces
// is refused with its position (testdata/invalid-proxy), at start and on
// reload; the same file is valid for admit serve, whose callers name any
// action.
func TestProxyRefusesUnreachableActions(t *testing.T) {
	configtest.Check(t, "testdata/invalid-proxy/*.yaml", 1, func(f string) error {
		c, err := LoadConfig(f)
		if err != nil {
			t.Fatalf("%s is valid for admit serve: %v", f, err)
		}
		_, err = c.CheckProxyActions()
		return err
	})
	up := startUpstream(t)
	var stderr lockedBuffer
	code := run(context.Background(), []string{"proxy", "--listen", "127.0.0.1:0", "--upstream", up.URL,
		"--config", "testdata/invalid-proxy/action_no_route.yaml", "--data-dir", t.TempDir()},
		&env{stdout: io.Discard, stderr: &stderr, getenv: func(string) string { return "" }})
	if code != 2 || !strings.Contains(stderr.String(), `action "reports" is produced by no http.actions route`) {
		t.Fatalf("proxy started on an unreachable action: exit %d: %s", code, stderr.String())
	}
}

// TestProxyShedding: admit proxy with a shedding group of one slot: while
// the upstream holds it, the next request is answered 503 with
// Retry-After without reaching the upstream, and --metrics says so.
func TestProxyShedding(t *testing.T) {
	release := make(chan struct{})
	var reached atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		if r.URL.Path == "/slow" {
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer up.Close()
	defer close(release)
	cfg := filepath.Join(t.TempDir(), "admit.yaml")
	// A global rule that never refuses: with none, an anonymous request
	// would be refused (no rule would limit it) before shedding.
	writeFile(t, cfg, "version: 1\nglobal:\n  - {name: all, scope: global, algorithm: token_bucket, rate: 1/s, burst: 1000}\n"+
		"shedding:\n  - name: api\n    algorithm: aimd\n    initial_limit: 1\n    min_limit: 1\n    max_limit: 1\n    max_wait: 20ms\n")
	metricsAddr := freeAddr(t)
	p := startCmd(t, "proxy", "--listen", "127.0.0.1:0", "--upstream", up.URL, "--config", cfg, "--keys-optional",
		"--data-dir", t.TempDir(), "--metrics", metricsAddr)
	go func() { _, _ = http.Get(p.url + "/slow") }()
	for deadline := time.Now().Add(10 * time.Second); reached.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the slow request never reached the upstream")
		}
	}
	resp, err := http.Get(p.url + "/fast")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || reached.Load() != 1 {
		t.Fatalf("at the limit: %d, Retry-After %q, upstream reached %d times: %s", resp.StatusCode, resp.Header.Get("Retry-After"), reached.Load(), body)
	}
	resp, err = http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`admit_shed_limit{group="api"} 1`, `admit_shed_in_flight{group="api"} 1`, `admit_shed_held{group="api"} 0`,
		`admit_shed_requests_total{class="default",group="api",result="shed"} 1`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %s:\n%s", want, m)
		}
	}
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestVersionAndHealthcheck: admit version names the Go version; admit
// healthcheck exits 0 against a serving server and 1 against none.
func TestVersionAndHealthcheck(t *testing.T) {
	var out strings.Builder
	if code := run(context.Background(), []string{"version"}, &env{stdout: &out, stderr: io.Discard, getenv: os.Getenv}); code != 0 || !strings.HasPrefix(out.String(), "admit ") || !strings.Contains(out.String(), "go1.") {
		t.Fatalf("admit version: %d %q", code, out.String())
	}
	s := startServe(t, "--data-dir", t.TempDir())
	e := &env{stdout: io.Discard, stderr: io.Discard, getenv: os.Getenv}
	if code := run(context.Background(), []string{"healthcheck", "--url", s.url + "/healthz"}, e); code != 0 {
		t.Fatalf("healthcheck of a serving server: %d", code)
	}
	if code := run(context.Background(), []string{"healthcheck", "--url", "http://" + freeAddr(t) + "/healthz"}, e); code != 1 {
		t.Fatalf("healthcheck of nothing: %d", code)
	}
}

// TestProxySlowBody: a client that sends a body's first bytes and then
// nothing is cut off after --body-timeout, not held (with a connection to
// the upstream) for as long as it likes; a body that keeps coming passes.
func TestProxySlowBody(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%d %v", n, err)
	}))
	defer up.Close()
	p := startCmd(t, "proxy", "--listen", "127.0.0.1:0", "--upstream", up.URL, "--keys-optional", "--data-dir", t.TempDir(), "--body-timeout", "1s")
	conn, err := net.Dial("tcp", strings.TrimPrefix(p.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nfirst bytes"); err != nil {
		t.Fatal(err)
	}
	// The client stalls for far longer than the timeout: the proxy must
	// answer or close before this deadline.
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	start := time.Now()
	resp, _ := io.ReadAll(conn)
	if time.Since(start) >= 20*time.Second {
		t.Fatalf("a stalled body held the connection for 20s: %q", resp)
	}
	// A body sent in pieces without pausing passes whole.
	pr, pw := io.Pipe()
	go func() {
		for range 5 {
			_, _ = pw.Write(make([]byte, 1000))
		}
		pw.Close()
	}()
	r, err := http.Post(p.url+"/upload", "application/octet-stream", pr)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != 200 || string(b) != "5000 <nil>" {
		t.Fatalf("a steady body: %d %q", r.StatusCode, b)
	}
}
