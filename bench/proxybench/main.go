// Command proxybench measures admit proxy's forwarding path against a plain
// httputil.ReverseProxy: in one run, on one machine, both forward to the
// same upstream (a small fixed answer) on the same net/http server
// configuration, driven by the same callers in alternating rounds. Admit's
// side identifies every request by API key (100 tenants) and user header
// (10,000 users, from a trusted loopback peer) and decides user, tenant and
// global buckets in the memory store before forwarding.
//
//	cd bench && go run ./proxybench -callers 64 -duration 3s -rounds 3
//
// Everything listens on 127.0.0.1 only; the run stops by itself after
// rounds × 2 × duration.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/admitdev/admit/bench/load"
	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy/catalog"
)

func main() {
	callers := flag.Int("callers", 64, "concurrent callers, each with its own keep-alive connection")
	duration := flag.Duration("duration", 3*time.Second, "length of one measured round")
	rounds := flag.Int("rounds", 3, "rounds of each target, alternating")
	flag.Parse()
	if err := run(*callers, *duration, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "proxybench:", err)
		os.Exit(1)
	}
}

const tenants, users = 100, 10000

func key(tenant int) string { return "ak_bench_" + strconv.Itoa(tenant) }

func run1(url string, callers int, d time.Duration) load.HTTPResult {
	return load.HTTP(callers, d, func(i int) *http.Request {
		u := i % users
		req, _ := http.NewRequest("GET", url+"/items/"+strconv.Itoa(u), nil)
		req.Header.Set("X-API-Key", key(u%tenants))
		req.Header.Set("X-User-Id", "user-"+strconv.Itoa(u))
		return req
	})
}

func run(callers int, d time.Duration, rounds int) error {
	upURL, stopUp, err := load.Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"item":"ok"}` + "\n"))
	}))
	if err != nil {
		return err
	}
	defer stopUp()
	up, _ := url.Parse(upURL)

	plain := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(up); pr.SetXForwarded() }}
	plainURL, stopPlain, err := load.Serve(plain)
	if err != nil {
		return err
	}
	defer stopPlain()

	store := memstore.New(nil)
	defer store.Close()
	cat, err := catalog.New(context.Background(), load.Spec(tenants, key), nil)
	if err != nil {
		return err
	}
	trusted, _ := httplimit.ParseProxies([]string{"127.0.0.1"})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	lim, err := httplimit.New(httplimit.Options{
		Store: store, Policy: cat.Policy, TrustedProxies: trusted, UserHeader: "X-User-Id", RequireKey: true, Logger: quiet,
	})
	if err != nil {
		return err
	}
	admitURL, stopAdmit, err := load.Serve(lim.Handler(httplimit.ReverseProxy(up, trusted, "", quiet)))
	if err != nil {
		return err
	}
	defer stopAdmit()

	run1(plainURL, callers, d/3) // warm up connections, buckets and the allocator
	run1(admitURL, callers, d/3)

	fmt.Printf("callers=%d duration=%v rounds=%d tenants=%d users=%d GOMAXPROCS=%s\n", callers, d, rounds, tenants, users, os.Getenv("GOMAXPROCS"))
	med := load.Rounds(rounds, []load.Target{
		{Name: "plain-proxy", Run: func() load.HTTPResult { return run1(plainURL, callers, d) }},
		{Name: "admit-proxy", Run: func() load.HTTPResult { return run1(admitURL, callers, d) }},
	})
	ma, mp := med["admit-proxy"], med["plain-proxy"]
	fmt.Printf("median: admit proxy %.0f/s, plain ReverseProxy %.0f/s, ratio %.2f\n", ma, mp, ma/mp)
	return nil
}
