package admit

import (
	"context"
	"strconv"
	"testing"
)

// admitAll is a store that admits every decision, for tests of what a
// Limiter does before its store.
type admitAll struct{ Store }

func (admitAll) Decide(_ context.Context, charges []Charge, d *Decision) error {
	d.Reset()
	for _, c := range charges {
		d.Results = append(d.Results, Result{Rule: c.Rule.Name, Allowed: true, Limit: 1, Remaining: 1})
	}
	d.Summarize()
	return nil
}

// TestLimiterCacheGrowsWithLimits: a Limiter of eight limits per user
// keeps as many callers' keys as one of one limit: after a first round,
// 500 callers seen in turn are decided without building a key, for
// Limiters of one limit and of eight, each with a seed of its own. A cache
// of 8,192 entries in all, in sets of four, left some caller building its
// key on every call in most of 40 such Limiters; 8,192 per limit in sets
// of eight overflow a set with a chance of a few in a million each.
func TestLimiterCacheGrowsWithLimits(t *testing.T) {
	ctx := context.Background()
	users := make([]Who, 500)
	for i := range users {
		users[i] = Who{User: "user-" + strconv.Itoa(i)}
	}
	for _, n := range []int{1, 8} {
		var limits []Limit
		for i := range n {
			limits = append(limits, Bucket("user-"+strconv.Itoa(i), PerSecond(1_000_000), 1_000_000).Per(PerUser))
		}
		for round := range 20 {
			l, err := NewLimiter(admitAll{}, limits...)
			if err != nil {
				t.Fatal(err)
			}
			var d Decision
			for range 2 {
				for _, w := range users {
					if err := l.Decide(ctx, w, 1, &d); err != nil {
						t.Fatal(err)
					}
				}
			}
			if built, want := l.keysBuilt.Load(), int64(n*len(users)); built != want {
				t.Errorf("%d limits, Limiter %d: %d keys built for %d callers seen twice, want %d (each once)", n, round, built, len(users), want)
			}
			l.Close()
		}
	}
}
