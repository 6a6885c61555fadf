package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
)

// RunRefunds checks engine.Refunder: what a refund gives back, to which
// window, and never past the limit. Every Admit store implements it.
func RunRefunds(t *testing.T, newStore Factory) {
	minute := time.Minute
	rules := []*admit.Rule{
		{Name: "bucket", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 10, Per: time.Minute}, Burst: 10},
		{Name: "gcra", Algorithm: admit.GCRA, Rate: admit.Rate{N: 10, Per: time.Minute}, Burst: 10},
		{Name: "fixed", Algorithm: admit.FixedWindow, Limit: 10, Window: minute},
		{Name: "sliding", Algorithm: admit.SlidingWindow, Limit: 10, Window: minute},
		{Name: "quota", Algorithm: admit.Quota, Limit: 10, Period: admit.Day, Location: time.UTC},
		{Name: "first-hit", Algorithm: admit.FirstHitWindow, Limit: 10, Window: minute},
	}
	for _, r := range rules {
		t.Run(r.Name, func(t *testing.T) {
			t.Parallel()
			clock := NewClock()
			s := newStore(t, clock.Now)
			f, ok := s.(engine.Refunder)
			if !ok {
				t.Fatalf("%T does not implement engine.Refunder", s)
			}
			ctx := context.Background()
			key := "refund:" + r.Name
			at := func(d time.Duration, cost int64) admit.Decision {
				t.Helper()
				clock.Set(d)
				dec, err := Check(ctx, s, admit.Charge{Key: key, Rule: r, Cost: cost})
				if err != nil {
					t.Fatal(err)
				}
				return dec
			}
			refund := func(d time.Duration, cost int64, when time.Time) {
				t.Helper()
				clock.Set(d)
				if err := f.Refund(ctx, []admit.Charge{{Key: key, Rule: r, Cost: cost}}, when); err != nil {
					t.Fatal(err)
				}
			}
			// Within one window: what was taken comes back, never more
			// than the limit.
			d := at(0, 8)
			if !d.Allowed || d.Remaining != 2 {
				t.Fatalf("charge 8: %+v", d)
			}
			if !d.At.Equal(Epoch) {
				t.Fatalf("Decision.At = %v, want the store's clock %v", d.At, Epoch)
			}
			refund(time.Second, 5, d.At)
			if d := at(time.Second, 0); d.Remaining != 7 {
				t.Fatalf("after a refund of 5: remaining %d, want 7", d.Remaining)
			}
			refund(time.Second, 50, d.At)
			if d := at(time.Second, 0); d.Remaining != 10 {
				t.Fatalf("after refunding more than was taken: remaining %d, want the limit 10", d.Remaining)
			}
			// Across a window's end: a window or quota gets nothing back
			// from a charge counted in a window that has ended, so the
			// new one never holds more than its limit.
			next := minute
			if r.Algorithm == admit.Quota {
				next = 24 * time.Hour
			}
			if r.Algorithm == admit.SlidingWindow {
				next = 2 * minute // both counts slid out
			}
			d = at(next-time.Second, 9)
			if !d.Allowed {
				t.Fatalf("charge 9 late in the window: %+v", d)
			}
			if now := at(next+time.Second, 1); !now.Allowed {
				t.Fatalf("charge 1 after the window's end: %+v", now)
			}
			refund(next+time.Second, 9, d.At)
			// A bucket gets its 9 back: 10 − 9 + 1/3 (2 s of refill) − 1
			// + 9. A sliding window gets them back from its previous
			// window's count, now weighing 59/60 of it. A fixed window or
			// quota gets nothing: the new window still counts its 1.
			if got := at(next+time.Second, 0).Remaining; got != 9 {
				t.Fatalf("after a refund of a charge made in the previous window: remaining %d, want 9", got)
			}
		})
	}
	t.Run("refused_algorithms", func(t *testing.T) {
		s := newStore(t, NewClock().Now)
		f := s.(engine.Refunder)
		for _, r := range []*admit.Rule{
			{Name: "log", Algorithm: admit.SlidingLog, Limit: 10, Window: time.Minute},
			{Name: "conc", Algorithm: admit.Concurrency, Max: 3},
		} {
			err := f.Refund(context.Background(), []admit.Charge{{Key: "k:" + r.Name, Rule: r, Cost: 1}}, Epoch)
			if admit.ErrorCode(err) != admit.CodeInvalid {
				t.Errorf("refund of %v: %v, want an invalid-argument error", r.Algorithm, err)
			}
		}
	})
}
