package server

import (
	"strings"
	"testing"
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
