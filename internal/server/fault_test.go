package server

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/storetest"
)

// faulty starts a server over a storetest.Faulty store with spec's
// on_error set to mode.
func faulty(t *testing.T, mode string) (*harness, *storetest.Faulty) {
	t.Helper()
	spec := testSpec()
	spec.OnError = mode
	f := &storetest.Faulty{Store: memstore.New(nil)}
	t.Cleanup(func() { f.Store.Close() })
	h := start(t, spec, "", trustLoopback(t), func(o *Options) { o.Store = f })
	return h, f
}

// TestStoreDownEveryEndpoint: with the store unavailable, every decision
// endpoint answers as its failure mode says — admitted open with a result
// for every rule the request resolved to (the fail-open crash was a
// decision with none), 503 closed, the local limiter's answer local — and
// never a panic or another 5xx.
func TestStoreDownEveryEndpoint(t *testing.T) {
	check := `{"tenant":"t1","user":"alice"}` // global + user-req: two charges
	t.Run("open", func(t *testing.T) {
		h, f := faulty(t, "open")
		f.Down.Store(true)
		for range 5 { // user-req's burst is 2: open admits past it
			a := h.do("POST", "/v1/check", check)
			h.want(a, 200, "check, open")
			rules, _ := a.body["rules"].([]any)
			if len(rules) != 2 || a.body["failover"] != "open" {
				t.Fatalf("open answer lists %d rules, failover %v: %s", len(rules), a.body["failover"], a.raw)
			}
			if rl := a.header.Get("RateLimit"); rl == "" {
				t.Fatalf("open answer without RateLimit: %v", a.header)
			}
		}
		a := h.do("POST", "/v1/acquire", `{"tenant":"t1","user":"alice","max_wait_ms":100}`)
		h.want(a, 200, "acquire, open")
		if a.body["failover"] != "open" {
			t.Fatalf("acquire: %s", a.raw)
		}
		a = h.do("POST", "/v1/leases", `{"tenant":"t1","resource":"export","ttl_ms":60000}`)
		h.want(a, 201, "lease, open")
		id, _ := a.body["lease_id"].(string)
		if id == "" || a.body["failover"] != "open" {
			t.Fatalf("open lease: %s", a.raw)
		}
		h.want(h.do("PUT", "/v1/leases/"+id, ""), 200, "renew an open lease")
		h.want(h.do("DELETE", "/v1/leases/"+id, ""), 204, "release an open lease")
		code, _, body := authz(t, h.url+"/v1/authz/files/x", "X-API-Key", "secret-key")
		if code != 200 {
			t.Fatalf("authz, open: %d %s", code, body)
		}
	})
	t.Run("closed", func(t *testing.T) {
		h, f := faulty(t, "closed")
		f.Down.Store(true)
		for _, c := range []struct{ path, body string }{
			{"/v1/check", check},
			{"/v1/acquire", `{"tenant":"t1","user":"alice","max_wait_ms":100}`},
			{"/v1/leases", `{"tenant":"t1","resource":"export"}`},
		} {
			a := h.do("POST", c.path, c.body)
			h.want(a, 503, c.path+", closed")
		}
		if code, hdr, _ := authz(t, h.url+"/v1/authz/files/x", "X-API-Key", "secret-key"); code != 503 || hdr.Get("Retry-After") == "" {
			t.Fatalf("authz, closed: %d %v", code, hdr)
		}
	})
	t.Run("local", func(t *testing.T) {
		h, f := faulty(t, "local")
		f.Down.Store(true)
		for i, want := range []int{200, 200, 429} { // user-req's burst of 2, decided here
			a := h.do("POST", "/v1/check", check)
			h.want(a, want, "check, local")
			if rules, _ := a.body["rules"].([]any); len(rules) != 2 || a.body["failover"] != "local" {
				t.Fatalf("local answer %d: %s", i, a.raw)
			}
		}
		a := h.do("POST", "/v1/leases", `{"tenant":"t1","resource":"export","ttl_ms":60000}`)
		h.want(a, 201, "lease, local")
		id, _ := a.body["lease_id"].(string)
		h.want(h.do("POST", "/v1/leases", `{"tenant":"t1","resource":"export"}`), 429, "second lease over max 1, local")
		// The local lease is renewed and released where it is held, even
		// after the store is back.
		f.Down.Store(false)
		h.want(h.do("PUT", "/v1/leases/"+id, ""), 200, "renew a local lease")
		h.want(h.do("DELETE", "/v1/leases/"+id, ""), 204, "release a local lease")
		h.want(h.do("DELETE", "/v1/leases/"+id, ""), 404, "release it twice")
	})
}

// TestShortDecisionIsAnInternalError: a store that answers fewer results
// than charges is a bug in the store; every endpoint answers 500 with a
// problem, and none reads past the results.
func TestShortDecisionIsAnInternalError(t *testing.T) {
	h, f := faulty(t, "open")
	f.Short.Store(true)
	for _, c := range []struct{ path, body string }{
		{"/v1/check", `{"tenant":"t1","user":"alice"}`},
		{"/v1/acquire", `{"tenant":"t1","user":"alice","action":"login","ip":"192.0.2.1","max_wait_ms":10}`},
		{"/v1/leases", `{"tenant":"t1","resource":"export"}`},
	} {
		h.want(h.do("POST", c.path, c.body), 500, c.path+" with a short decision")
	}
	if code, _, body := authz(t, h.url+"/v1/authz/files/x", "X-API-Key", "secret-key"); code != 500 {
		t.Fatalf("authz with a short decision: %d %s", code, body)
	}
	f.Short.Store(false)
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1","user":"bob"}`), 200, "check once the store is whole")
}

// TestOutageLoggedOnceEachWay: however many decisions fail in an outage,
// the log says once that the store went away and once that it answers
// again (with the outage's length); /readyz and the metrics show it.
func TestOutageLoggedOnceEachWay(t *testing.T) {
	var logs syncBuffer
	spec := testSpec()
	f := &storetest.Faulty{Store: memstore.New(nil)}
	t.Cleanup(func() { f.Store.Close() })
	h := start(t, spec, "", func(o *Options) {
		o.Store = f
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	check := `{"tenant":"t2","user":"alice"}`
	h.want(h.do("POST", "/v1/check", check), 200, "before the outage")
	f.Down.Store(true)
	for range 20 {
		h.want(h.do("POST", "/v1/check", check), 200, "during the outage (open)")
	}
	ready := h.do("GET", "/readyz", "")
	if ready.body["store_down_since"] == nil {
		t.Errorf("/readyz during the outage: %s", ready.raw)
	}
	if _, _, m := send(t, "GET", h.url+"/metrics"); !strings.Contains(m, "admit_store_up 0") || !strings.Contains(m, "admit_store_outages_total 1") {
		t.Errorf("metrics during the outage lack admit_store_up 0 / admit_store_outages_total 1")
	}
	f.Down.Store(false)
	// The outage ends with the first answer once no call has failed for a
	// second (a Cluster missing one master answers for the other slots).
	h.want(h.do("POST", "/v1/check", check), 200, "at once after the outage")
	if h.do("GET", "/readyz", "").body["store_down_since"] == nil {
		t.Error("/readyz ended the outage before a second without failures")
	}
	time.Sleep(1100 * time.Millisecond)
	for range 2 { // of t2's user-req burst of 5, two checks took 2
		h.want(h.do("POST", "/v1/check", check), 200, "after the outage")
	}
	out := logs.String()
	if n := strings.Count(out, "the store is unavailable"); n != 1 {
		t.Errorf("%d lines say the store went away, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "the store answers again"); n != 1 || !strings.Contains(out, "outage=") {
		t.Errorf("%d lines say the store is back (want 1, with the outage):\n%s", n, out)
	}
	if h.do("GET", "/readyz", "").body["store_down_since"] != nil {
		t.Error("/readyz still shows the outage")
	}
	if _, _, m := send(t, "GET", h.url+"/metrics"); !strings.Contains(m, "admit_store_up 1") {
		t.Error("metrics after the outage lack admit_store_up 1")
	}
}
