package limitador

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// BenchmarkDecide decides a request of Kuadrant's shape against a
// namespace of four limits, two of which apply (one per user), on the
// memory store, from every core.
func BenchmarkDecide(b *testing.B) {
	l, _ := newLimiter(&testing.T{}, `
- {namespace: shop/toystore, max_value: 1000000000, seconds: 60, name: per-user, conditions: ["descriptors[0]['limit.per_user__1da6e70a'] == '1'"], variables: ["descriptors[0]['auth.identity.username']"]}
- {namespace: shop/toystore, max_value: 1000000000, seconds: 3600, name: per-user, conditions: ["descriptors[0]['limit.per_user__1da6e70a'] == '1'"], variables: ["descriptors[0]['auth.identity.username']"]}
- {namespace: shop/toystore, max_value: 10, seconds: 60, name: other, conditions: ["descriptors[0]['limit.other__2c1520b6'] == '1'"], variables: []}
- {namespace: shop/other, max_value: 10, seconds: 60, conditions: [], variables: []}
`)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			ds := []map[string]string{{"limit.per_user__1da6e70a": "1", "auth.identity.username": "user" + strconv.Itoa(i%1000)}}
			res, err := l.Decide(context.Background(), CheckAndReport, "shop/toystore", ds, 1, false)
			if err != nil || res.Limited || res.Applied != 2 {
				b.Fatalf("%+v %v", res, err)
			}
			i++
		}
	})
}

// BenchmarkShouldRateLimit is envoyrls's BenchmarkShouldRateLimit as a
// Limitador namespace: 10,000 users in 100 tenants, a counter per tenant
// and one per user, the memory store, the service called directly (no
// gRPC). Run beside it, the two say what deciding as Limitador costs over
// envoyproxy/ratelimit's files.
func BenchmarkShouldRateLimit(b *testing.B) {
	l, _ := newLimiter(&testing.T{}, `
- {namespace: bench, max_value: 1000000000, seconds: 1, conditions: [], variables: ["descriptors[0].tenant"]}
- {namespace: bench, max_value: 1000000000, seconds: 1, conditions: [], variables: ["descriptors[0].tenant", "descriptors[0].user"]}
`)
	svc := NewService(l, HeadersNone)
	reqs := make([]*rlsv3.RateLimitRequest, 10000)
	for u := range reqs {
		reqs[u] = rlsRequest("bench", 0, "tenant", "tenant-"+strconv.Itoa(u%100), "user", "user-"+strconv.Itoa(u))
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := svc.ShouldRateLimit(context.Background(), reqs[next.Add(1)%int64(len(reqs))])
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				b.Fatal(resp, err)
			}
		}
	})
}
