package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/admitdev/admit/httplimit"
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
	// 200 "per-ip";r=1;t=30
	// 200 "per-ip";r=0;t=60
	// 429 "per-ip";r=0;t=60
}
