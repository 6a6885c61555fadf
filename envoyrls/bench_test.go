package envoyrls

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
)

// BenchmarkShouldRateLimit decides requests of two descriptors, (tenant)
// and (tenant, user), over 10,000 users in 100 tenants with the memory
// store, calling the service directly (no gRPC): the service's own cost.
func BenchmarkShouldRateLimit(b *testing.B) {
	cfg, err := Parse(File{Name: "b.yaml", Data: []byte(`
domain: bench
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000000}
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1000000000}
`)})
	if err != nil {
		b.Fatal(err)
	}
	store := memstore.New(nil)
	defer store.Close()
	svc, err := New(Options{Decider: policy.NewDecider(store, 1), Config: cfg})
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]*rlsv3.RateLimitRequest, 10000)
	for u := range reqs {
		t := "tenant-" + strconv.Itoa(u%100)
		reqs[u] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlext.RateLimitDescriptor{
			desc("tenant", t), desc("tenant", t, "user", "user-"+strconv.Itoa(u)),
		}}
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
