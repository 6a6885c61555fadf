package policy_test

import (
	"context"
	"fmt"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
)

// ExampleBans bans an address for ten minutes: the Decider refuses its
// requests by the ban, without asking the store, until the ban ends or
// is lifted.
func ExampleBans() {
	ctx := context.Background()
	burst := int64(10)
	p, _ := policy.Compile(&policy.Spec{Global: []policy.RuleSpec{
		{Name: "per-ip", Scope: "ip", Algorithm: "token_bucket", Rate: "10/s", Burst: &burst},
	}})
	store := memstore.New(nil)
	defer store.Close()
	bans := policy.NewBans(&policy.MemoryBans{}) // Path: a journal, kept across restarts
	if err := bans.Start(ctx, store); err != nil {
		fmt.Println(err)
		return
	}
	d := policy.NewDecider(store, 1)
	d.EnforceBans(bans)

	ban, _ := bans.Add(ctx, policy.Ban{Scope: policy.BanIP, Value: "203.0.113.0/24", Reason: "scraping"}, 10*time.Minute)
	decide := func(ip string) {
		var res policy.Resolution
		_ = p.Resolve(&policy.Request{IP: ip, Cost: 1}, &res)
		var dec admit.Decision
		out, _ := d.Decide(ctx, &res, &dec)
		fmt.Println(ip, dec.Allowed, out, dec.DeniedBy == "ban:"+ban.ID)
	}
	decide("203.0.113.7")
	decide("198.51.100.7")
	_, _ = bans.Remove(ctx, ban.ID)
	decide("203.0.113.7")
	// Output:
	// 203.0.113.7 false banned true
	// 198.51.100.7 true stored false
	// 203.0.113.7 true stored false
}
