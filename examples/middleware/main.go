// Command middleware limits an HTTP API per tenant and action: a token
// bucket of 10 requests a second, bursts of 20, for each (tenant, action)
// pair, in front of a net/http handler. The tenant comes from the
// X-Tenant header and the action is the path.
//
//	go run ./examples/middleware
//	curl -i -H 'X-Tenant: acme' localhost:8080/summary
//
// The 21st request of a burst gets 429 Too Many Requests, with Retry-After
// and the RateLimit headers; a request without X-Tenant gets 400.
package main

import (
	"flag"
	"log"
	"net/http"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/memstore"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "where to listen")
	flag.Parse()
	h, err := newHandler(memstore.New(nil))
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on %s", *addr)
	log.Fatal(http.ListenAndServe(*addr, h))
}

// newHandler is the API behind its limit. The tenant comes from its
// header, the action from the path. README.md shows its middle, to the
// byte (TestREADME).
func newHandler(store admit.Store) (http.Handler, error) {
	var handler http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("done\n"))
	})
	limiter, err := admit.NewLimiter(store, admit.Bucket("tenant-action", admit.PerSecond(10), 20).Per(admit.PerTenant, admit.PerAction))
	if err != nil {
		return nil, err
	}
	handler = httplimit.Middleware(limiter, func(r *http.Request) (admit.Who, error) {
		return admit.Who{Tenant: r.Header.Get("X-Tenant"), Action: r.URL.Path}, nil
	})(handler)
	return handler, nil
}
