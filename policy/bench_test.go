package policy_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
)

// BenchmarkDecide is a Decider's part of every front end's decision: a
// tenant's request resolved to three rules, decided in the memory store,
// over 10,000 users of 100 tenants.
func BenchmarkDecide(b *testing.B) {
	rule := func(name, scope string) policy.RuleSpec {
		burst := int64(1e9)
		return policy.RuleSpec{Name: name, Scope: scope, Algorithm: "token_bucket", Rate: "1000000000/s", Burst: &burst}
	}
	spec := &policy.Spec{
		Global:  []policy.RuleSpec{rule("global", "global")},
		Tiers:   map[string]policy.TierSpec{"free": {Rules: []policy.RuleSpec{rule("user", "user"), rule("tenant", "tenant")}}},
		Tenants: map[string]policy.TenantSpec{},
	}
	for i := range 100 {
		spec.Tenants["t"+strconv.Itoa(i)] = policy.TenantSpec{Tier: "free"}
	}
	p, err := policy.Compile(spec)
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]policy.Request, 10000)
	for i := range reqs {
		reqs[i] = policy.Request{Tenant: "t" + strconv.Itoa(i%100), User: "u" + strconv.Itoa(i), Cost: 1}
	}
	store := memstore.New(nil)
	defer store.Close()
	d := policy.NewDecider(store, 1)
	defer d.Close()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var res policy.Resolution
		var dec admit.Decision
		i := 0
		for pb.Next() {
			req := reqs[i%len(reqs)]
			i++
			if err := p.Resolve(&req, &res); err != nil {
				b.Fatal(err)
			}
			if _, err := d.Decide(context.Background(), &res, &dec); err != nil || !dec.Allowed {
				b.Fatal(dec, err)
			}
		}
	})
}
