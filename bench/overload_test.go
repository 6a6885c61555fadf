package bench

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
)

// TestOverloadReport measures what one key under sustained overload costs
// Redis: two stores (two servers) on one redis-server it starts, one
// tenant key — a token bucket of 2,000/s burst 500, or a fixed window of
// 2,000 a second — 16 callers offering three times the rate for 4 s,
// exact and leased. It prints the decisions, the admissions against the
// bound (burst + rate × elapsed), and the script calls per decision, and
// fails if more than the bound was admitted. It runs only when asked:
// ADMIT_OVERLOAD_BENCH=1.
//
//	cd bench && ADMIT_OVERLOAD_BENCH=1 go test -run OverloadReport -v
func TestOverloadReport(t *testing.T) {
	if os.Getenv("ADMIT_OVERLOAD_BENCH") == "" {
		t.Skip("a measurement, not a test: run with ADMIT_OVERLOAD_BENCH=1")
	}
	for _, distribution := range []string{"exact", "leased"} {
		for _, window := range []bool{false, true} {
			overload(t, distribution, 4*time.Second, 16, 2000, 500, window)
		}
	}
}

func overload(t *testing.T, distribution string, duration time.Duration, callers int, rate, burst int64, window bool) {
	srv := redistest.Start(t)
	rule := &admit.Rule{Name: "tenant", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(rate), Burst: burst}
	bound := func(elapsed time.Duration) int64 { return burst + rate*int64(elapsed)/int64(time.Second) }
	if window {
		rule = &admit.Rule{Name: "tenant", Algorithm: admit.FixedWindow, Limit: rate, Window: time.Second}
		bound = func(elapsed time.Duration) int64 { return rate * (int64(elapsed/time.Second) + 2) }
	}
	if distribution == "leased" {
		rule.Distribution = admit.Leased
	}
	var stores [2]*redisstore.Store
	for i := range stores {
		s, err := redisstore.Open(context.Background(), "redis://"+srv.Addr, &redisstore.Options{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		stores[i] = s
	}
	// Each caller offers 3 × rate / callers a second, paced.
	interval := time.Duration(int64(time.Second) * int64(callers) / (3 * rate))
	var admitted, decided atomic.Int64
	start := time.Now()
	deadline := start.Add(duration)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[c%2]
			charges := []admit.Charge{{Key: "tenant:acme", Rule: rule, Cost: 1}}
			var d admit.Decision
			next := time.Now()
			for time.Now().Before(deadline) {
				if err := s.Decide(context.Background(), charges, &d); err != nil {
					t.Error(err)
					return
				}
				decided.Add(1)
				if d.Allowed {
					admitted.Add(1)
				}
				next = next.Add(interval)
				time.Sleep(time.Until(next))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var calls, withdrawals, local, refusals int64
	for _, s := range stores {
		h := s.Health()
		calls, withdrawals, local, refusals = calls+h.Calls, withdrawals+h.Withdrawals, local+h.LocalDecisions, refusals+h.LocalRefusals
	}
	b := bound(elapsed)
	fmt.Printf("%s %s: %d decisions in %v, %d admitted of a bound of %d (%.1f %%), %d calls (%.3f per decision; %d withdrawals), %d local (%d refusals)\n",
		distribution, rule.Algorithm, decided.Load(), elapsed.Round(time.Millisecond), admitted.Load(), b,
		100*float64(admitted.Load())/float64(b), calls, float64(calls)/float64(decided.Load()), withdrawals, local, refusals)
	if admitted.Load() > b {
		t.Errorf("admitted %d, more than the bound %d", admitted.Load(), b)
	}
}
