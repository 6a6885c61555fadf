package envoyrls

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestUpstreamStats replays, on the memory store, a run of
// envoyproxy/ratelimit (main of 2026-01-22, on Redis, statsd over TCP)
// that this test's expectations were read from: nested limits, a limit
// whose level names a value, shadow mode, a limit four levels down, an
// unlimited descriptor, a request of 3 hits that crosses a limit, and a
// domain nobody configured. Every counter it sent, and no other, must be
// counted, under its name and with its value.
func TestUpstreamStats(t *testing.T) {
	stats := NewUpstreamStats(0.8)
	e := start(t, Options{Charge: ChargeEach, Stats: stats, Config: parse(t, `domain: d
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 3}
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: k
    value: v
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: s
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: a
    descriptors:
      - key: b
        descriptors:
          - key: c
            rate_limit: {unit: minute, requests_per_unit: 10}
  - key: free
    rate_limit: {unlimited: true}
`)}, nil)
	for range 4 {
		e.ask(t, "d", 0, desc("tenant", "t1"), desc("tenant", "t1", "user", "u1"), desc("k", "v"), desc("s", "x"),
			desc("a", "1", "b", "2", "c", "3"), desc("free", "y"))
	}
	e.ask(t, "d", 3, desc("k", "v"))
	e.ask(t, "nodomain", 0, desc("k", "v"))
	want := `ratelimit.service.rate_limit.d.a.b.c.total_hits 4
ratelimit.service.rate_limit.d.a.b.c.within_limit 4
ratelimit.service.rate_limit.d.k_v.near_limit 1
ratelimit.service.rate_limit.d.k_v.over_limit 2
ratelimit.service.rate_limit.d.k_v.total_hits 7
ratelimit.service.rate_limit.d.k_v.within_limit 4
ratelimit.service.rate_limit.d.s.near_limit 1
ratelimit.service.rate_limit.d.s.over_limit 3
ratelimit.service.rate_limit.d.s.shadow_mode 3
ratelimit.service.rate_limit.d.s.total_hits 4
ratelimit.service.rate_limit.d.s.within_limit 1
ratelimit.service.rate_limit.d.tenant.near_limit 1
ratelimit.service.rate_limit.d.tenant.over_limit 1
ratelimit.service.rate_limit.d.tenant.total_hits 4
ratelimit.service.rate_limit.d.tenant.user.near_limit 1
ratelimit.service.rate_limit.d.tenant.user.over_limit 2
ratelimit.service.rate_limit.d.tenant.user.total_hits 4
ratelimit.service.rate_limit.d.tenant.user.within_limit 2
ratelimit.service.rate_limit.d.tenant.within_limit 3
ratelimit.service.rate_limit.nodomain.domain_not_found 1
ratelimit_server.ShouldRateLimit.total_requests 6
`
	var got strings.Builder
	for _, c := range stats.Counters() {
		fmt.Fprintf(&got, "%s %d\n", c.Name, c.Value)
	}
	if got.String() != want {
		t.Errorf("counters:\n%s\nwant (as envoyproxy/ratelimit sent them):\n%s", got.String(), want)
	}
	if n := len(stats.TakeResponseTimes()); n != 6 {
		t.Errorf("%d response times, want one per call (6)", n)
	}
}

// TestUpstreamStatsBounded: a client sending domains nobody configured
// cannot make the counters hold more than MaxUpstreamCounters names; what
// goes past is counted as dropped.
func TestUpstreamStatsBounded(t *testing.T) {
	stats := NewUpstreamStats(0.8)
	for i := range MaxUpstreamCounters + 50 {
		stats.Add(fmt.Sprintf("ratelimit.service.rate_limit.x%d.domain_not_found", i), 1)
	}
	if n := len(stats.Counters()); n != MaxUpstreamCounters {
		t.Errorf("%d counters, want the bound %d", n, MaxUpstreamCounters)
	}
	if d := stats.Dropped(); d != 50 {
		t.Errorf("dropped %d, want 50", d)
	}
}

// TestUpstreamStatNames: what a client puts in a name (a domain, a limit
// override's entries) cannot end a statsd line or split it: line breaks,
// spaces, colons and bars are underscores; anything else stays.
func TestUpstreamStatNames(t *testing.T) {
	stats := NewUpstreamStats(0.8)
	stats.Add("ratelimit.service.rate_limit.x\nforged:1|c\r\t y\x00\x7f.domain_not_found", 1)
	stats.limit("rl.k_v\nforged:1|c").totalHits.Add(1)
	stats.Add("ratelimit.service.rate_limit.rl.path_/api/é.domain_not_found", 1)
	var names []string
	for _, c := range stats.Counters() {
		names = append(names, c.Name)
	}
	want := []string{
		"ratelimit.service.rate_limit.rl.k_v_forged_1_c.total_hits",
		"ratelimit.service.rate_limit.rl.path_/api/é.domain_not_found",
		"ratelimit.service.rate_limit.x_forged_1_c___y__.domain_not_found",
	}
	if !slices.Equal(names, want) {
		t.Errorf("counters %q, want %q", names, want)
	}
}

// TestUpstreamStatsConcurrent: hits counted from many goroutines at once
// are all counted, once.
func TestUpstreamStatsConcurrent(t *testing.T) {
	stats := NewUpstreamStats(0.8)
	const goroutines, hits = 16, 500
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range hits {
				stats.hit(fmt.Sprintf("d.k%d", (g+i)%4), 1_000_000, 0, 1, 1, true, false)
				stats.call(time.Microsecond)
			}
		}()
	}
	wg.Wait()
	var total uint64
	for _, c := range stats.Counters() {
		if strings.HasSuffix(c.Name, ".total_hits") {
			total += c.Value
		}
	}
	if total != goroutines*hits {
		t.Errorf("%d hits counted, want %d", total, goroutines*hits)
	}
}
