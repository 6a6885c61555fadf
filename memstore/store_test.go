package memstore_test

import (
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/storetest"
)

func newStore(t *testing.T, clock func() time.Time) admit.Store {
	s := memstore.New(&memstore.Options{Clock: clock, Shards: 16})
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) { storetest.Run(t, newStore) }

func TestFairShares(t *testing.T) {
	storetest.RunFairShares(t, func(t *testing.T, clock func() time.Time) []admit.Store {
		return []admit.Store{newStore(t, clock)}
	})
}

// TestFixedWindowClockBack steps the clock back across a window's edge
// and forward again: the memory store keeps one window a key, and the
// later window's count stands, so neither step admits past it (it once
// started the earlier window from zero, then the later one again).
func TestFixedWindowClockBack(t *testing.T) {
	clock := storetest.NewClock()
	s := newStore(t, clock.Now)
	r := &admit.Rule{Name: "w", Algorithm: admit.FixedWindow, Limit: 3, Window: time.Minute}
	c := []admit.Charge{{Key: "k", Rule: r, Cost: 1}}
	var d admit.Decision
	for _, step := range []struct {
		at   time.Duration
		cost int64
		want bool
	}{{30 * time.Second, 3, true}, {-30 * time.Second, 1, false}, {31 * time.Second, 1, false}, {60 * time.Second, 3, true}} {
		clock.Set(step.at)
		c[0].Cost = step.cost
		if err := s.Decide(t.Context(), c, &d); err != nil || d.Allowed != step.want {
			t.Fatalf("at %v, cost %d: allowed %v (%v), want %v", step.at, step.cost, d.Allowed, err, step.want)
		}
	}
}
