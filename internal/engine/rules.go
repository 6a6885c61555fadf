package engine

import (
	"context"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
)

// What a store asks of a rule and a charge before it decides, and how it
// sums up the results it decided.

// A Refunder gives back what admitted charges took, when the cost turns
// out smaller than the one charged (an LLM call reserved for its longest
// answer and gave a short one). Stores that keep counts implement it.
type Refunder interface {
	// Refund gives back each charge's Cost to its key, as charged by a
	// decision made at the store's time at (Decision.At): a token bucket
	// or GCRA gets the tokens back (never above its burst); a fixed or
	// sliding window or a quota gets them back only while the window or
	// period they were counted in has not ended, and never below zero.
	// Other algorithms are refused with CodeInvalid. What a refund cannot
	// give back (a window that ended) is simply not given back, so a
	// refund never lets more through than a decision at the lower cost
	// would have.
	Refund(ctx context.Context, charges []admit.Charge, at time.Time) error
}

// A RuleChecker is a Store that cannot decide every valid rule, a store
// with bounds of its own (Redis keeps times in whole microseconds and
// windows of at most 52 days): admit.NewLimiter asks it about each limit,
// so that a limit it cannot decide is refused at wiring rather than at
// every request. A Store that wraps another should pass CheckRule on.
type RuleChecker interface {
	// CheckRule reports why the store cannot decide r, a valid rule, or
	// nil.
	CheckRule(r *admit.Rule) error
}

// Summarize sets d's top-level fields from d.Results, once every charge's
// result is in: refused when a charge that is neither shadow nor debit
// refused, reporting the refusal that asks for the longest wait; when
// admitted, the non-shadow charge closest to refusing.
func Summarize(d *admit.Decision) {
	d.Allowed = true
	best := -1
	for i := range d.Results {
		r := &d.Results[i]
		if r.Allowed || r.Shadow || r.Debit {
			continue
		}
		if d.Allowed || r.RetryAfter > d.Results[best].RetryAfter {
			best = i
		}
		d.Allowed = false
	}
	if d.Allowed {
		for i := range d.Results {
			r := &d.Results[i]
			if !r.Shadow && (best < 0 || r.Remaining < d.Results[best].Remaining) {
				best = i
			}
		}
	}
	if best < 0 {
		return
	}
	r := &d.Results[best]
	d.Limit, d.Remaining, d.ResetAfter = r.Limit, r.Remaining, r.ResetAfter
	if !d.Allowed { // an admitted decision's debit may have a RetryAfter
		d.RetryAfter, d.DeniedBy = r.RetryAfter, r.Rule
	}
}

// CheckCost reports whether a request may charge cost to r: cost must be
// from 0 to bounds.MaxCost, no more than r.MaxCost when it is set, and no
// more than the most the rule could ever admit at once (see MostAtOnce) —
// a larger cost is a request error, never a silent refusal.
func CheckCost(r *admit.Rule, cost int64) error {
	if err := checkMaxCost(r, cost); err != nil {
		return err
	}
	if most := MostAtOnce(r); cost > most {
		if r.Algorithm == admit.Concurrency && most == bounds.MaxLeaseCost {
			return costError(cost, "is more slots than one lease takes (%d)", most)
		}
		return costError(cost, "is more than rule %q can ever admit at once (%d)", r.Name, most)
	}
	return nil
}

// MostAtOnce returns the largest cost one request could ever be admitted
// at: the capacity, the larger of a combination's two buckets, or for
// concurrency the slots one lease may take (at most bounds.MaxLeaseCost).
func MostAtOnce(r *admit.Rule) int64 {
	switch r.Algorithm {
	case admit.Combination:
		return max(r.Burst, r.Floor.N)
	case admit.Concurrency:
		return min(r.Max, bounds.MaxLeaseCost)
	}
	return r.Capacity()
}

// checkMaxCost checks cost against bounds.MaxCost and r.MaxCost.
func checkMaxCost(r *admit.Rule, cost int64) error {
	if cost < 0 || cost > bounds.MaxCost {
		return costError(cost, "must be from 0 to %d", int64(bounds.MaxCost))
	}
	if r.MaxCost > 0 && cost > r.MaxCost {
		return costError(cost, "is more than rule %q takes in one charge (max_cost %d)", r.Name, r.MaxCost)
	}
	return nil
}

// costError is an invalid cost, about the field "cost".
func costError(cost int64, format string, args ...any) error {
	e := admit.Errorf(admit.CodeInvalid, "cost %d "+format, append([]any{cost}, args...)...)
	e.Field = "cost"
	return e
}

// TakesDebits reports whether a rule of algorithm a takes debits (see
// Charge.Debit): token buckets, GCRA, fixed, first-hit and sliding
// windows and quotas do. A combination (which half would owe?), a sliding log (one
// entry per unit, which a debt would grow without bound) and concurrency
// (a lease is not a cost) do not.
func TakesDebits(a admit.Algorithm) bool {
	switch a {
	case admit.TokenBucket, admit.GCRA, admit.FixedWindow, admit.SlidingWindow, admit.Quota, admit.FirstHitWindow:
		return true
	}
	return false
}

// CheckDebit reports whether r takes a debit of cost: its algorithm takes
// debits (TakesDebits), of any cost from 0 to bounds.MaxCost (a Counted
// window without a MaxCost of its own up to bounds.MaxCount, the most it
// counts), and to r.MaxCost when it is set.
func CheckDebit(r *admit.Rule, cost int64) error {
	if r.Distribution == admit.Counted && r.MaxCost == 0 && cost > bounds.MaxCost && cost <= bounds.MaxCount {
		return nil
	}
	if err := checkMaxCost(r, cost); err != nil {
		return err
	}
	if TakesDebits(r.Algorithm) {
		return nil
	}
	e := admit.Errorf(admit.CodeInvalid, "rule %q: %v takes no debits; token_bucket, gcra, fixed_window, sliding_window and quota do", r.Name, r.Algorithm)
	e.Field = "debit"
	return e
}

// CheckRefund reports whether r takes refunds: the algorithms that take
// debits do (see Refunder).
func CheckRefund(r *admit.Rule, cost int64) error {
	if err := CheckDebit(r, cost); err != nil {
		e := admit.Errorf(admit.CodeInvalid, "rule %q: %v takes no refunds; token_bucket, gcra, fixed_window, sliding_window and quota do", r.Name, r.Algorithm)
		e.Field = "refund"
		return e
	}
	return nil
}

// Leasable reports whether a rule of algorithm a can have its capacity
// leased in allowances: a count of units that any server may spend where
// and when it likes within the allowance's life. The sliding log (whose
// entries are times), combinations (two buckets whose order matters) and
// concurrency (slots that are held, not spent) cannot.
func Leasable(a admit.Algorithm) bool { return TakesDebits(a) }

// Reservable reports whether a rule of algorithm a can book future
// capacity: token buckets and GCRA can.
func Reservable(a admit.Algorithm) bool { return a == admit.TokenBucket || a == admit.GCRA }

// LeaseTTL returns r.LeaseTTL, or bounds.DefaultLeaseTTL when it is zero.
func LeaseTTL(r *admit.Rule) time.Duration {
	if r.LeaseTTL > 0 {
		return r.LeaseTTL
	}
	return bounds.DefaultLeaseTTL
}

// MostDebt returns the largest MaxDebt a bucket of rate may owe:
// bounds.MaxCount tokens, or what it repays in 100 years if that is less.
func MostDebt(rate admit.Rate) int64 { return bounds.MostDebt(rate.N, rate.Per) }

// CheckShare reports whether s is a share a store can keep: a class (or
// none, for no share) and weight within bounds.
func CheckShare(s *admit.Share) error {
	switch {
	case s.Class == "":
		return admit.Errorf(admit.CodeInvalid, "share: class is empty")
	case len(s.Class) > bounds.MaxShareName || len(s.Sub) > bounds.MaxShareName:
		return admit.Errorf(admit.CodeInvalid, "share: class and sub are at most %d bytes", bounds.MaxShareName)
	case s.Weight < 1 || s.Weight > bounds.MaxShareWeight:
		return admit.Errorf(admit.CodeInvalid, "share: weight %d: must be from 1 to %d", s.Weight, bounds.MaxShareWeight)
	}
	return nil
}

// ErrEmptyKey refuses a charge whose key is empty: every request charged
// so would share one state.
var ErrEmptyKey = &admit.Error{Code: admit.CodeInvalid, Field: "key", Message: "a charge has an empty key, which every caller would share; build keys with admit.Key"}
