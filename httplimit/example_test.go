package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/idempotency"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
)

// Two requests per client IP a minute, for everyone.
func Example() {
	burst := int64(2)
	p, err := policy.Compile(&policy.Spec{Global: []policy.RuleSpec{
		{Name: "per-ip", Scope: "ip", Algorithm: "token_bucket", Rate: "2/min", Burst: &burst},
	}})
	if err != nil {
		panic(err)
	}
	store := memstore.New(nil)
	defer store.Close()
	lim, err := httplimit.New(httplimit.Options{
		Store:          store,
		Policy:         func() *policy.Policy { return p },
		TrustedProxies: httplimit.Proxies{}, // the peer is the client
	})
	if err != nil {
		panic(err)
	}
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))
	for range 3 {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "198.51.100.7:5000"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("RateLimit"))
	}
	// Output:
	// 200 "per-ip";r=1;t=30;pk=:QwMxogcvtWV8:
	// 200 "per-ip";r=0;t=60;pk=:QwMxogcvtWV8:
	// 429 "per-ip";r=0;t=60;pk=:QwMxogcvtWV8:
}

// A handler debits the tokens an LLM call took; a client that lost the
// answer retries with the same Idempotency-Key and is not billed twice.
// Servers that share a Redis share the keys with idempotency/redisidem's store
// in place of the memory one.
func ExampleIdempotentDebits() {
	// A stopped clock keeps the day from ending while this runs.
	noon := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	store := memstore.New(&memstore.Options{Clock: func() time.Time { return noon }})
	defer store.Close()
	lim, err := admit.NewLimiter(store, admit.Window("tokens-per-day", 100_000, 24*time.Hour).Per(admit.PerTenant))
	if err != nil {
		panic(err)
	}
	who := func(r *http.Request) (admit.Who, error) { return admit.Who{Tenant: r.Header.Get("X-Tenant")}, nil }
	h := httplimit.Middleware(lim, who, httplimit.IdempotentDebits(idempotency.NewMemory(0, 0), time.Hour))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := httplimit.Debit(r, 1_200); err != nil { // the tokens the call took
				http.Error(w, err.Error(), http.StatusConflict)
			}
		}))
	for _, key := range []string{"order-1", "order-1", "order-2"} {
		r := httptest.NewRequest("POST", "/v1/chat", nil)
		r.Header.Set("X-Tenant", "acme")
		r.Header.Set("Idempotency-Key", key)
		h.ServeHTTP(httptest.NewRecorder(), r)
		d, _ := lim.Peek(context.Background(), admit.Who{Tenant: "acme"})
		fmt.Println(key, d.Remaining+1)
	}
	// Output:
	// order-1 98799
	// order-1 98798
	// order-2 97597
}
