package attack

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
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/proctest"
	"github.com/admitdev/admit/redistest"
)

// TestForwardAuthIgnoresClientHeaders: a client that reaches /v1/authz
// itself (not through the proxy the server is configured for) and names
// another original request in X-Forwarded-* or X-Original-* is decided as
// the request it made.
func TestForwardAuthIgnoresClientHeaders(t *testing.T) {
	cfg := suiteConfig + "http:\n  forward_auth: nginx\n  actions:\n    - {match: \"POST /login\", action: login}\n"
	s := serve(t, cfg, false)
	spoof := []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/static/a.css", "X-Original-Method", "GET", "X-Original-URI", "/static/a.css"}
	codes := make([]int, 4)
	for i := range codes {
		codes[i] = s.do("POST", "/v1/authz/login", "", spoof...).status
	}
	report(t, "answers to 4 spoofed logins (limit 2)", codes)
	if codes[2] != 429 || codes[3] != 429 {
		t.Errorf("spoofed logins: %v, want the third refused", codes)
	}
}

// TestConfigFilesBounded: a *.yaml name for /dev/zero in the watched
// envoyproxy/ratelimit directory is refused at start and at reload, rather
// than read without end.
func TestConfigFilesBounded(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink("/dev/zero", filepath.Join(dir, "zero.yaml")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, code := runAdmit(ctx, "serve", "--data-dir", t.TempDir(), "--http", proctest.FreeAddr(t), "--grpc", proctest.FreeAddr(t), "--envoy-config", dir)
	if code != 2 || !strings.Contains(out, "not a regular file") {
		t.Fatalf("started on /dev/zero: exit %d: %s", code, out)
	}
	good := t.TempDir()
	writeTo(t, filepath.Join(good, "rl.yaml"), "domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	s := serve(t, "", false, "--envoy-config", good, "--reload-interval", "50ms")
	before := s.Metric(t, "go_memstats_alloc_bytes_total")
	if err := os.Symlink("/dev/zero", filepath.Join(good, "zero.yaml")); err != nil {
		t.Fatal(err)
	}
	if !proctest.WaitFor(10*time.Second, func() bool {
		return strings.Contains(s.do("GET", "/readyz", "", "Authorization", "Bearer "+adminToken).raw, "not a regular file")
	}) {
		t.Fatal("the reload of a directory with /dev/zero in it was not refused")
	}
	// Bytes allocated, not held: no collection can hide a read of
	// /dev/zero, which would allocate until the process died.
	alloc := s.Metric(t, "go_memstats_alloc_bytes_total") - before
	report(t, "bytes allocated while reloads met /dev/zero", alloc)
	if alloc > 64<<20 {
		t.Errorf("%.0f bytes allocated while reloads met /dev/zero", alloc)
	}
}

// TestConfigFIFOs: a named pipe called *.yaml in the watched
// envoyproxy/ratelimit directory, or in the place of the configuration
// file, once blocked the reload that opened it for ever, silently (opening
// a pipe waits for a writer); at start, admit serve never started. It is
// refused, at start and at reload, as not a regular file, the refusal
// logged and shown by /readyz, and the server goes on answering.
func TestConfigFIFOs(t *testing.T) {
	fifo := func(path string) {
		t.Helper()
		if err := syscall.Mkfifo(path, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	fifo(filepath.Join(dir, "pipe.yaml"))
	cfgPipe := filepath.Join(t.TempDir(), "admit.yaml")
	fifo(cfgPipe)
	for _, args := range [][]string{{"--envoy-config", dir}, {"--config", cfgPipe}} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		out, code := runAdmit(ctx, append([]string{"serve", "--data-dir", t.TempDir(), "--http", proctest.FreeAddr(t), "--grpc", proctest.FreeAddr(t)}, args...)...)
		cancel()
		if code != 2 || !strings.Contains(out, "not a regular file") {
			t.Errorf("serve %s on a pipe: exit %d: %.300s", args, code, out)
		}
	}

	good := t.TempDir()
	writeTo(t, filepath.Join(good, "rl.yaml"), "domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	cfg := filepath.Join(t.TempDir(), "admit.yaml")
	writeTo(t, cfg, suiteConfig)
	httpAddr := proctest.FreeAddr(t)
	p := proctest.Start(t, admitBin, httpAddr, []string{"ADMIT_ADMIN_TOKEN=" + adminToken}, "serve", "--config", cfg, "--envoy-config", good,
		"--data-dir", t.TempDir(), "--http", httpAddr, "--grpc", proctest.FreeAddr(t), "--reload-interval", "50ms")
	s := &server{Proc: p, t: t}
	fifo(filepath.Join(good, "pipe.yaml"))
	pipe := filepath.Join(filepath.Dir(cfg), "pipe")
	fifo(pipe)
	if err := os.Rename(pipe, cfg); err != nil {
		t.Fatal(err)
	}
	if !proctest.WaitFor(10*time.Second, func() bool {
		a := s.do("GET", "/readyz", "", "Authorization", "Bearer "+adminToken)
		return strings.Count(a.raw, "not a regular file") == 2
	}) {
		t.Fatalf("the reloads of two pipes were not refused: %s", s.do("GET", "/readyz", "", "Authorization", "Bearer "+adminToken).raw)
	}
	for _, logged := range []string{"envoy configuration reload refused", "configuration reload refused; keeping the running configuration"} {
		// /readyz may tell of a refusal before the process's log line
		// has been read from its pipe.
		if !proctest.WaitFor(10*time.Second, func() bool { return strings.Contains(p.Output.String(), logged) }) {
			t.Errorf("not logged: %q", logged)
		}
	}
	if a := s.do("POST", "/v1/check", `{"tenant":"acme"}`, acme...); a.status != 200 {
		t.Errorf("a check after the pipes: %d %s", a.status, a.raw)
	}
}

// TestHalfWrittenConfig: a configuration file written in place, in two
// writes (a copy, an editor, scp), is caught half-written by a reload now
// and then; a half that parses — the file cut before its tenants — was
// applied (3 s of tenants=0, every key 401). A change is applied only once
// the file has stayed the same for --reload-settle: here the half is seen
// and left, however long the writer takes (the period is an hour, so no
// scheduler's speed matters); SIGHUP then applies the whole file, as an
// operator who knows it complete would. The period's timeline is
// TestSettling's, in cmd/admit.
func TestHalfWrittenConfig(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "admit.yaml")
	writeTo(t, cfg, suiteConfig)
	httpAddr := proctest.FreeAddr(t)
	p := proctest.Start(t, admitBin, httpAddr, []string{"ADMIT_ADMIN_TOKEN=" + adminToken}, "serve", "--config", cfg,
		"--data-dir", t.TempDir(), "--http", httpAddr, "--grpc", proctest.FreeAddr(t), "--reload-interval", "50ms", "--reload-settle", "1h")
	s := &server{Proc: p, t: t}
	// The new file differs from the running one (a larger tenant
	// bucket); its first half ends before tenants:.
	next := strings.Replace(suiteConfig, "burst: 200}", "burst: 300}", 1)
	cut := strings.Index(next, "tenants:")
	f, err := os.OpenFile(cfg, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(next[:cut]); err != nil {
		t.Fatal(err)
	}
	if !proctest.WaitFor(10*time.Second, func() bool {
		return strings.Contains(p.Output.String(), "the configuration file changed") || strings.Contains(p.Output.String(), "configuration reloaded")
	}) {
		t.Fatal("the server did not read the half-written file")
	}
	half := s.do("POST", "/v1/check", `{"cost":0}`, acme...)
	report(t, "acme's check while the file was half-written", half.status)
	if half.status != 200 {
		t.Errorf("acme's check while the file was half-written: %d %s", half.status, half.raw)
	}
	if _, err := f.WriteString(next[cut:]); err != nil {
		t.Fatal(err)
	}
	if err := p.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !proctest.WaitFor(10*time.Second, func() bool { return strings.Contains(p.Output.String(), "configuration reloaded") }) {
		t.Fatal("the whole file was not applied on SIGHUP")
	}
	if a := s.do("POST", "/v1/check", `{"cost":0}`, acme...); a.status != 200 || a.body["limit"] != float64(300) {
		t.Errorf("acme after the whole file: %d %s, want its limit of 300", a.status, a.raw)
	}
	reloads := strings.Count(p.Output.String(), "configuration reloaded")
	report(t, "reloads applied (the half never)", reloads)
	if reloads != 1 || strings.Contains(p.Output.String(), "tenants=0") {
		t.Errorf("%d reloads applied, want the whole file's alone:\n%s", reloads, p.Output)
	}
}

func writeTo(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestReflectionOff: the gRPC port does not list its services to whoever
// reaches it, unless --grpc-reflection says so.
func TestReflectionOff(t *testing.T) {
	for _, on := range []bool{false, true} {
		var args []string
		if on {
			args = []string{"--grpc-reflection"}
		}
		s := serve(t, "", false, args...)
		conn, err := grpc.NewClient(s.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
		if err == nil {
			// A stream the server ended says why on Recv; Send may only
			// see io.EOF.
			_ = stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
			_, err = stream.Recv()
		}
		cancel()
		conn.Close()
		if got := status.Code(err) == codes.Unimplemented; got == on {
			t.Errorf("--grpc-reflection %v: listing services answered %v", on, err)
		}
	}
}

// TestSlowBodies: clients that send a body's first bytes and then nothing
// hold neither admit proxy's connections nor the upstream's past
// --body-timeout: neither when their requests are admitted and forwarded,
// nor when they are refused before the body is read (no rule applies to an
// anonymous request: 401), where the server must close the connection
// rather than wait, without a deadline, for a body no one will read.
func TestSlowBodies(t *testing.T) {
	for _, tc := range []struct{ name, config string }{
		{"admitted", "version: 1\nglobal:\n  - {name: all, scope: global, algorithm: token_bucket, rate: 1/s, burst: 1000}\n"},
		{"refused", "version: 1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) { slowBodies(t, tc.config, tc.name == "admitted") })
	}
}

func slowBodies(t *testing.T, config string, forwarded bool) {
	var open, seen atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		open.Add(1)
		defer open.Add(-1)
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer up.Close()
	listen := proctest.FreeAddr(t)
	p := proctest.Start(t, admitBin, listen, nil, "proxy", "--listen", listen, "--upstream", up.URL, "--keys-optional",
		"--data-dir", t.TempDir(), "--body-timeout", "1s", "--config", writeFile(t, "admit.yaml", config))
	const clients = 50
	var wg sync.WaitGroup
	var held atomic.Int64
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", strings.TrimPrefix(p.URL, "http://"))
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			fmt.Fprint(conn, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nfirst")
			_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.ReadAll(conn); err != nil {
				held.Add(1) // still open when the client gave up
			}
		}()
	}
	wg.Wait()
	proctest.WaitFor(5*time.Second, func() bool { return open.Load() == 0 })
	report(t, "of 50 stalled bodies, connections held 20s", held.Load())
	report(t, "upstream requests still open after", open.Load())
	if held.Load() != 0 || open.Load() != 0 {
		t.Errorf("%d client connections held for 20s, %d upstream requests open", held.Load(), open.Load())
	}
	// (The start-up probe, admitted, reaches the upstream too.)
	if forwarded && seen.Load() < clients || !forwarded && seen.Load() != 0 {
		t.Errorf("%d requests reached the upstream, of %d; forwarded: %v", seen.Load(), clients, forwarded)
	}
}

// TestStalledRefusals: a refused request (unknown key 401, 429, shed 503,
// an LLM call's 401) whose declared body is small and stalls is answered
// and its connection closed at once, through admit proxy. net/http reads
// up to 256 KiB of a body the handler left unread, without a deadline,
// before it writes the response: 1,000 such connections from one address
// were held, unanswered, for as long as their clients liked. A refused
// request whose small body has come keeps its connection.
func TestStalledRefusals(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/held" {
			w.WriteHeader(200)
			http.NewResponseController(w).Flush()
			<-release // holds the shedding group's only slot
		}
	}))
	defer up.Close()
	defer close(release)
	cfg := `version: 1
http:
  actions:
    - {match: "POST /limited", action: limited}
    - {match: "/held", action: held}
llm:
  providers:
    openai: {base_url: "` + up.URL + `/v1", api_key: platform-key}
tiers:
  t:
    rules:
      - {name: limited, scope: tenant, actions: [limited], algorithm: fixed_window, limit: 1, window: 1h}
tenants:
  acme: {tier: t, api_keys_sha256: ["` + policy.HashKey("acme-key") + `"]}
shedding:
  - {name: app, actions: [held], algorithm: aimd, initial_limit: 1, min_limit: 1, max_limit: 1, tenant_share: 1.0, max_wait: 10ms}
`
	listen := proctest.FreeAddr(t)
	// --body-timeout of an hour: the connections must not wait for it.
	p := proctest.Start(t, admitBin, listen, nil, "proxy", "--listen", listen, "--upstream", up.URL,
		"--data-dir", t.TempDir(), "--body-timeout", "1h", "--config", writeFile(t, "admit.yaml", cfg))
	addr := strings.TrimPrefix(p.URL, "http://")
	send := func(path, key, body string) net.Conn {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\nContent-Length: 1000\r\n\r\n%s", path, key, body)
		return conn
	}
	// Spend the limit, and hold the slot.
	if c := send("/limited", "acme-key", strings.Repeat("x", 1000)); statusOn(t, c) != 200 {
		t.Fatal("the first request to /limited was not admitted")
	}
	held, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	fmt.Fprint(held, "GET /held HTTP/1.1\r\nHost: x\r\nX-API-Key: acme-key\r\n\r\n")
	if statusOn(t, held) != 200 {
		t.Fatal("the request holding the slot was not admitted")
	}

	kinds := []struct {
		name, path, key string
		want            int
	}{
		{"unknown key", "/upload", "bogus", 401},
		{"rate limited", "/limited", "acme-key", 429},
		{"shed", "/held", "acme-key", 503},
		{"LLM call, unknown key", "/v1/chat/completions", "bogus", 401},
	}
	const each = 250
	conns := make([][]net.Conn, len(kinds))
	for k, kind := range kinds {
		for range each {
			conns[k] = append(conns[k], send(kind.path, kind.key, "0123456789"))
		}
	}
	var wg sync.WaitGroup
	answered, closed := make([]atomic.Int64, len(kinds)), make([]atomic.Int64, len(kinds))
	for k, kind := range kinds {
		for _, c := range conns[k] {
			wg.Go(func() {
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
				br := bufio.NewReader(c)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == kind.want && resp.Close {
					answered[k].Add(1)
				}
				if _, err := br.ReadByte(); err == io.EOF {
					closed[k].Add(1)
				}
			})
		}
	}
	wg.Wait()
	for k, kind := range kinds {
		report(t, kind.name+": of 250 stalled refused requests, answered and closed", fmt.Sprintf("%d, %d", answered[k].Load(), closed[k].Load()))
		if answered[k].Load() != each || closed[k].Load() != each {
			t.Errorf("%s: of %d stalled requests, %d answered %d with Connection: close, %d closed within 20 s",
				kind.name, each, answered[k].Load(), kind.want, closed[k].Load())
		}
	}

	// admit serve's /v1/authz and admin API, refused the same way, answer
	// at once too (its read timeout, 15 s, bounded them).
	sv := serve(t, "", false)
	for path, want := range map[string]int{"/v1/authz": 401, "/v1/admin/simulate": 401, "/v1/admin/tenants": 405, "/v1/nothing": 404} {
		aconn, err := net.Dial("tcp", strings.TrimPrefix(sv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer aconn.Close()
		fmt.Fprintf(aconn, "POST %s HTTP/1.1\r\nHost: x\r\nX-API-Key: bogus\r\nContent-Length: 1000\r\n\r\n0123456789", path)
		_ = aconn.SetReadDeadline(time.Now().Add(10 * time.Second))
		abr := bufio.NewReader(aconn)
		if resp, err := http.ReadResponse(abr, nil); err != nil || resp.StatusCode != want || !resp.Close {
			t.Errorf("a stalled %s, refused: %v %v, want %d and Connection: close within 10 s", path, resp, err, want)
		} else {
			_, _ = io.Copy(io.Discard, resp.Body)
			if _, err := abr.ReadByte(); err != io.EOF {
				t.Errorf("the connection of a stalled %s was not closed: %v", path, err)
			}
		}
	}

	// A refused request whose body came whole keeps its connection: the
	// next request on it is answered.
	c := send("/upload", "bogus", strings.Repeat("x", 1000))
	defer c.Close()
	br := bufio.NewReader(c)
	for i := range 2 {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 401 || resp.Close {
			t.Fatalf("request %d on a connection whose refused requests sent their bodies: %v %v", i+1, resp, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nX-API-Key: bogus\r\nContent-Length: 3\r\n\r\nabc")
	}
}

// statusOn reads the response to the request sent on c and returns its
// status (0 for none within 10 s), leaving c open.
func statusOn(t *testing.T, c net.Conn) int {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	return resp.StatusCode
}

// TestWideLeases: a concurrency rule may allow 100,000 slots, but one
// lease takes at most bounds.MaxLeaseCost (1,000) of them: in Redis each
// slot is a member of a sorted set, and 60,000 at once held Redis for
// 130 ms (a ZADD of that many members had also failed in the middle of a
// commit, past Lua's unpack limit). The most one request may take is taken,
// renewed and released whole, in bounded time.
func TestWideLeases(t *testing.T) {
	srv := redistest.Start(t)
	cfg := "version: 1\nserver:\n  service_tokens: [\"" + serviceToken + "\"]\ntiers:\n  t:\n    rules:\n      - {name: slots, scope: tenant, actions: [batch], algorithm: concurrency, max: 100000, lease_ttl: 30s}\ntenants:\n  acme: {tier: t}\n"
	s := serve(t, cfg, false, "--store", "redis://"+srv.Addr)
	if a := s.do("POST", "/v1/leases", `{"tenant":"acme","resource":"batch","cost":60000}`, service...); a.status != 400 {
		t.Fatalf("a lease of 60,000 slots: %d %s", a.status, a.raw)
	}
	slotCommands := []string{"zadd", "zmscore", "zrem"}
	_, before, _ := redistest.ScriptStats(srv.Addr)
	commands := commandCalls(t, srv.Addr, slotCommands...)
	a := s.do("POST", "/v1/leases", `{"tenant":"acme","resource":"batch","cost":1000}`, service...)
	id, _ := a.body["lease_id"].(string)
	if a.status != 201 || strings.HasPrefix(id, "unheld-") {
		t.Fatalf("a lease of 1,000 slots: %d %s", a.status, a.raw)
	}
	if b := s.do("PUT", "/v1/leases/"+id, "", service...); b.status != 200 {
		t.Fatalf("renew: %d %s", b.status, b.raw)
	}
	if b := s.do("DELETE", "/v1/leases/"+id, "", service...); b.status != 204 {
		t.Fatalf("release: %d %s", b.status, b.raw)
	}
	_, after, _ := redistest.ScriptStats(srv.Addr)
	commands = commandCalls(t, srv.Addr, slotCommands...) - commands
	report(t, "Redis time to take, renew and release a lease of 1,000 slots (µs)", after-before)
	report(t, "sorted-set commands for it (250 members each)", commands)
	// 1,000 slots are 4 commands of 250 members to take, 8 to renew
	// (ZMSCORE, ZADD XX) and 8 to release (ZMSCORE, ZREM): a bound in
	// commands, which no machine's speed changes.
	if commands > 20 {
		t.Errorf("a lease of 1,000 slots cost %d sorted-set commands, want at most 20", commands)
	}
}

// TestStatsdLinesNotForged: the names admit ratelimit sends to statsd
// carry what gRPC clients chose (the domain of a request no file
// configures; the entries of a limit override), and a statsd line ends at
// a newline: a domain of "x\nforged:1000000|c" once made its own line.
// Every line the statsd server reads is one of Admit's counters, with the
// client's line breaks, colons and bars made underscores.
func TestStatsdLinesNotForged(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "rl", "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeTo(t, filepath.Join(root, "rl", "config", "rl.yaml"), "domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100}\n")
	httpAddr, grpcAddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
	host, port, _ := net.SplitHostPort(httpAddr)
	grpcHost, grpcPort, _ := net.SplitHostPort(grpcAddr)
	_, statsdPort, _ := net.SplitHostPort(ln.Addr().String())
	proctest.Start(t, admitBin, httpAddr, []string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=rl", "HOST=" + host, "PORT=" + port,
		"GRPC_HOST=" + grpcHost, "GRPC_PORT=" + grpcPort, "ADMIT_DATA_DIR=" + t.TempDir(),
		"STATSD_HOST=127.0.0.1", "STATSD_PORT=" + statsdPort, "STATS_FLUSH_INTERVAL=50ms"}, "ratelimit")

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	const forged = "\nforged.metric:1000000|c\n"
	for _, req := range []*rlsv3.RateLimitRequest{
		{Domain: "x" + forged + "y", Descriptors: []*rlext.RateLimitDescriptor{{Entries: []*rlext.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}},
		{Domain: "rl", Descriptors: []*rlext.RateLimitDescriptor{{
			Entries: []*rlext.RateLimitDescriptor_Entry{{Key: "k", Value: "v" + forged + "w"}},
			Limit:   &rlext.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE},
		}}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := client.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			t.Fatalf("domain %q: %v", req.Domain, err)
		}
	}

	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(20 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	line := regexp.MustCompile(`^[^\s:|]+:[0-9]+\|(c|ms)$`)
	lines := bufio.NewScanner(c)
	var seen []string
	for calls := 0; calls < 2; {
		if !lines.Scan() {
			t.Fatalf("statsd: %v after %q", lines.Err(), seen)
		}
		l := lines.Text()
		seen = append(seen, l)
		if !line.MatchString(l) || strings.HasPrefix(l, "forged") {
			t.Errorf("a forged statsd line: %q", l)
		}
		if n, ok := strings.CutPrefix(l, "ratelimit_server.ShouldRateLimit.total_requests:"); ok {
			v, _ := strconv.Atoi(strings.TrimSuffix(n, "|c"))
			calls += v
		}
	}
	report(t, "statsd lines read, none forged", len(seen))
	joined := strings.Join(seen, "\n")
	for _, want := range []string{"ratelimit.service.rate_limit.x_forged.metric_1000000_c_y.domain_not_found:1|c", "rl.k_v_forged.metric_1000000_c_w.total_hits:1|c"} {
		if !strings.Contains(joined, want) {
			t.Errorf("no line %q in %q", want, seen)
		}
	}
}
