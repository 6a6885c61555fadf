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

// TestTimelinesOneShard runs the timelines with every key in one shard: a
// key's time is not moved by another key's decision at a later time when
// the clock is set back (the sliding window change's timeline once failed
// when two of its keys shared a shard, one run in sixteen).
func TestTimelinesOneShard(t *testing.T) {
	storetest.RunTimelinesOf(t, func(t *testing.T, clock func() time.Time) admit.Store {
		s := memstore.New(&memstore.Options{Clock: clock, Shards: 1})
		t.Cleanup(func() { s.Close() })
		return s
	}, storetest.Timelines())
}

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

// TestTimeNeverRunsBackInAShard: a decision reads the clock before it
// takes its shard's lock, so one that waited for the lock may hold an
// earlier reading than a decision it follows; it is made at the later
// time, on a key's own path and on the multi-key one. A clock set back
// by up to 100 ms shows the same; one set back further stands
// (TestTimelinesOneShard).
func TestTimeNeverRunsBackInAShard(t *testing.T) {
	clock := storetest.NewClock()
	s := memstore.New(&memstore.Options{Clock: clock.Now, Shards: 1})
	t.Cleanup(func() { s.Close() })
	bucket := &admit.Rule{Name: "b", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 1}
	one := []admit.Charge{{Key: "a", Rule: bucket, Cost: 1}}
	two := []admit.Charge{{Key: "b", Rule: bucket, Cost: 1}, {Key: "c", Rule: bucket, Cost: 1}}
	var d admit.Decision
	decide := func(c []admit.Charge) time.Time {
		t.Helper()
		if err := s.Decide(t.Context(), c, &d); err != nil {
			t.Fatal(err)
		}
		return d.At
	}
	clock.Set(10 * time.Second)
	latest := decide(one)
	if !d.Allowed {
		t.Fatal("a full bucket refused")
	}
	// Readings up to 100 ms before the last decision are decisions that
	// waited for the shard's lock: made at its time.
	for i, c := range [][]admit.Charge{one, two, one} {
		clock.Set(10*time.Second - time.Duration(i+1)*30*time.Millisecond)
		if at := decide(c); at.Before(latest) {
			t.Fatalf("decision %d at %v, after one at %v", i+1, at, latest)
		}
	}
	// Key a, drained at 10 s, has refilled nothing: its retry is a whole
	// second from 10 s, not from the clock's 9.9 s.
	clock.Set(9900 * time.Millisecond)
	decide(one)
	if d.Allowed || d.RetryAfter != time.Second {
		t.Errorf("at 10 s again, drained at 10 s: allowed %v, retry %v; want refused, retry 1s", d.Allowed, d.RetryAfter)
	}
}
