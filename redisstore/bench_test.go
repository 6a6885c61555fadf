package redisstore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
)

// BenchmarkDecide decides token-bucket charges of 10,000 users over 100
// tenants against a real redis-server, from 32 × GOMAXPROCS goroutines
// (RunParallel): the user's bucket alone, and user, tenant and global
// together; and from one goroutine, each decision a call of its own.
// Concurrent decisions share calls (see batch.go); ns/op is the wall time
// per decision across all goroutines.
func BenchmarkDecide(b *testing.B) {
	srv := redistest.Start(b)
	s, err := redisstore.Open(context.Background(), "redis://"+srv.Addr, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	user := &admit.Rule{Name: "user", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1_000_000), Burst: 1_000_000}
	tenant := &admit.Rule{Name: "tenant", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10_000_000), Burst: 10_000_000}
	global := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(100_000_000), Burst: 100_000_000}
	charges := make([][]admit.Charge, 10000)
	for u := range charges {
		tn := "tenant-" + strconv.Itoa(u%100)
		charges[u] = []admit.Charge{
			{Key: admit.Key{Scope: "user", Tenant: tn, Subject: "user-" + strconv.Itoa(u), Rule: "user"}.String(), Rule: user, Cost: 1},
			{Key: admit.Key{Scope: "tenant", Tenant: tn, Rule: "tenant"}.String(), Rule: tenant, Cost: 1},
			{Key: admit.Key{Scope: "global", Rule: "global"}.String(), Rule: global, Cost: 1},
		}
	}
	// One caller: every decision is a call of its own, what a lightly
	// loaded server sees.
	b.Run("1-scope-alone", func(b *testing.B) {
		b.ReportAllocs()
		if _, err := redistest.Command(srv.Addr, "CONFIG", "RESETSTAT"); err != nil {
			b.Fatal(err)
		}
		var d admit.Decision
		for i := 0; b.Loop(); i++ {
			if err := s.Decide(context.Background(), charges[i*7919%len(charges)][:1], &d); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
		}
		_, usec, err := redistest.ScriptStats(srv.Addr)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(usec/float64(b.N), "redis-µs/decision")
	})
	for _, scopes := range []int{1, 3} {
		b.Run(strconv.Itoa(scopes)+"-scope", func(b *testing.B) {
			b.SetParallelism(32) // a server has many requests in flight
			b.ReportAllocs()
			var next atomic.Int64
			calls := s.Health().Calls
			if _, err := redistest.Command(srv.Addr, "CONFIG", "RESETSTAT"); err != nil {
				b.Fatal(err)
			}
			b.RunParallel(func(pb *testing.PB) {
				var d admit.Decision
				for pb.Next() {
					u := next.Add(7919) % int64(len(charges))
					if err := s.Decide(context.Background(), charges[u][:scopes], &d); err != nil {
						b.Error(err)
						return
					}
					if !d.Allowed {
						b.Error("refused")
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/float64(s.Health().Calls-calls), "decisions/call")
			_, usec, err := redistest.ScriptStats(srv.Addr)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(usec/float64(b.N), "redis-µs/decision")
		})
	}
}
