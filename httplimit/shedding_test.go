package httplimit

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/shed"
)

// TestShedding: past its group's concurrency limit, a request waits up to
// MaxWait, then is answered 503 with Retry-After, never reaching the
// service; a sheddable one is answered at once; a class header is believed
// from trusted proxies only; a WebSocket upgrade takes no slot.
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
	// A WebSocket upgrade passes without a slot.
	if w := do("/ws", "192.0.2.5:1", "Upgrade", "websocket", "Connection", "Upgrade"); w.Code != http.StatusOK {
		t.Fatalf("an upgrade at the limit: %d", w.Code)
	}
	<-entered
	st0 := lim.ShedStats()[0]
	if st0.Shed[shed.Default] != 1 || st0.Shed[shed.Sheddable] != 2 || st0.InFlight != 1 {
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
