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

// anyone is a configuration under which admit proxy admits anonymous
// requests (--keys-optional) against a bucket far from empty.
const anyone = "version: 1\nglobal:\n  - {name: all, scope: global, algorithm: token_bucket, rate: 1/s, burst: 100000}\n"

// TestUpgradeHeaderDoesNotSwitchSheddingOff: admit proxy protects an
// upstream with a concurrency limit of 2. Clients that add "Upgrade:
// websocket" to ordinary requests (alone, or with Connection: Upgrade,
// which the upstream does not grant) once all reached it, 20 of 20: now
// 2 do and 18 are shed. Real WebSockets the upstream upgrades count too:
// two open ones hold both slots until they close.
func TestUpgradeHeaderDoesNotSwitchSheddingOff(t *testing.T) {
	var cur, most atomic.Int64
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/ws" && strings.EqualFold(r.Header.Get("Upgrade"), "websocket"):
			w.Header().Set("Connection", "Upgrade")
			w.Header().Set("Upgrade", "websocket")
			w.WriteHeader(http.StatusSwitchingProtocols)
			conn, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			_, _ = io.Copy(conn, rw) // an echo until the client closes
		case r.URL.Path == "/slow":
			n := cur.Add(1)
			defer cur.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-release
		}
	}))
	defer up.Close()
	cfg := anyone + "shedding:\n  - {name: app, algorithm: aimd, initial_limit: 2, min_limit: 2, max_limit: 2, max_wait: 20ms, classes: {default: critical}}\n"
	listen := proctest.FreeAddr(t)
	p := proctest.Start(t, admitBin, listen, nil, "proxy", "--listen", listen, "--upstream", up.URL, "--keys-optional",
		"--data-dir", t.TempDir(), "--config", writeFile(t, "admit.yaml", cfg))
	defer close(release) // before the upstream closes: no request is left waiting

	get := func(path string, hdr ...string) int {
		req, _ := http.NewRequest("GET", p.URL+path, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := proctest.Client.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	const clients = 20
	var answered, shed atomic.Int64
	var wg sync.WaitGroup
	for i := range clients {
		hdr := []string{"Upgrade", "websocket"}
		if i%2 == 1 {
			hdr = append(hdr, "Connection", "Upgrade")
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if get("/slow", hdr...) == http.StatusServiceUnavailable {
				shed.Add(1)
			}
			answered.Add(1)
		}()
	}
	// Those past the limit are answered at once; the upstream holds the
	// others until the end.
	proctest.WaitFor(10*time.Second, func() bool { return answered.Load() >= clients-2 })
	report(t, "of 20 requests claiming an upgrade, at the upstream at once (limit 2)", most.Load())
	report(t, "of 20 requests claiming an upgrade, shed", shed.Load())
	if most.Load() > 2 || shed.Load() != clients-2 {
		t.Errorf("%d requests claiming an upgrade reached the upstream at once, %d were shed; want at most 2, and 18", most.Load(), shed.Load())
	}
	for range 2 {
		release <- struct{}{}
	}
	wg.Wait()

	// Two WebSockets upgraded: they hold both slots while open.
	var conns []net.Conn
	for range 2 {
		conn, err := net.Dial("tcp", listen)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprint(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("a WebSocket upgrade: %v %v", resp, err)
		}
		conns = append(conns, conn)
	}
	if code := get("/fast"); code != http.StatusServiceUnavailable {
		t.Errorf("a request beside 2 open WebSockets at a limit of 2: %d, want 503", code)
	}
	for _, c := range conns {
		c.Close()
	}
	if !proctest.WaitFor(10*time.Second, func() bool { return get("/fast") == http.StatusOK }) {
		t.Error("the WebSockets' slots were not freed when they closed")
	}
}
