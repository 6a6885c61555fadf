package storetest

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
)

// RunCounted checks rules of distribution admit.Counted: every debit is
// counted past the limit and reports its place; a dry run reads without
// counting; a check is all or nothing with the decision's other charges; a
// counted debit beside a refusing charge is counted all the same; refunds
// and resets apply; concurrent debits of one key each get a place of their
// own, and concurrent checks admit exactly the limit.
func RunCounted(t *testing.T, newStore Factory) {
	ctx := context.Background()
	// Each test has rules of its own: a store prepares a rule on first
	// use, which a copy of it made by another test would race with.
	newRule := func() *admit.Rule {
		return &admit.Rule{Name: "hits", Algorithm: admit.FixedWindow, Limit: 3, Window: time.Minute, Distribution: admit.Counted}
	}
	t.Run("timeline", func(t *testing.T) {
		t.Parallel()
		rule := newRule()
		clock := NewClock()
		s := newStore(t, clock.Now)
		clock.Set(10 * time.Second)
		debit := func(key string, cost int64) admit.Result {
			t.Helper()
			var d admit.Decision
			if err := s.Decide(ctx, []admit.Charge{{Key: key, Rule: rule, Cost: cost, Debit: true}}, &d); err != nil {
				t.Fatal(err)
			}
			if !d.Allowed || len(d.Results) != 1 {
				t.Fatalf("a debit refused its decision: %+v", d)
			}
			return d.Results[0]
		}
		type want struct {
			allowed         bool
			remaining, over int64
			retry           time.Duration
		}
		for i, w := range []want{{true, 2, 0, 0}, {true, 1, 0, 0}, {true, 0, 0, 0}, {false, 0, 1, 50 * time.Second}, {false, 0, 2, 50 * time.Second}} {
			r := debit("k", 1)
			if r.Allowed != w.allowed || r.Remaining != w.remaining || r.Over != w.over || r.RetryAfter != w.retry || r.ResetAfter != 50*time.Second || !r.Debit || r.Limit != 3 {
				t.Fatalf("debit %d: %+v, want %+v and a reset in 50s", i+1, r, w)
			}
		}
		// A check (cost 0) counts nothing and finds the count over.
		if r := debit("k", 0); r.Allowed || r.Over != 2 {
			t.Fatalf("check: %+v", r)
		}
		// A dry run of cost 1 reads: over, nothing remaining.
		var d admit.Decision
		if err := s.Decide(ctx, []admit.Charge{{Key: "k", Rule: rule, Cost: 1, DryRun: true}}, &d); err != nil || d.Allowed || d.Results[0].Remaining != 0 {
			t.Fatalf("dry run: %+v, %v", d, err)
		}
		// Another key, dry then for real.
		if err := s.Decide(ctx, []admit.Charge{{Key: "other", Rule: rule, Cost: 2, DryRun: true}}, &d); err != nil || !d.Allowed || d.Results[0].Remaining != 1 {
			t.Fatalf("dry run of a fresh key: %+v, %v", d, err)
		}
		if r := debit("other", 1); r.Remaining != 2 {
			t.Fatalf("the dry run counted: %+v", r)
		}
		// A counted debit takes any cost up to bounds.MaxCount.
		huge := newRule()
		huge.Limit = bounds.MaxCount
		if err := s.Decide(ctx, []admit.Charge{{Key: "huge", Rule: huge, Cost: 3_000_000_000, Debit: true}}, &d); err != nil || !d.Allowed || d.Results[0].Remaining != 1_000_000_000 {
			t.Fatalf("a debit of 3e9 of 4e9: %+v, %v", d, err)
		}
		// The next window starts afresh.
		clock.Set(time.Minute + time.Second)
		if r := debit("k", 1); !r.Allowed || r.Remaining != 2 || r.ResetAfter != 59*time.Second {
			t.Fatalf("next window: %+v", r)
		}
		// A charge that is not a debit is all or nothing: counted when it
		// fits (2 of 3 after the debit), refused and not counted when it
		// does not.
		check := func(cost int64) admit.Result {
			t.Helper()
			if err := s.Decide(ctx, []admit.Charge{{Key: "k", Rule: rule, Cost: cost}}, &d); err != nil {
				t.Fatal(err)
			}
			return d.Results[0]
		}
		if r := check(2); !r.Allowed || r.Remaining != 0 || !d.Allowed {
			t.Fatalf("a check of 2 with 2 left: %+v", r)
		}
		if r := check(1); r.Allowed || d.Allowed || r.Remaining != 0 || r.RetryAfter != 59*time.Second {
			t.Fatalf("a check of 1 with none left: %+v", r)
		}
		clock.Set(2*time.Minute + time.Second)
		check(2)
		if r := check(2); r.Allowed || r.Remaining != 1 {
			t.Fatalf("a check of 2 with 1 left: %+v, want refused, 1 remaining", r)
		}
		if r := check(1); !r.Allowed || r.Remaining != 0 {
			t.Fatalf("the refused check was counted: %+v", r)
		}
		// A shadow rule's check over its limit: reported, not counted,
		// the decision admitted.
		shadow := newRule()
		shadow.Shadow = true
		for i := range 5 {
			if err := s.Decide(ctx, []admit.Charge{{Key: "sh", Rule: shadow, Cost: 1}}, &d); err != nil || !d.Allowed || d.Results[0].Allowed != (i < 3) {
				t.Fatalf("shadow check %d: %+v, %v", i+1, d, err)
			}
		}
	})
	// beside sets up a test of a counted rule beside a bucket of burst on
	// a new store: the rule, the bucket, the decision and how to decide.
	beside := func(t *testing.T, burst int64) (*admit.Rule, *admit.Rule, *admit.Decision, func(...admit.Charge)) {
		clock := NewClock()
		s := newStore(t, clock.Now)
		d := new(admit.Decision)
		return newRule(), &admit.Rule{Name: "bucket", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 1, Per: time.Hour}, Burst: burst}, d,
			func(charges ...admit.Charge) {
				t.Helper()
				if err := s.Decide(ctx, charges, d); err != nil {
					t.Fatal(err)
				}
			}
	}
	t.Run("checks beside others", func(t *testing.T) {
		t.Parallel()
		rule, bucket, d, decide := beside(t, 2)
		// The bucket refuses (spent): the counted check is taken back.
		decide(admit.Charge{Key: "b", Rule: bucket, Cost: 2})
		decide(admit.Charge{Key: "k", Rule: rule, Cost: 1}, admit.Charge{Key: "b", Rule: bucket, Cost: 1})
		if d.Allowed || !d.Results[0].Allowed || d.Results[1].Allowed {
			t.Fatalf("the bucket refusing: %+v", d)
		}
		// The count refuses: the bucket is not charged, and a debit
		// beside them is.
		decide(admit.Charge{Key: "k", Rule: rule, Cost: 3})
		decide(admit.Charge{Key: "k", Rule: rule, Cost: 1}, admit.Charge{Key: "b2", Rule: bucket, Cost: 1}, admit.Charge{Key: "owed", Rule: bucket, Cost: 1, Debit: true})
		if d.Allowed || d.Results[0].Allowed || !d.Results[1].Allowed || d.Results[1].Remaining != 2 || !d.Results[2].Allowed || d.Results[2].Remaining != 1 {
			t.Fatalf("the count refusing: %+v, want the bucket reporting what it holds (2) and the debit charged", d)
		}
		decide(admit.Charge{Key: "b2", Rule: bucket, Cost: 2}, admit.Charge{Key: "owed", Rule: bucket, Cost: 0, Debit: true})
		if !d.Allowed || d.Results[1].Remaining != 1 {
			t.Fatalf("b2 was charged, or the debit was not: %+v", d)
		}
	})
	t.Run("dry runs and looks", func(t *testing.T) {
		t.Parallel()
		rule, bucket, d, decide := beside(t, 1)
		// A dry run as a whole, though one charge says so.
		decide(admit.Charge{Key: "k", Rule: rule, Cost: 1, DryRun: true}, admit.Charge{Key: "b", Rule: bucket, Cost: 1})
		decide(admit.Charge{Key: "b", Rule: bucket, Cost: 1})
		if !d.Allowed {
			t.Fatalf("the dry run charged the bucket: %+v", d)
		}
		// A look (cost 0) at a count past its limit refuses the decision,
		// which then charges nothing.
		decide(admit.Charge{Key: "k", Rule: rule, Cost: 4, Debit: true})
		decide(admit.Charge{Key: "k", Rule: rule, Cost: 0}, admit.Charge{Key: "k2", Rule: rule, Cost: 1}, admit.Charge{Key: "b2", Rule: bucket, Cost: 1})
		if d.Allowed {
			t.Fatalf("a look at a spent count: %+v, want refused", d)
		}
		decide(admit.Charge{Key: "k2", Rule: rule, Cost: 3}, admit.Charge{Key: "b2", Rule: bucket, Cost: 1})
		if !d.Allowed {
			t.Fatalf("the refused decision charged: %+v", d)
		}
	})
	t.Run("admitted", func(t *testing.T) {
		t.Parallel()
		clock := NewClock()
		s := newStore(t, clock.Now)
		big := newRule()
		big.Limit = 100
		var admitted atomic.Int64
		hammerN(t, exactAttempts, func(d *admit.Decision) error {
			if err := s.Decide(ctx, []admit.Charge{{Key: "hot", Rule: big, Cost: 1}}, d); err != nil {
				return err
			}
			if d.Allowed {
				admitted.Add(1)
			}
			return nil
		})
		if got := admitted.Load(); got != big.Limit {
			t.Fatalf("%d checks of one key admitted %d, want exactly its limit, %d", exactAttempts, got, big.Limit)
		}
	})
	t.Run("beside a refusal", func(t *testing.T) {
		t.Parallel()
		rule := newRule()
		clock := NewClock()
		s := newStore(t, clock.Now)
		bucket := &admit.Rule{Name: "bucket", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 1, Per: time.Hour}, Burst: 1}
		charges := []admit.Charge{{Key: "b", Rule: bucket, Cost: 1}, {Key: "k", Rule: rule, Cost: 1, Debit: true}, {Key: "b2", Rule: bucket, Cost: 1}}
		var d admit.Decision
		for i := range 2 {
			if err := s.Decide(ctx, charges, &d); err != nil {
				t.Fatal(err)
			}
			if d.Allowed != (i == 0) || d.Results[1].Remaining != int64(2-i) || d.Results[0].Allowed != (i == 0) || d.Results[0].Rule != "bucket" {
				t.Fatalf("decision %d: %+v", i+1, d)
			}
		}
	})
	t.Run("refunds and resets", func(t *testing.T) {
		t.Parallel()
		rule := newRule()
		clock := NewClock()
		s := newStore(t, clock.Now)
		c := admit.Charge{Key: "k", Rule: rule, Cost: 2, Debit: true}
		var d admit.Decision
		if err := s.Decide(ctx, []admit.Charge{c}, &d); err != nil {
			t.Fatal(err)
		}
		if f, ok := s.(engine.Refunder); ok {
			if err := f.Refund(ctx, []admit.Charge{{Key: "k", Rule: rule, Cost: 1}}, d.At); err != nil {
				t.Fatal(err)
			}
			if err := s.Decide(ctx, []admit.Charge{{Key: "k", Rule: rule, Cost: 0, Debit: true}}, &d); err != nil || d.Results[0].Remaining != 2 {
				t.Fatalf("after a refund of 1 of 2: %+v, %v", d.Results, err)
			}
		}
		if err := s.Reset(ctx, []admit.Charge{{Key: "k", Rule: rule}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Decide(ctx, []admit.Charge{c}, &d); err != nil || d.Results[0].Remaining != 1 {
			t.Fatalf("after a reset: %+v, %v", d.Results, err)
		}
	})
	t.Run("places", func(t *testing.T) {
		t.Parallel()
		clock := NewClock()
		s := newStore(t, clock.Now)
		big := newRule()
		big.Limit = 100
		places := make(chan int64, exactAttempts)
		hammerN(t, exactAttempts, func(d *admit.Decision) error {
			if err := s.Decide(ctx, []admit.Charge{{Key: "hot", Rule: big, Cost: 1, Debit: true}}, d); err != nil {
				return err
			}
			r := d.Results[0]
			if r.Allowed {
				places <- big.Limit - r.Remaining
			} else {
				places <- big.Limit + r.Over
			}
			return nil
		})
		close(places)
		var got []int64
		for p := range places {
			got = append(got, p)
		}
		slices.Sort(got)
		for i, p := range got {
			if p != int64(i+1) {
				t.Fatalf("%d debits of one key: place %d is %d; every debit must count once, in a place of its own", exactAttempts, i+1, p)
			}
		}
	})
}
