package httplimit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/shed"
)

// TestShedding: past its group's concurrency limit, a request waits up to
// MaxWait, then is answered 503 with Retry-After, never reaching the
// service; a sheddable one is answered at once; a class header is believed
// from trusted proxies only; a header saying Upgrade takes a slot like any
// other request (TestShedUpgrades has the upgrades that happen).
func TestShedding(t *testing.T) {
	p := testPolicy(t)
	st := memstore.New(nil)
	defer st.Close()
	proxies, _ := ParseProxies([]string{"10.0.0.0/8"})
	lim, err := New(Options{
		Store: st, Policy: func() *policy.Policy { return p }, TrustedProxies: proxies,
		Actions: []Action{{Pattern: "/list", Name: "list"}, {Pattern: "/pay", Name: "pay"}},
		Shedding: []ShedGroup{{
			Name:        "api",
			Limiter:     shed.Options{Algorithm: shed.AIMD, InitialLimit: 1, MinLimit: 1, MaxLimit: 1, MaxWait: 20 * time.Millisecond, CriticalReserve: 0.01},
			ClassHeader: "X-Priority",
			Classes:     map[string]shed.Class{"list": shed.Sheddable},
			Default:     shed.Default,
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	release, entered := make(chan struct{}), make(chan struct{}, 10)
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		if r.URL.Path == "/slow" {
			<-release
		}
		_, _ = w.Write([]byte("ok"))
	}))
	do := func(path, peer string, hdr ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = peer // anonymous: only the per-ip rule, and each peer its own
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	done := make(chan int)
	go func() { done <- do("/slow", "192.0.2.1:1").Code }()
	<-entered // the one slot is taken

	w := do("/pay", "192.0.2.2:1")
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Fatalf("a default request at the limit: %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
	var body map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || w.Header().Get("Content-Type") != "application/problem+json" || body["retry_after_ms"] == nil {
		t.Fatalf("shed answer %q (%s)", w.Body.String(), w.Header().Get("Content-Type"))
	}
	if w := do("/list", "192.0.2.3:1"); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("a sheddable request at the limit: %d", w.Code)
	}
	// From an untrusted peer the header is ignored: list stays sheddable.
	if w := do("/list", "192.0.2.4:1", "X-Priority", "critical"); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("critical claimed by an untrusted peer: %d", w.Code)
	}
	// Asking for an upgrade passes nothing: the handler has not switched
	// protocols (once, 20 of 20 such requests reached an upstream
	// limited to 2).
	if w := do("/ws", "192.0.2.5:1", "Upgrade", "websocket", "Connection", "Upgrade"); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("an upgrade asked for at the limit: %d", w.Code)
	}
	if w := do("/pay", "192.0.2.6:1", "Upgrade", "websocket"); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("a request with an Upgrade header at the limit: %d", w.Code)
	}
	st0 := lim.ShedStats()[0]
	if st0.Shed[shed.Default] != 3 || st0.Shed[shed.Sheddable] != 2 || st0.InFlight != 1 {
		t.Fatalf("stats %+v", st0)
	}
	close(release)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the slow request: %d", code)
	}
	if w := do("/pay", "10.1.2.3:1", "X-Priority", "sheddable"); w.Code != http.StatusOK {
		t.Fatalf("after the slot freed: %d", w.Code)
	}
}

// TestShedUpgrades: in front of a real ReverseProxy, a request that asks
// for an upgrade the upstream does not grant (an Upgrade header alone, or
// with Connection: Upgrade) is an ordinary request and takes its slot; a
// WebSocket the upstream does upgrade is shed like any request at the
// limit, and once upgraded holds its slot until it closes.
func TestShedUpgrades(t *testing.T) {
	p, err := policy.Compile(&policy.Spec{Global: []policy.RuleSpec{tb("all", "global", nil, "1/s", 1000)}})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var inUpstream atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ws" || r.Header.Get("Upgrade") != "websocket" {
			// Served as an ordinary request, slowly; one past the limit
			// is answered at once, for the test to see it.
			if inUpstream.Add(1) == 1 {
				<-release
			}
			inUpstream.Add(-1)
			_, _ = io.WriteString(w, "ok")
			return
		}
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "websocket")
		w.WriteHeader(http.StatusSwitchingProtocols)
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = io.Copy(conn, rw) // an echo until the client closes
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	lim, err := New(Options{
		Store: memstore.New(nil), Policy: func() *policy.Policy { return p },
		Shedding: []ShedGroup{{Name: "all", Default: shed.Critical, // the whole limit, no reserve
			Limiter: shed.Options{Algorithm: shed.AIMD, InitialLimit: 1, MinLimit: 1, MaxLimit: 1, MaxWait: 10 * time.Millisecond}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	front := httptest.NewServer(lim.Handler(ReverseProxy(u, Proxies{}, XForwardedFor, nil)))
	defer front.Close()
	defer close(release) // first, so that no request is left waiting on the upstream
	stats := func() shed.Stats { return lim.ShedStats()[0].Stats }
	get := func(hdr ...string) int {
		req, _ := http.NewRequest("GET", front.URL+"/x", nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	for _, claim := range [][]string{{"Upgrade", "websocket"}, {"Upgrade", "websocket", "Connection", "Upgrade"}} {
		go get(claim...) // held by the upstream
		if !waitFor(func() bool { return stats().InFlight == 1 }) {
			t.Fatalf("%v: the first request never took the slot: %+v", claim, stats())
		}
		if code := get(claim...); code != http.StatusServiceUnavailable {
			t.Errorf("%v beside one in flight at a limit of 1: %d, want 503", claim, code)
		}
		release <- struct{}{}
		waitFor(func() bool { return stats().InFlight == 0 })
	}

	// A WebSocket upgraded: it holds the slot while open.
	conn, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("the upgrade: %v %v", resp, err)
	}
	fmt.Fprint(conn, "ping")
	if b := make([]byte, 4); func() error { _, err := io.ReadFull(br, b); return err }() != nil || string(b) != "ping" {
		t.Fatalf("the echo: %q", b)
	}
	if s := stats(); s.InFlight != 1 || s.Held != 1 {
		t.Fatalf("an open WebSocket: %+v, want its slot held", s)
	}
	if code := get(); code != http.StatusServiceUnavailable {
		t.Errorf("a request beside an open WebSocket at a limit of 1: %d, want 503", code)
	}
	conn.Close()
	if !waitFor(func() bool { return stats().InFlight == 0 }) {
		t.Fatalf("the slot of a closed WebSocket: %+v", stats())
	}
	go get()
	if !waitFor(func() bool { return stats().InFlight == 1 }) {
		t.Fatalf("a request after the WebSocket closed: %+v", stats())
	}
	release <- struct{}{}
}

// waitFor polls cond for up to 5 seconds.
func waitFor(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestClassHeaderUnderscore: the underscore spelling of a class header
// never reaches the service, which (under CGI, WSGI or PHP) would read it
// as the header Admit checked.
func TestClassHeaderUnderscore(t *testing.T) {
	f := newFixture(t, Options{Shedding: []ShedGroup{{Name: "all", ClassHeader: "x-priority"}}})
	r := httptest.NewRequest("GET", "/x", nil)
	r.RemoteAddr = "198.51.100.1:1"
	r.Header["X_priority"] = []string{"critical"}
	r.Header.Set("X-API-Key", keyA)
	var leaked []string
	h := f.lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k := range r.Header {
			if strings.Contains(k, "_") {
				leaked = append(leaked, k)
			}
		}
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 200 || len(leaked) > 0 {
		t.Fatalf("%d; underscore headers reached the service: %v", w.Code, leaked)
	}
}
