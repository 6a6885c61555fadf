package server

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/idempotency"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/storetest"
)

// TestIdempotentCharges: a charge retried with its Idempotency-Key is
// answered as it was and charges nothing; the key with another request
// is 422; a refusal is not kept (its retry is decided again); keys are
// the tenant's own; a malformed key is 400.
func TestIdempotentCharges(t *testing.T) {
	h := start(t, testSpec(), "")
	// Tier big: docs is a bucket of burst 3, 1/min, max_cost 10.
	report := `{"tenant":"t2","action":"doc","cost":2}`
	first := h.do("POST", "/v1/report", report, "Idempotency-Key", `"r-1"`)
	h.want(first, 200, "a report with a key")
	for range 3 {
		again := h.do("POST", "/v1/report", report, "Idempotency-Key", `"r-1"`)
		h.want(again, 200, "its retry")
		if again.raw != first.raw || again.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("a retry answered %s (replayed %q), want the first answer %s", again.raw, again.header.Get("Idempotent-Replayed"), first.raw)
		}
	}
	// The bucket held 3 and was charged 2 once: a check of 1 passes, the
	// next is refused.
	h.want(h.do("POST", "/v1/check", `{"tenant":"t2","action":"doc"}`), 200, "a check of the one left")
	h.want(h.do("POST", "/v1/check", `{"tenant":"t2","action":"doc"}`), 429, "a check past it")

	// The key with another request.
	other := h.do("POST", "/v1/report", `{"tenant":"t2","action":"doc","cost":3}`, "Idempotency-Key", "r-1")
	h.want(other, 422, "the key with another cost")
	// A refused check is not kept: decided again, charged once admitted.
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1","user":"bob"}`, "Idempotency-Key", "c-1"), 200, "a check with a key")
	refusedBody := `{"tenant":"t1","user":"bob","cost":2}` // t1's user-req holds 2, one taken
	for i := range 2 {
		a := h.do("POST", "/v1/check", refusedBody, "Idempotency-Key", "c-2")
		h.want(a, 429, "a refused check, decided each time")
		if a.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("refusal %d was a replay", i)
		}
	}
	// The same key, another tenant: its own.
	h.want(h.do("POST", "/v1/report", `{"tenant":"t1","user":"bob","cost":1}`, "Idempotency-Key", "r-1"), 200, "another tenant's r-1")

	for _, k := range []string{"", `""`, strings.Repeat("k", 256), "a\tb", `"a\"b"`, "é"} {
		a := h.do("POST", "/v1/report", report, "Idempotency-Key", k)
		if k == "" {
			// An empty header is no header for net/http's client: skip.
			continue
		}
		h.want(a, 400, "key "+k[:min(len(k), 10)])
		if !strings.Contains(a.raw, "Idempotency-Key") {
			t.Errorf("key %.10q: %s, want the field named", k, a.raw)
		}
	}
}

// keptKeys is an idempotency store that counts the answers it keeps.
type keptKeys struct {
	*idempotency.Memory
	kept atomic.Int64
}

func (k *keptKeys) Finish(ctx context.Context, scope, key string, a idempotency.Entry, keep time.Duration) error {
	k.kept.Add(1)
	return k.Memory.Finish(ctx, scope, key, a, keep)
}

// TestIdempotencyKeysBounded: the keys a caller can make the server keep
// are bounded by what it charged and by its own share. An anonymous
// caller no rule applies to, or one charging nothing, keeps no key; a
// tenant holds at most its bound and is then refused keyed charges (429
// with when to retry), while another tenant's go on.
func TestIdempotencyKeysBounded(t *testing.T) {
	spec := testSpec()
	spec.Global = nil
	keys := &keptKeys{Memory: idempotency.NewMemory(3, 0)}
	h := start(t, spec, "", func(o *Options) { o.Idempotency = keys })
	for i := range 50 {
		k := "anon-" + strconv.Itoa(i)
		h.want(h.do("POST", "/v1/check", `{"cost":1}`, "Idempotency-Key", k), 200, "an anonymous check no rule applies to")
		h.want(h.do("POST", "/v1/check", `{"tenant":"t2","action":"doc","cost":0}`, "Idempotency-Key", k+"-0"), 200, "a check of cost 0")
		h.want(h.do("POST", "/v1/report", `{"tenant":"t2","action":"doc","cost":0}`, "Idempotency-Key", k+"-r0"), 200, "a report of cost 0")
	}
	if n := keys.kept.Load(); n != 0 {
		t.Fatalf("%d answers kept of requests that charged nothing, want 0", n)
	}
	for i := range 3 {
		h.want(h.do("POST", "/v1/report", `{"tenant":"t2","action":"doc","cost":1}`, "Idempotency-Key", "t2-"+strconv.Itoa(i)), 200, "t2's keyed report")
	}
	full := h.do("POST", "/v1/report", `{"tenant":"t2","action":"doc","cost":1}`, "Idempotency-Key", "t2-3")
	h.want(full, 429, "t2's fourth key, past its bound of 3")
	if ra, err := strconv.Atoi(full.header.Get("Retry-After")); err != nil || ra < 1 || ra > 3600 {
		t.Errorf("Retry-After %q, want the seconds until t2's first key expires", full.header.Get("Retry-After"))
	}
	h.want(h.do("POST", "/v1/report", `{"tenant":"t2","action":"doc","cost":1}`, "Idempotency-Key", "t2-0"), 200, "a retry of a key t2 holds")
	h.want(h.do("POST", "/v1/report", `{"tenant":"t2","action":"doc","cost":1}`), 200, "t2's report without a key")
	h.want(h.do("POST", "/v1/report", `{"tenant":"t1","user":"bob","cost":1}`, "Idempotency-Key", "t1-0"), 200, "another tenant's keyed report")
}

// TestIdempotencyKeysApart: a key names one request of one caller. The
// same key sent to another endpoint is another request (422); a key a
// service-token caller used is not an untrusted caller's, which neither
// reads its answer nor turns its retry into a replay.
func TestIdempotencyKeysApart(t *testing.T) {
	h := start(t, testSpec(), "", func(o *Options) { o.ServiceTokens = []string{"backend"} })
	h.want(h.do("POST", "/v1/report", `{"tenant":"t2","action":"doc","cost":1}`, "Idempotency-Key", "x-1"), 200, "a report")
	h.want(h.do("POST", "/v1/check", `{"tenant":"t2","action":"doc","cost":1,"debit":true}`, "Idempotency-Key", "x-1"), 422, "its key on a check's debit")

	body := `{"tenant":"t1","user":"bob","cost":1}`
	svc := h.do("POST", "/v1/report", body, "Idempotency-Key", "svc-1", "Authorization", "Bearer backend")
	h.want(svc, 200, "the service's report")
	anon := h.do("POST", "/v1/report", body, "Idempotency-Key", "svc-1")
	h.want(anon, 200, "an untrusted report of the service's key")
	if anon.header.Get("Idempotent-Replayed") != "" || anon.raw == svc.raw {
		t.Errorf("an untrusted caller was replayed the service's answer: %s", anon.raw)
	}
	again := h.do("POST", "/v1/report", body, "Idempotency-Key", "svc-1", "Authorization", "Bearer backend")
	if again.header.Get("Idempotent-Replayed") != "true" || again.raw != svc.raw {
		t.Errorf("the service's retry: %s (replayed %q), want its own answer", again.raw, again.header.Get("Idempotent-Replayed"))
	}
}

// TestIdempotencyLateStore: a store that applied a keyed charge but
// answered too late leaves the answer of the failure mode; a retry is
// that answer again, not a second charge.
func TestIdempotencyLateStore(t *testing.T) {
	h, f := faulty(t, "open")
	f.Late.Store(true)
	body := `{"tenant":"t2","action":"doc","cost":1}`
	first := h.do("POST", "/v1/report", body, "Idempotency-Key", "late-1")
	h.want(first, 200, "a report the store answered too late")
	if first.body["failover"] != "open" {
		t.Fatalf("want the open failure mode's answer: %s", first.raw)
	}
	f.Late.Store(false)
	again := h.do("POST", "/v1/report", body, "Idempotency-Key", "late-1")
	if again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the retry was decided again (%s): a charge the store applied late is charged twice", again.raw)
	}
	// docs holds 3: the late report took 1.
	h.want(h.do("POST", "/v1/check", `{"tenant":"t2","action":"doc","cost":2}`), 200, "the two left")
	h.want(h.do("POST", "/v1/check", `{"tenant":"t2","action":"doc"}`), 429, "none left")
}

// flakyKeys is an idempotency store whose Begin fails while down is set,
// and whose Finish fails its first finishFails times, as a Redis paused
// while a request was decided.
type flakyKeys struct {
	*idempotency.Memory
	down        atomic.Bool
	finishFails atomic.Int64
}

func (k *flakyKeys) Begin(ctx context.Context, scope, key string, fp [32]byte, token string, pending time.Duration) (idempotency.Entry, error) {
	if k.down.Load() {
		return idempotency.Entry{}, admit.Errorf(admit.CodeUnavailable, "keys down")
	}
	return k.Memory.Begin(ctx, scope, key, fp, token, pending)
}

func (k *flakyKeys) Finish(ctx context.Context, scope, key string, a idempotency.Entry, keep time.Duration) error {
	if k.finishFails.Add(-1) >= 0 {
		return admit.Errorf(admit.CodeUnavailable, "keys paused")
	}
	return k.Memory.Finish(ctx, scope, key, a, keep)
}

// TestIdempotencyKeysStoreFailing: a keyed charge whose key cannot be
// claimed is decided by the failure modes without the store (a charge
// sent to a store that does not answer may be applied after all, and its
// retry, claimed, would charge it again); an answer the keys' store did
// not take is kept once it does, and the retry is that answer.
func TestIdempotencyKeysStoreFailing(t *testing.T) {
	keys := &flakyKeys{Memory: idempotency.NewMemory(0, 0)}
	spec := testSpec()
	spec.OnError = "open"
	h := start(t, spec, "", func(o *Options) { o.Idempotency = keys })
	body := `{"tenant":"t2","action":"doc","cost":1}` // docs: a bucket of 3

	keys.down.Store(true)
	a := h.do("POST", "/v1/report", body, "Idempotency-Key", "down-1")
	h.want(a, 200, "a keyed report, the keys' store down")
	if a.body["failover"] != "open" {
		t.Errorf("want the open failure mode's answer, the store not asked: %s", a.raw)
	}
	keys.down.Store(false)
	h.want(h.do("POST", "/v1/check", `{"tenant":"t2","action":"doc","cost":3,"dry_run":true}`), 200, "all 3 still there")

	keys.finishFails.Store(3)
	first := h.do("POST", "/v1/report", body, "Idempotency-Key", "late-1")
	h.want(first, 200, "a report whose answer the keys' store did not take at first")
	deadline := time.Now().Add(5 * time.Second)
	for {
		again := h.do("POST", "/v1/report", body, "Idempotency-Key", "late-1")
		if again.header.Get("Idempotent-Replayed") == "true" {
			if again.raw != first.raw {
				t.Errorf("replayed %s, want %s", again.raw, first.raw)
			}
			break
		}
		h.want(again, 409, "a retry while the answer waits for the keys' store")
		if time.Now().After(deadline) {
			t.Fatal("the answer was not kept within 5 s of the keys' store taking writes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.want(h.do("POST", "/v1/check", `{"tenant":"t2","action":"doc","cost":2,"dry_run":true}`), 200, "2 left: charged once")
	h.want(h.do("POST", "/v1/check", `{"tenant":"t2","action":"doc","cost":3,"dry_run":true}`), 429, "not 3")
}

// TestIdempotencyUnknownTenants: a tenant the catalog does not know
// (given the default tier) is anyone's to name, so its keys are the
// address's, apart from the tenants' and bounded together: one address
// naming many tenants holds its bound in all, and another address naming
// the same tenant and key neither replays nor is refused by the first's.
func TestIdempotencyUnknownTenants(t *testing.T) {
	spec := testSpec()
	spec.UnknownTenant = "small"
	h := start(t, spec, "", func(o *Options) {
		o.Idempotency, o.AnonymousIdempotency = idempotency.NewMemory(3, 0), idempotency.NewMemory(3, 0)
	})
	for i, tenant := range []string{"u1", "u2", "u3"} {
		h.want(h.do("POST", "/v1/report", `{"tenant":"`+tenant+`","user":"x","cost":1}`, "Idempotency-Key", "k"+strconv.Itoa(i)), 200, tenant+"'s keyed report")
	}
	h.want(h.do("POST", "/v1/report", `{"tenant":"u4","user":"x","cost":1}`, "Idempotency-Key", "k9"), 429, "a fourth key of the address, under a fourth made-up tenant")

	// Another address: a client dialing from 127.0.0.2.
	other := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}}
	req, _ := http.NewRequest("POST", h.url+"/v1/report", strings.NewReader(`{"tenant":"u1","user":"x","cost":1}`))
	req.Header.Set("Idempotency-Key", "k0")
	resp, err := other.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "" {
		t.Errorf("another address, u1's k0: %d replayed %q; want its own charge", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}
}

// TestIdempotencyKeysDownLocal: with the keys' store down and the rules
// failing local, a keyed charge is decided by the server's own limiter
// once: its retries here are that answer again (not another local
// charge), and once the store answers it holds the answer for every
// server.
func TestIdempotencyKeysDownLocal(t *testing.T) {
	keys := &flakyKeys{Memory: idempotency.NewMemory(0, 0)}
	spec := testSpec()
	spec.OnError = "local"
	f := &storetest.Faulty{Store: memstore.New(nil)}
	t.Cleanup(func() { f.Store.Close() })
	h := start(t, spec, "", func(o *Options) { o.Idempotency, o.Store = keys, f })
	f.Down.Store(true)
	keys.down.Store(true)
	body := `{"tenant":"t2","action":"doc","cost":3}` // docs: a bucket of 3
	first := h.do("POST", "/v1/report", body, "Idempotency-Key", "local-1")
	h.want(first, 200, "a keyed report, the store and the keys' store down")
	if first.body["failover"] != "local" {
		t.Fatalf("want the local limiter's answer: %s", first.raw)
	}
	for range 3 {
		again := h.do("POST", "/v1/report", body, "Idempotency-Key", "local-1")
		if again.header.Get("Idempotent-Replayed") != "true" || again.raw != first.raw {
			t.Fatalf("a retry here while the keys' store is down: %s (replayed %q), want the first answer", again.raw, again.header.Get("Idempotent-Replayed"))
		}
	}
	keys.down.Store(false)
	f.Down.Store(false)
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.srv.held.mu.Lock()
		n := len(h.srv.held.keys)
		h.srv.held.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the answer did not reach the keys' store within 5 s of its return")
		}
		time.Sleep(20 * time.Millisecond)
	}
	again := h.do("POST", "/v1/report", body, "Idempotency-Key", "local-1")
	if again.header.Get("Idempotent-Replayed") != "true" || again.raw != first.raw {
		t.Errorf("a retry once the keys' store holds the answer: %s, want the first answer", again.raw)
	}
}

// TestIdempotencyKeyFolded: two keys a proxy folded into one field
// ("a, b") are refused, as two fields are.
func TestIdempotencyKeyFolded(t *testing.T) {
	h := start(t, testSpec(), "")
	h.want(h.do("POST", "/v1/report", `{"tenant":"t2","action":"doc","cost":1}`, "Idempotency-Key", "a, b"), 400, "a folded key")
}
