package load

import (
	"strconv"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The Envoy rate limit benchmarks' workload: RLSUsers users in RLSTenants
// tenants, limited by RLSConfig, an envoyproxy/ratelimit file of two nested
// fixed windows whose limits are large enough that nothing is refused.
const (
	RLSTenants = 100
	RLSUsers   = 10000
	RLSConfig  = `domain: bench
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000}
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 100000}
`
)

// RLSRequests returns one request per user for domain, built once (building
// them is the client's work, not the server's): two descriptors, (tenant)
// and (tenant, user), the way Envoy configurations usually limit a tenant
// and its users; or with oneDescriptor a single (tenant, user) descriptor,
// as the catalog domain reads it.
func RLSRequests(domain string, oneDescriptor bool) []*rlsv3.RateLimitRequest {
	entry := func(k, v string) *rlext.RateLimitDescriptor_Entry {
		return &rlext.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	reqs := make([]*rlsv3.RateLimitRequest, RLSUsers)
	for u := range reqs {
		t, user := entry("tenant", "tenant-"+strconv.Itoa(u%RLSTenants)), entry("user", "user-"+strconv.Itoa(u))
		r := &rlsv3.RateLimitRequest{Domain: domain}
		if oneDescriptor {
			r.Descriptors = []*rlext.RateLimitDescriptor{{Entries: []*rlext.RateLimitDescriptor_Entry{t, user}}}
		} else {
			r.Descriptors = []*rlext.RateLimitDescriptor{
				{Entries: []*rlext.RateLimitDescriptor_Entry{t}},
				{Entries: []*rlext.RateLimitDescriptor_Entry{t, user}},
			}
		}
		reqs[u] = r
	}
	return reqs
}
