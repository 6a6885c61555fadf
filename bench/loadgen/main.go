// Command loadgen measures Admit's HTTP decision API against the ceiling of
// its own server stack: in one run, on one machine, it drives POST /v1/check
// (memory store; 10,000 users over 100 tenants; user, tenant and global
// buckets) and a do-nothing handler served by the same net/http server
// configuration, with the same callers, bodies and connections, in
// alternating rounds, and reports decisions/s, p50 and p99 of each and their
// ratio.
//
//	cd bench && go run ./loadgen -callers 64 -duration 3s -rounds 3
//
// Both servers and the load listen on 127.0.0.1 only; the run stops by
// itself after rounds × 2 × duration.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/bench/load"
	"github.com/admitdev/admit/internal/server"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy/catalog"
	"github.com/admitdev/admit/redisstore"
)

func main() {
	callers := flag.Int("callers", 64, "concurrent callers, each with its own keep-alive connection")
	duration := flag.Duration("duration", 3*time.Second, "length of one measured round")
	rounds := flag.Int("rounds", 3, "rounds of each target, alternating")
	tenants := flag.Int("tenants", 100, "tenants")
	users := flag.Int("users", 10000, "users, spread over the tenants")
	storeURL := flag.String("store", "memory", "store: memory, or a redis:// URL (see admit serve --store)")
	userBurst := flag.Int64("user-burst", 50, "the user bucket's burst; its rate is twice that per second")
	distribution := flag.String("distribution", "exact", "distribution of every rule: exact or leased (allowances; a redis store only)")
	flag.Parse()
	if err := run(*callers, *duration, *rounds, *tenants, *users, *storeURL, *distribution, *userBurst); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

// nothing is the ceiling: it reads the body and answers a fixed decision.
var nothing = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"allowed":true}` + "\n"))
})

func run1(url string, callers int, d time.Duration, bodies [][]byte) load.HTTPResult {
	return load.HTTP(callers, d, func(i int) *http.Request {
		req, _ := http.NewRequest("POST", url+"/v1/check", bytes.NewReader(bodies[i%len(bodies)]))
		req.Header.Set("Content-Type", "application/json")
		return req
	})
}

func run(callers int, d time.Duration, rounds, tenants, users int, storeURL, distribution string, userBurst int64) error {
	var store admit.Store = memstore.New(nil)
	if storeURL != "memory" {
		r, err := redisstore.Open(context.Background(), storeURL, nil)
		if err != nil {
			return err
		}
		store = r
	}
	defer store.Close()
	spec := load.Spec(tenants, nil)
	for _, tier := range spec.Tiers {
		for i := range tier.Rules {
			if tier.Rules[i].Name == "user-requests" {
				tier.Rules[i].Burst, tier.Rules[i].Rate = &userBurst, fmt.Sprintf("%d/s", 2*userBurst)
			}
		}
	}
	if distribution != "exact" {
		for i := range spec.Global {
			spec.Global[i].Distribution = distribution
		}
		for _, tier := range spec.Tiers {
			for i := range tier.Rules {
				tier.Rules[i].Distribution = distribution
			}
		}
	}
	cat, err := catalog.New(context.Background(), spec, nil)
	if err != nil {
		return err
	}
	srv, err := server.New(server.Options{Store: store, Catalog: cat, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	defer srv.Close()
	admitURL, stopAdmit, err := load.Serve(srv)
	if err != nil {
		return err
	}
	defer stopAdmit()
	nothingURL, stopNothing, err := load.Serve(nothing)
	if err != nil {
		return err
	}
	defer stopNothing()

	bodies := make([][]byte, users)
	for u := range users {
		bodies[u] = []byte(fmt.Sprintf(`{"tenant":"tenant-%d","user":"user-%d","action":"read"}`, u%tenants, u))
	}
	run1(admitURL, callers, d/3, bodies) // warm up connections, buckets and the allocator
	run1(nothingURL, callers, d/3, bodies)

	fmt.Printf("user bucket %d/s, burst %d\n", 2*userBurst, userBurst)
	fmt.Printf("store=%s distribution=%s callers=%d duration=%v rounds=%d tenants=%d users=%d GOMAXPROCS=%s\n", storeURL, distribution, callers, d, rounds, tenants, users, os.Getenv("GOMAXPROCS"))
	med := load.Rounds(rounds, []load.Target{
		{Name: "nothing", Run: func() load.HTTPResult { return run1(nothingURL, callers, d, bodies) }},
		{Name: "check", Run: func() load.HTTPResult { return run1(admitURL, callers, d, bodies) }},
	})
	fmt.Printf("median: check %.0f/s, nothing %.0f/s, ratio %.2f\n", med["check"], med["nothing"], med["check"]/med["nothing"])
	if r, ok := store.(*redisstore.Store); ok {
		h := r.Health()
		fmt.Printf("redis calls %d for %d decisions (%.4f per decision), %d local\n", h.Calls, h.Decisions, float64(h.Calls)/float64(h.Decisions), h.LocalDecisions)
	}
	return nil
}
