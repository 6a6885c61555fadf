package storetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
)

// Factory returns a new, empty store for one test. clock is the time source
// the store must use; nil means the real clock. The factory registers the
// store's cleanup with t.
type Factory func(t *testing.T, clock func() time.Time) admit.Store

// Run runs the whole suite: every timeline, the concurrency tests,
// Limiter.Wait on the clock and Limiter's other promises.
func Run(t *testing.T, newStore Factory) {
	t.Run("Timelines", func(t *testing.T) { RunTimelines(t, newStore) })
	t.Run("Concurrency", func(t *testing.T) { RunConcurrency(t, newStore) })
	t.Run("Wait", func(t *testing.T) { RunWait(t, newStore) })
	t.Run("Limiter", func(t *testing.T) { RunLimiter(t, newStore) })
	t.Run("Refunds", func(t *testing.T) { RunRefunds(t, newStore) })
	t.Run("ShareRenewals", func(t *testing.T) { RunShareRenewals(t, newStore) })
	t.Run("Counted", func(t *testing.T) { RunCounted(t, newStore) })
}

// RunTimelines runs every timeline, each against a new store.
func RunTimelines(t *testing.T, newStore Factory) {
	RunTimelinesOf(t, newStore, Timelines())
}

// RunTimelinesOf runs the timelines tls, each against a new store.
func RunTimelinesOf(t *testing.T, newStore Factory, tls []Timeline) {
	for _, tl := range tls {
		t.Run(tl.Name, func(t *testing.T) {
			t.Parallel()
			clock := NewClock()
			s := newStore(t, clock.Now)
			tl.run(t, s, clock)
		})
	}
}

// Op is what a step does.
type Op int

// The operations of a step.
const (
	Decide Op = iota
	Reserve
	Cancel
	Renew
	Release
	Reset
)

// Step is one event of a timeline: at At after Epoch, do Op with the
// timeline's charges Use (all when nil) at Cost, and compare with the
// expectations that are set.
type Step struct {
	At   time.Duration
	Op   Op
	Use  []int
	Cost int64

	// Name saves the lease of a Decide or the reservation of a Reserve
	// under a name, or names the one Cancel, Renew or Release acts on.
	Name string
	// MaxWait is Reserve's maximum wait.
	MaxWait time.Duration
	// DryRun marks every charge of a Decide step as a dry run.
	DryRun bool
	// Debits are the timeline's charges (indexes, as in Use) that this
	// step charges as debits; Costs, when set, gives each used charge its
	// own cost in place of Cost.
	Debits []int
	Costs  []int64

	Want      bool    // Decide: allowed; Reserve: OK
	Remaining []int64 // per used charge, if set
	Retry     *time.Duration
	Reset     *time.Duration
	Wait      *time.Duration // Reserve
	DeniedBy  string         // Decide, if set
	// Fits, when set, is each used charge's own Allowed (a debit's says
	// whether it fitted) and RuleRetry its own RetryAfter.
	Fits      []bool
	RuleRetry []time.Duration
	Err       error // an error of its code (admit.ErrorCode), if set
}

// Timeline is a named list of charges and the steps that use them.
type Timeline struct {
	Name    string
	Charges []admit.Charge
	Steps   []Step
}

// Leased returns the timelines tls with every rule that can be leased
// (admit.Algorithm.Leasable) made leased, and the others as they are.
func Leased(tls []Timeline) []Timeline {
	out := make([]Timeline, len(tls))
	for i, tl := range tls {
		leased := map[*admit.Rule]*admit.Rule{}
		tl.Charges = slices.Clone(tl.Charges)
		for j := range tl.Charges {
			r := tl.Charges[j].Rule
			if r == nil || !engine.Leasable(r.Algorithm) {
				continue
			}
			if leased[r] == nil {
				l := *r
				l.Distribution = admit.Leased
				leased[r] = &l
			}
			tl.Charges[j].Rule = leased[r]
		}
		out[i] = tl
	}
	return out
}

// D returns a pointer to d, for the optional fields of Step.
func D(d time.Duration) *time.Duration { return &d }

func (tl Timeline) run(t *testing.T, s admit.Store, clock *Clock) {
	ctx := context.Background()
	names := map[string]string{}
	var d admit.Decision
	for i, st := range tl.Steps {
		clock.Set(st.At)
		charges := tl.pick(st)
		where := fmt.Sprintf("step %d (at %v, op %d, cost %d)", i, st.At, st.Op, st.Cost)
		var err error
		switch st.Op {
		case Decide:
			err = s.Decide(ctx, charges, &d)
			if err == nil {
				checkDecision(t, where, st, &d)
				if st.Name != "" && d.Lease.ID != "" {
					names[st.Name] = d.Lease.ID
				}
			}
		case Reserve:
			var r admit.Reservation
			r, err = s.Reserve(ctx, charges, st.MaxWait)
			if err == nil {
				if r.OK != st.Want {
					t.Errorf("%s: reservation OK = %v, want %v (wait %v)", where, r.OK, st.Want, r.Wait)
				}
				if st.Wait != nil && r.Wait != *st.Wait {
					t.Errorf("%s: wait = %v, want %v", where, r.Wait, *st.Wait)
				}
				if r.OK && st.Name != "" {
					names[st.Name] = r.ID
				}
			}
		case Cancel:
			err = s.CancelReservation(ctx, names[st.Name])
		case Renew:
			var l admit.Lease
			l, err = s.RenewLease(ctx, names[st.Name])
			if err == nil && st.Reset != nil && l.ExpiresAt.Sub(clock.Now()) != *st.Reset {
				t.Errorf("%s: renewed lease expires in %v, want %v", where, l.ExpiresAt.Sub(clock.Now()), *st.Reset)
			}
		case Release:
			err = s.ReleaseLease(ctx, names[st.Name])
		case Reset:
			err = s.Reset(ctx, charges)
		}
		switch {
		case st.Err == nil && err != nil:
			t.Fatalf("%s: unexpected error %v", where, err)
		case st.Err != nil && (err == nil || admit.ErrorCode(err) != admit.ErrorCode(st.Err)):
			t.Fatalf("%s: error %v, want %v", where, err, st.Err)
		}
	}
}

func (tl Timeline) pick(st Step) []admit.Charge {
	idx := st.Use
	if idx == nil {
		idx = make([]int, len(tl.Charges))
		for i := range idx {
			idx[i] = i
		}
	}
	cs := make([]admit.Charge, len(idx))
	for k, i := range idx {
		cs[k] = tl.Charges[i]
		cs[k].Cost = st.Cost
		if st.Costs != nil {
			cs[k].Cost = st.Costs[k]
		}
		cs[k].DryRun = st.DryRun
		cs[k].Debit = slices.Contains(st.Debits, i)
	}
	return cs
}

func checkDecision(t *testing.T, where string, st Step, d *admit.Decision) {
	t.Helper()
	var detail strings.Builder
	for _, r := range d.Results {
		fmt.Fprintf(&detail, " [%s ok=%v rem=%d retry=%v reset=%v]", r.Rule, r.Allowed, r.Remaining, r.RetryAfter, r.ResetAfter)
	}
	if d.Allowed != st.Want {
		t.Errorf("%s: allowed = %v, want %v;%s", where, d.Allowed, st.Want, detail.String())
	}
	if st.Remaining != nil {
		got := make([]int64, len(d.Results))
		for i, r := range d.Results {
			got[i] = r.Remaining
		}
		if fmt.Sprint(got) != fmt.Sprint(st.Remaining) {
			t.Errorf("%s: remaining = %v, want %v;%s", where, got, st.Remaining, detail.String())
		}
	}
	if len(d.Results) < max(len(st.Fits), len(st.RuleRetry)) {
		t.Errorf("%s: %d results, want %d at least;%s", where, len(d.Results), max(len(st.Fits), len(st.RuleRetry)), detail.String())
		return
	}
	for i, want := range st.Fits {
		if d.Results[i].Allowed != want {
			t.Errorf("%s: charge %d allowed = %v, want %v;%s", where, i, d.Results[i].Allowed, want, detail.String())
		}
	}
	for i, want := range st.RuleRetry {
		if d.Results[i].RetryAfter != want {
			t.Errorf("%s: charge %d retry after = %v, want %v;%s", where, i, d.Results[i].RetryAfter, want, detail.String())
		}
	}
	if st.Retry != nil && d.RetryAfter != *st.Retry {
		t.Errorf("%s: retry after = %v, want %v;%s", where, d.RetryAfter, *st.Retry, detail.String())
	}
	if st.Reset != nil && d.ResetAfter != *st.Reset {
		t.Errorf("%s: reset after = %v, want %v;%s", where, d.ResetAfter, *st.Reset, detail.String())
	}
	if st.DeniedBy != "" && d.DeniedBy != st.DeniedBy {
		t.Errorf("%s: denied by %q, want %q", where, d.DeniedBy, st.DeniedBy)
	}
	if !d.Allowed && d.DeniedBy == "" {
		t.Errorf("%s: refused without naming the rule", where)
	}
}

// The errors steps expect, matched by their codes.
var (
	errInvalid  = admit.Errorf(admit.CodeInvalid, "invalid")
	errNotFound = admit.Errorf(admit.CodeNotFound, "not found")
)

// Check decides charges with s and returns the decision, for tests that
// decide once; hot paths call s.Decide with a reused Decision.
func Check(ctx context.Context, s admit.Store, charges ...admit.Charge) (admit.Decision, error) {
	var d admit.Decision
	err := s.Decide(ctx, charges, &d)
	return d, err
}
