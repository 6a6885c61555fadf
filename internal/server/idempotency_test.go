package server

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit/policy"
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
	*policy.MemoryIdempotency
	kept atomic.Int64
}

func (k *keptKeys) Finish(ctx context.Context, scope, key string, a policy.Idempotent, keep time.Duration) error {
	k.kept.Add(1)
	return k.MemoryIdempotency.Finish(ctx, scope, key, a, keep)
}

// TestIdempotencyKeysBounded: the keys a caller can make the server keep
// are bounded by what it charged and by its own share. An anonymous
// caller no rule applies to, or one charging nothing, keeps no key; a
// tenant holds at most its bound and is then refused keyed charges (429
// with when to retry), while another tenant's go on.
func TestIdempotencyKeysBounded(t *testing.T) {
	spec := testSpec()
	spec.Global = nil
	keys := &keptKeys{MemoryIdempotency: policy.NewMemoryIdempotency(3)}
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
