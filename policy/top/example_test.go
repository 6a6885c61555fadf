package top_test

import (
	"context"
	"fmt"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/top"
)

// ExampleCallers counts a Decider's decisions and lists the callers a
// rule refused most.
func ExampleCallers() {
	ctx := context.Background()
	limit := int64(2)
	p, _ := policy.Compile(&policy.Spec{Global: []policy.RuleSpec{
		{Name: "logins", Scope: "ip", Algorithm: "fixed_window", Limit: &limit, Window: "1h"},
	}})
	store := memstore.New(nil)
	defer store.Close()
	d := policy.NewDecider(store, 1)
	callers := top.New("server-1", nil) // a top.Shared merges other servers' counts
	d.Observe(callers)
	for ip, n := range map[string]int{"192.0.2.1": 7, "192.0.2.2": 4, "192.0.2.3": 1} {
		for range n {
			var res policy.Resolution
			_ = p.Resolve(&policy.Request{IP: ip, Cost: 1}, &res)
			var dec admit.Decision
			_, _ = d.Decide(ctx, &res, &dec)
		}
	}
	t, _ := callers.Top(ctx, "logins", 5*time.Minute, 10)
	for _, c := range t.Refused {
		fmt.Printf("%s %s refused %d (±%d)\n", c.Scope, c.Value, c.Count, c.Error)
	}
	// Output:
	// ip 192.0.2.1 refused 5 (±0)
	// ip 192.0.2.2 refused 2 (±0)
}
