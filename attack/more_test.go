package attack

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

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
	if !proctest.WaitFor(10*time.Second, func() bool { return strings.Contains(s.do("GET", "/readyz", "").raw, "not a regular file") }) {
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

// TestWideLeases: a concurrency rule may allow 100,000 slots, but one
// lease takes at most admit.MaxLeaseCost (1,000) of them: in Redis each
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
