package admit

import (
	"context"
	"strconv"
	"testing"
	"unsafe"
)

// keySeer is a store that admits every decision and notes the bytes of
// each charge's key: a key the Limiter's cache held is the same string,
// the same bytes, as before; a key built again is new bytes.
type keySeer struct {
	Store
	seen map[string]*byte
	new  int
}

func (s *keySeer) Decide(_ context.Context, charges []Charge, d *Decision) error {
	d.Reset()
	for _, c := range charges {
		if p := unsafe.StringData(c.Key); s.seen[c.Key] != p {
			s.seen[c.Key] = p
			s.new++
		}
		d.Results = append(d.Results, Result{Rule: c.Rule.Name, Allowed: true, Limit: 1, Remaining: 1})
	}
	d.Allowed = true
	return nil
}

// TestLimiterCacheGrowsWithLimits: a Limiter of eight limits per user
// keeps as many callers' keys as one of one limit: after a first round,
// 250 callers seen in turn are decided without building a key again, for
// Limiters of one limit and of eight, each with a seed of its own. A cache
// of 8,192 entries in all in sets of four let some of them build keys on
// every call; 8,192 per limit in sets of eight overflow a set with a
// chance of about one in a million for the whole test.
func TestLimiterCacheGrowsWithLimits(t *testing.T) {
	ctx := context.Background()
	users := make([]Who, 250)
	for i := range users {
		users[i] = Who{User: "user-" + strconv.Itoa(i)}
	}
	for _, n := range []int{1, 8} {
		var limits []Limit
		for i := range n {
			limits = append(limits, Bucket("user-"+strconv.Itoa(i), PerSecond(1_000_000), 1_000_000).Per(PerUser))
		}
		for round := range 20 {
			store := &keySeer{seen: map[string]*byte{}}
			l, err := NewLimiter(store, limits...)
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
			if want := n * len(users); store.new != want {
				t.Errorf("%d limits, Limiter %d: %d keys built for %d callers seen twice, want %d (each once)", n, round, store.new, len(users), want)
			}
			l.Close()
		}
	}
}
