// Package load runs closed-loop loads for the benchmarks: a number of
// callers, each making calls back to back until the time is up.
package load

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit/internal/server"
	"github.com/admitdev/admit/policy"
)

// Result is a load's outcome: the latency of every call that counted,
// sorted, and the time the load took.
type Result struct {
	Lat     []time.Duration
	Elapsed time.Duration
}

// Rate returns the counted calls per second.
func (r Result) Rate() float64 { return float64(len(r.Lat)) / r.Elapsed.Seconds() }

// Pct returns the latency at fraction p (0.5 for the median).
func (r Result) Pct(p float64) time.Duration {
	if len(r.Lat) == 0 {
		return 0
	}
	return r.Lat[int(float64(len(r.Lat)-1)*p)]
}

// Run runs callers goroutines for d; caller g makes calls i = g, g+callers,
// g+2·callers… with op, which reports whether the call counts (a failed
// one does not).
func Run(callers int, d time.Duration, op func(i int) bool) Result {
	var wg sync.WaitGroup
	lats := make([][]time.Duration, callers)
	start := time.Now()
	deadline := start.Add(d)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 1<<14)
			for i := g; time.Now().Before(deadline); i += callers {
				t0 := time.Now()
				if op(i) {
					lat = append(lat, time.Since(t0))
				}
			}
			lats[g] = lat
		}()
	}
	wg.Wait()
	r := Result{Elapsed: time.Since(start)}
	for _, l := range lats {
		r.Lat = append(r.Lat, l...)
	}
	slices.Sort(r.Lat)
	return r
}

// Serve starts h on a loopback port on admit serve's HTTP server
// configuration, and returns its URL and a function that stops it.
func Serve(h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	hs := server.HTTPServer(h, nil)
	go func() { _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = hs.Close() }, nil
}

// HTTPResult is an HTTP load's outcome: the answered calls (200 and 429
// count), and how many were admitted, refused, or failed (a transport
// error or any other status; not counted).
type HTTPResult struct {
	Result
	OK, Refused, Failed int64
}

// HTTP runs a closed-loop HTTP load: callers goroutines, each with its own
// keep-alive connection, send request i = req(i) back to back for d.
func HTTP(callers int, d time.Duration, req func(i int) *http.Request) HTTPResult {
	tr := &http.Transport{MaxIdleConnsPerHost: callers, MaxConnsPerHost: callers, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var ok, refused, failed atomic.Int64
	res := Run(callers, d, func(i int) bool {
		resp, err := client.Do(req(i))
		if err != nil {
			failed.Add(1)
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			ok.Add(1)
		case http.StatusTooManyRequests:
			refused.Add(1)
		default:
			failed.Add(1)
			return false
		}
		return true
	})
	return HTTPResult{Result: res, OK: ok.Load(), Refused: refused.Load(), Failed: failed.Load()}
}

// Spec is the policy of the HTTP benchmarks: tenants tenant-0… in tier
// free, each user charged a user bucket (100/s, burst 50), its tenant's
// (100000/s) and the global one (10000000/s). key, if set, gives tenant i
// an API key.
func Spec(tenants int, key func(i int) string) *policy.Spec {
	n := func(v int64) *int64 { return &v }
	s := &policy.Spec{
		Global: []policy.RuleSpec{{Name: "global-requests", Scope: "global", Algorithm: "token_bucket", Rate: "10000000/s", Burst: n(1000000)}},
		Tiers: map[string]policy.TierSpec{"free": {Rules: []policy.RuleSpec{
			{Name: "user-requests", Scope: "user", Algorithm: "token_bucket", Rate: "100/s", Burst: n(50)},
			{Name: "tenant-requests", Scope: "tenant", Algorithm: "token_bucket", Rate: "100000/s", Burst: n(20000)},
		}}},
		Tenants: map[string]policy.TenantSpec{},
	}
	for i := range tenants {
		t := policy.TenantSpec{Tier: "free"}
		if key != nil {
			t.APIKeysSHA256 = []string{policy.HashKey(key(i))}
		}
		s.Tenants["tenant-"+strconv.Itoa(i)] = t
	}
	return s
}

// Target is one side of an HTTP comparison: a name and a measured round.
type Target struct {
	Name string
	Run  func() HTTPResult
}

// Rounds runs the targets in alternating rounds, prints a row per target
// and round (requests/s, p50, p99, refused, errors), and returns each
// target's median requests/s.
func Rounds(rounds int, targets []Target) map[string]float64 {
	fmt.Printf("%-6s %-12s %12s %10s %10s %9s %8s\n", "round", "target", "requests/s", "p50", "p99", "refused", "errors")
	rates := map[string][]float64{}
	for i := range rounds {
		for _, t := range targets {
			r := t.Run()
			fmt.Printf("%-6d %-12s %12.0f %10v %10v %9d %8d\n", i+1, t.Name, r.Rate(), r.Pct(0.50).Round(time.Microsecond), r.Pct(0.99).Round(time.Microsecond), r.Refused, r.Failed)
			rates[t.Name] = append(rates[t.Name], r.Rate())
		}
	}
	med := map[string]float64{}
	for name, v := range rates {
		slices.Sort(v)
		med[name] = v[len(v)/2]
	}
	return med
}
