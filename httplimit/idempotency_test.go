package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/idempotency"
	"github.com/admitdev/admit/idempotency/redisidem"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
)

// debitsTwice is a handler that learns two costs while working and
// debits both, as an LLM call's input and output tokens; debitErrs gets
// the errors of Debit.
func debitsTwice(debitErrs chan<- error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, n := range []int64{300, 200} {
			if err := httplimit.Debit(r, n); err != nil {
				debitErrs <- err
				http.Error(w, err.Error(), http.StatusConflict)
				return
			}
		}
	})
}

func keyed(h http.Handler, method, path, tenant, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	r.Header.Set("X-Tenant", tenant)
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// remaining is what tenant's limits of l hold now.
func remaining(t *testing.T, l *admit.Limiter, tenant string) int64 {
	t.Helper()
	d, err := l.Peek(context.Background(), admit.Who{Tenant: tenant, Action: "/v1/chat"})
	if err != nil {
		t.Fatal(err)
	}
	// Peek's Remaining is what a request of cost 1 would leave.
	return d.Remaining + 1
}

// A retried request's debits are charged once per key, per caller: a
// retry, even through another middleware of the same keys, pays only its
// admission; another key, or another tenant's use of the same key, pays
// in full; a key used again for another path conflicts, and a malformed
// key is refused before anything is charged.
func TestIdempotentDebits(t *testing.T) {
	l, err := admit.NewLimiter(newStore(t), admit.Window("day", 10_000, 24*time.Hour).Per(admit.PerTenant))
	if err != nil {
		t.Fatal(err)
	}
	ls := [2]*admit.Limiter{l, l}
	// Two middlewares of one keys' store, as two servers would have.
	keys := idempotency.NewMemory(0, 0)
	var hs [2]http.Handler
	errs := make(chan error, 10)
	for i := range hs {
		hs[i] = httplimit.Middleware(l, byHeader, httplimit.IdempotentDebits(keys, time.Hour))(debitsTwice(errs))
	}
	want := int64(10_000)
	step := func(h http.Handler, key string, charged int64) {
		t.Helper()
		if w := keyed(h, "POST", "/v1/chat", "acme", key); w.Code != http.StatusOK {
			t.Fatalf("key %q: %d %s", key, w.Code, w.Body)
		}
		want -= charged
		if got := remaining(t, ls[0], "acme"); got != want {
			t.Fatalf("key %q: %d remaining, want %d (charged %d)", key, got, want, charged)
		}
	}
	step(hs[0], "k1", 501)
	step(hs[0], "k1", 1)   // a retry: its admission only
	step(hs[1], `"k1"`, 1) // on the other server, the key as a structured string
	step(hs[1], "k2", 501)
	step(hs[1], "", 501)
	step(hs[1], "", 501) // no key: each time
	if got := remaining(t, ls[0], "globex"); got != 10_000 {
		t.Fatalf("globex before its request: %d", got)
	}
	if w := keyed(hs[0], "POST", "/v1/chat", "globex", "k1"); w.Code != http.StatusOK || remaining(t, ls[0], "globex") != 10_000-501 {
		t.Fatalf("another tenant's k1: %d, %d remaining; want 200 and charged in full", w.Code, remaining(t, ls[0], "globex"))
	}

	// k1 on another path: a conflict, charging no debit.
	before := remaining(t, ls[0], "acme")
	if w := keyed(hs[0], "POST", "/v1/other", "acme", "k1"); w.Code != http.StatusConflict {
		t.Fatalf("k1 on another path: %d %s, want the handler's 409", w.Code, w.Body)
	}
	if err := <-errs; admit.ErrorCode(err) != admit.CodeConflict {
		t.Fatalf("Debit of k1 on another path: %v, want a conflict", err)
	}
	before--
	if got := remaining(t, ls[0], "acme"); got != before {
		t.Fatalf("k1 on another path: %d remaining, want %d (its admission, no debit)", got, before)
	}

	for _, bad := range []string{" ", `"`, "a\x7fb", `a\b`, string(make([]byte, 256))} {
		r := httptest.NewRequest("POST", "/v1/chat", nil)
		r.Header.Set("X-Tenant", "acme")
		r.Header.Set("Idempotency-Key", bad)
		w := httptest.NewRecorder()
		hs[0].ServeHTTP(w, r)
		if w.Code != http.StatusBadRequest || w.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("key %q: %d %q, want 400 problem+json", bad, w.Code, w.Header().Get("Content-Type"))
		}
	}
	r := httptest.NewRequest("POST", "/v1/chat", nil)
	r.Header.Set("X-Tenant", "acme")
	r.Header.Add("Idempotency-Key", "k9")
	r.Header.Add("Idempotency-Key", "k9")
	w := httptest.NewRecorder()
	hs[0].ServeHTTP(w, r)
	if w.Code != http.StatusBadRequest {
		t.Errorf("a key given twice: %d, want 400", w.Code)
	}
	if got := remaining(t, ls[0], "acme"); got != before {
		t.Errorf("after malformed keys: %d remaining, want %d", got, before)
	}
	select {
	case err := <-errs:
		t.Errorf("Debit failed: %v", err)
	default:
	}
}

// failingKeys is a keys' store that cannot be reached.
type failingKeys struct{ idempotency.Store }

func (failingKeys) Begin(context.Context, string, string, [32]byte, string, time.Duration) (idempotency.Entry, error) {
	return idempotency.Entry{}, admit.Errorf(admit.CodeUnavailable, "down")
}

// Where the keys cannot be reached, a debit is charged as if its request
// had no key: the cost was incurred, and the limit holds.
func TestIdempotentDebitsKeysDown(t *testing.T) {
	l, err := admit.NewLimiter(newStore(t), admit.Window("day", 10_000, 24*time.Hour).Per(admit.PerTenant))
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	h := httplimit.Middleware(l, byHeader, httplimit.IdempotentDebits(failingKeys{}, 0))(debitsTwice(errs))
	for range 2 {
		if w := keyed(h, "POST", "/v1/chat", "acme", "k1"); w.Code != http.StatusOK {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
	}
	if got := remaining(t, l, "acme"); got != 10_000-2*501 {
		t.Errorf("%d remaining, want each attempt charged (%d)", got, 10_000-2*501)
	}
}

// Two servers on one Redis, each with its own connections: many retries
// of one keyed request, at once and across both, are one charge of the
// debits (and one admission each).
func TestIdempotentDebitsRedis(t *testing.T) {
	srv := redistest.Start(t)
	var ls [2]*admit.Limiter
	var hs [2]http.Handler
	errs := make(chan error, 64)
	for i := range ls {
		s, err := redisstore.Open(context.Background(), "redis://"+srv.Addr, &redisstore.Options{Prefix: "idem-debits:", Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		l, err := admit.NewLimiter(s, admit.Window("day", 100_000, 24*time.Hour).Per(admit.PerTenant))
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
		hs[i] = httplimit.Middleware(l, byHeader, httplimit.IdempotentDebits(redisidem.New(s, 0), 0))(debitsTwice(errs))
	}
	const attempts = 32
	var wg sync.WaitGroup
	codes := make([]int, attempts)
	for i := range attempts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = keyed(hs[i%2], "POST", "/v1/chat", "acme", "retry-me").Code
		}()
	}
	wg.Wait()
	close(errs)
	ok, conflicts := 0, 0
	for err := range errs {
		if admit.ErrorCode(err) != admit.CodeConflict {
			t.Fatalf("Debit: %v", err)
		}
		conflicts++
	}
	for _, c := range codes {
		if c == http.StatusOK {
			ok++
		}
	}
	if ok+conflicts != attempts {
		t.Fatalf("codes %v: %d answered 200 and %d conflicts of %d", codes, ok, conflicts, attempts)
	}
	// Each attempt paid its admission; the debits were charged once,
	// whichever attempt made each. An attempt whose first debit
	// conflicted made no second.
	if got, want := remaining(t, ls[1], "acme"), int64(100_000-attempts-500); got != want {
		t.Errorf("%d remaining after %d attempts (%d conflicts), want %d: the debits charged once", got, attempts, conflicts, want)
	}
	// A later retry, the first attempts done: free of debits on both.
	for i := range hs {
		if w := keyed(hs[i], "POST", "/v1/chat", "acme", "retry-me"); w.Code != http.StatusOK {
			t.Fatalf("a later retry on server %d: %d %s", i, w.Code, w.Body)
		}
	}
	if got, want := remaining(t, ls[0], "acme"), int64(100_000-attempts-2-500); got != want {
		t.Errorf("%d remaining after the later retries, want %d", got, want)
	}
}
