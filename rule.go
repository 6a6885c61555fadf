package admit

import (
	"errors"
	"time"

	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/slots"
	"github.com/admitdev/admit/internal/wide"
)

// Algorithm names a rate limiting algorithm. The zero Algorithm is invalid,
// so that a rule that forgot to name one is refused rather than guessed.
type Algorithm uint8

// The algorithms. Their parameters and the meaning of remaining, reset-after
// and retry-after are documented on Rule.
const (
	TokenBucket Algorithm = iota + 1
	GCRA
	FixedWindow
	SlidingWindow
	SlidingLog
	Combination
	Concurrency
	Quota
	FirstHitWindow
)

var algorithmNames = [...]string{
	TokenBucket:   "token_bucket",
	GCRA:          "gcra",
	FixedWindow:   "fixed_window",
	SlidingWindow: "sliding_window",
	SlidingLog:    "sliding_log",
	Combination:   "combination",
	Concurrency:   "concurrency",
	Quota:         "quota",
	// The name says what sets the window's start, as the other names say
	// their shape.
	FirstHitWindow: "first_hit_window",
}

// String returns the configuration name of a, such as "token_bucket".
func (a Algorithm) String() string {
	if a > 0 && int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return "invalid"
}

// FailureMode says what a decision does when the store cannot answer.
// The zero FailureMode defers to the deployment's default.
type FailureMode uint8

// The failure modes: what a rule decides when its store fails.
const (
	FailDefault FailureMode = iota // use the configured default
	FailOpen                       // admit, and count it
	FailClosed                     // refuse with "unavailable"
	FailLocal                      // decide with an in-process limiter
)

var failureNames = [...]string{FailDefault: "", FailOpen: "open", FailClosed: "closed", FailLocal: "local"}

// String returns "open", "closed", "local" or "" for FailDefault.
func (m FailureMode) String() string {
	if int(m) < len(failureNames) {
		return failureNames[m]
	}
	return "invalid"
}

// Distribution says how servers sharing a store decide a rule's charges.
// The zero Distribution is Exact.
type Distribution uint8

const (
	// Exact decides every charge in the shared store: the limit and every
	// reported remaining are exact across servers.
	Exact Distribution = iota
	// Leased lets each server withdraw allowances (batches of tokens or
	// window counts) from the shared state and decide from them locally.
	// Nothing is ever admitted beyond the limit, since an allowance is
	// withdrawn before it is used; what servers hold unused is admitted
	// by none until it is returned or expires. A store that is not shared
	// (the memory store) decides leased rules exactly. Token buckets, GCRA,
	// fixed and sliding windows and quotas can be leased.
	Leased
	// Counted keeps a fixed window's count where a store shared by
	// servers adds to it with its cheapest means (the Redis store: plain
	// pipelined INCRBY, no script), apart from the counts of the rule's
	// other distributions. A debit is counted whatever the count holds,
	// as envoyproxy/ratelimit counts hits. Any other charge is counted at
	// once and taken back when it does not fit or its decision is
	// refused: decisions stay all or nothing and never admit past the
	// limit, but a count taken back was visible to other decisions for
	// that moment, which may refuse one of them. Only fixed windows are
	// counted, and no fair shares. Configuration files cannot name it: it
	// is for adapters that count a fixed window's hits (envoyrls).
	Counted
)

var distributionNames = [...]string{Exact: "exact", Leased: "leased", Counted: "counted"}

// String returns "exact", "leased" or "counted".
func (d Distribution) String() string {
	if int(d) < len(distributionNames) {
		return distributionNames[d]
	}
	return "invalid"
}

// leasable reports whether a rule of algorithm a can have its capacity
// leased in allowances: a count of units that any server may spend where
// and when it likes within the allowance's life. The sliding log (whose
// entries are times), combinations (two buckets whose order matters) and
// concurrency (slots that are held, not spent) cannot. The algorithms that
// take debits are the same.
func leasable(a Algorithm) bool {
	switch a {
	case TokenBucket, GCRA, FixedWindow, SlidingWindow, Quota, FirstHitWindow:
		return true
	}
	return false
}

// takesDebits reports whether a rule of algorithm a takes debits: the
// algorithms that can be leased, whose units may be spent ahead.
func takesDebits(a Algorithm) bool { return leasable(a) }

// Rule is one limit: an algorithm with its parameters, and how a decision
// treats it. Which requests a rule applies to (scope, actions) is the
// policy's business; a store only needs what is here.
//
// Parameters by algorithm:
//
//   - TokenBucket: Rate, Burst, Initial. Tokens refill continuously at Rate up
//     to Burst; a new key holds Initial tokens (Burst when Initial is nil). A
//     request of cost c is admitted iff the bucket holds at least c tokens.
//     Remaining is the whole tokens left; ResetAfter the time until the
//     bucket is full; RetryAfter the time until c tokens are there.
//   - GCRA: Rate, Burst. The generic cell rate algorithm (a leaky bucket as
//     a meter): the same decisions as a token bucket that starts full, kept
//     as one theoretical arrival time.
//   - FixedWindow: Limit, Window. A counter per window aligned to the Unix
//     epoch. ResetAfter and RetryAfter are the time to the window's end.
//     When Limit changes, the window in progress keeps its count; a key
//     counts the windows of each Window length apart, so a new length
//     counts from zero, once. A clock stepped back into an earlier window
//     finds the later window's count in the memory store, which keeps one
//     window a key and length (the Redis store keeps each window's count
//     apart).
//   - SlidingWindow: Limit, Window. The sliding window counter: the current
//     window's count plus the previous window's count weighted by the part
//     of it still inside the sliding window. RetryAfter is exact for that
//     estimate; ResetAfter is the time until the estimate falls to zero.
//   - SlidingLog: Limit (at most 10,000), Window. An exact log of
//     admission times. RetryAfter is the time until enough entries leave the
//     window; ResetAfter until the newest one does.
//   - Combination: Floor, Rate, Burst, Initial. A floor bucket (rate Floor,
//     burst Floor.N) is tried first, then a burst bucket (Rate, Burst,
//     Initial). Remaining and Limit add both buckets.
//   - Concurrency: Max, LeaseTTL. Admitted iff live leases plus the cost
//     stay within Max; an admitted decision holds a lease until it is
//     released or expires. RetryAfter is the time until enough leases would
//     expire if none were renewed.
//   - Quota: Limit, Period, Location, Anchor. A counter per calendar period:
//     a day, week, month or year in Location's time (UTC when nil), which
//     is why a day may last 23 or 25 hours. Periods start at Anchor's
//     position in its period: its time of day for a day, its weekday and
//     time for a week, its day of the month and time for a month, its date
//     and time for a year; the zero Anchor is the calendar's (midnight,
//     Monday, the 1st, the 1st of January). An anchor day a month lacks
//     (the 31st, the 29th of February) falls on that month's last day. ResetAfter and RetryAfter are
//     the time to the period's end. A period in progress keeps its end when
//     the anchor changes: the new anchor applies from the next period.
//   - FirstHitWindow: Limit, Window. A counter per key whose window starts
//     at the first charge after the previous window ended, as Limitador's
//     counters and Redis's INCR-and-EXPIRE counters run: a key first
//     charged at 12:00:40 under a one-minute window counts until
//     12:01:40. ResetAfter and RetryAfter are the time to the window's
//     end. When Limit or Window changes, the window in progress keeps its
//     count and its end. It cannot be counted, nor held across regions; a
//     refund, or a leased allowance's units, go back only to the window
//     they were taken from.
//
// A key keeps what it holds when its rule changes (charges of the key under
// a rule of other parameters, after a reload or a deploy): a TokenBucket or
// GCRA keeps its tokens, capped at the new Burst, and its debt, as the time
// the old Rate takes to repay it, then refills at the new Rate; a
// Combination keeps both buckets so; a window or quota keeps the count of
// its period in progress when its limit changes (a SlidingWindow of
// another length counts all the old one counted); a concurrency rule keeps
// its leases. A full bucket is not kept by the stores: it starts as a new
// key of the new rule, at its Initial balance if it has one.
// A clock stepped back costs a bucket tokens (it reads its time as further
// ahead), never admitting more.
//
// A Rule is read, never written, by stores; share one *Rule among all the
// charges that use it, and do not change it while decisions use it.
type Rule struct {
	Name      string
	Algorithm Algorithm

	Rate    Rate   // token_bucket, gcra, combination (the burst bucket)
	Burst   int64  // token_bucket, gcra, combination
	Initial *int64 // token_bucket, combination; nil means Burst
	Floor   Rate   // combination

	Limit  int64         // fixed_window, sliding_window, sliding_log
	Window time.Duration // fixed_window, sliding_window, sliding_log

	Max      int64         // concurrency
	LeaseTTL time.Duration // concurrency; zero means 30s

	Period   Period         // quota
	Location *time.Location // quota; nil means UTC
	Anchor   time.Time      // quota; the zero Time means the calendar's

	// MaxCost bounds the cost of one charge of the rule, debits included:
	// a larger cost is a request error. Zero bounds a charge only by what
	// the rule can admit at once and a debit only by the most any charge
	// costs (1,000,000,000). A policy that serves untrusted callers sets
	// it, since a debit is never refused and one debit of any size would
	// otherwise empty a bucket that other callers share.
	MaxCost int64

	// ShareCeiling bounds, when the rule's charges carry a Share
	// (Charge.Share), what one class of callers takes of the rule beyond
	// its part, in the rule's units (from 0 to its Capacity; zero means
	// half of it): the slots of a concurrency rule it holds, and, while
	// it is the only class asking, the part of a bucket's burst or of a
	// window's limit it takes at once (its rate is the rule's). So a class
	// arriving later finds its share at once.
	ShareCeiling int64

	// MaxDebt bounds what a token bucket or GCRA rule owes after debits
	// (see Charge.Debit), in tokens: a debit beyond what the bucket holds
	// puts it into debt, repaid at its rate, of at most MaxDebt. Zero
	// means one burst. A rule whose debits are costs known after the work
	// (an LLM call's tokens) sets it high, or what was used beyond the
	// debt would go uncounted.
	MaxDebt int64

	// Shadow rules are decided and reported but never refuse a request.
	Shadow bool
	// OnError overrides the deployment's failure mode for this rule.
	OnError FailureMode
	// Distribution says whether servers sharing the store decide this
	// rule exactly (the default) or from leased allowances.
	Distribution Distribution

	// Prepared is what a store derived from the rule the first time it
	// decided by it (its checked parameters, its buckets), derived again
	// when they change. Leave it zero; a copy of a rule is prepared on
	// its own.
	Prepared slots.Rule
}

// Validate reports every parameter of r that is missing or out of
// bounds: one *Error, or, for several, their errors.Join, the first of
// them the one ErrorField and ErrorCode find. Stores validate every rule
// they are given; Validate lets a configuration loader do it once, up
// front.
func (r *Rule) Validate() error {
	if r == nil {
		return Errorf(CodeInvalid, "rule is nil")
	}
	var errs []error
	add := func(field string, err error) { errs = append(errs, r.fail(field, err)) }
	switch {
	case r.Distribution > Counted:
		add("distribution", Errorf(CodeInvalid, "unknown distribution %d", r.Distribution))
	case r.Distribution == Counted && r.Algorithm != FixedWindow:
		add("distribution", Errorf(CodeInvalid, "only fixed_window counts every charge on its own, not %v", r.Algorithm))
	case r.Distribution == Leased && r.Algorithm != 0 && !leasable(r.Algorithm):
		add("distribution", Errorf(CodeInvalid, "%v cannot be leased; token_bucket, gcra, fixed_window, sliding_window, quota and first_hit_window can", r.Algorithm))
	}
	if r.MaxCost < 0 || r.MaxCost > bounds.MaxCost {
		add("max_cost", Errorf(CodeInvalid, "must be from 0 (no bound of its own) to %d", int64(bounds.MaxCost)))
	}
	if r.MaxDebt != 0 && r.Algorithm != TokenBucket && r.Algorithm != GCRA {
		add("max_debt", Errorf(CodeInvalid, "only token_bucket and gcra owe a debt of their own bound; a combination owes one burst, a window counts debits up to %d", int64(bounds.MaxCount)))
	}
	switch r.Algorithm {
	case TokenBucket, GCRA, Combination:
		rateErr := r.Rate.validate()
		if rateErr != nil {
			add("rate", rateErr)
		}
		// A burst's refill time needs a valid rate; its range does not.
		if err := checkBucket(r.Rate, r.Burst); err != nil && (rateErr == nil || r.Burst < 1 || r.Burst > bounds.MaxCount) {
			if rateErr != nil {
				err = Errorf(CodeInvalid, "must be from 1 to %d", int64(bounds.MaxCount))
			}
			add("burst", err)
		}
		if r.Initial != nil {
			if r.Algorithm == GCRA {
				add("initial", Errorf(CodeInvalid, "gcra starts full; use token_bucket for an initial balance"))
			} else if *r.Initial < 0 || *r.Initial > r.Burst {
				add("initial", Errorf(CodeInvalid, "initial must be from 0 to burst (%d)", r.Burst))
			}
		}
		if r.MaxDebt != 0 && r.Algorithm != Combination && rateErr == nil {
			if err := checkBucket(r.Rate, r.MaxDebt); err != nil {
				add("max_debt", err)
			}
		}
		if r.Algorithm == Combination {
			if err := r.Floor.validate(); err != nil {
				add("floor", err)
			} else if err := checkBucket(r.Floor, r.Floor.N); err != nil {
				add("floor", err)
			}
		}
	case FixedWindow, SlidingWindow, SlidingLog, FirstHitWindow:
		max := int64(bounds.MaxCount)
		if r.Algorithm == SlidingLog {
			max = bounds.MaxSlidingLogLimit
		}
		if r.Limit < 1 || r.Limit > max {
			add("limit", Errorf(CodeInvalid, "must be from 1 to %d", max))
		}
		if r.Window < time.Millisecond || r.Window > bounds.MaxRatePeriod {
			add("window", Errorf(CodeInvalid, "must be from 1ms to %v", bounds.MaxRatePeriod))
		}
	case Quota:
		if r.Limit < 1 || r.Limit > bounds.MaxCount {
			add("limit", Errorf(CodeInvalid, "must be from 1 to %d", int64(bounds.MaxCount)))
		}
		if r.Period < Day || r.Period > Year {
			add("period", Errorf(CodeInvalid, "want day, week, month or year"))
		}
		if r.Anchor.Nanosecond() != 0 {
			add("anchor", Errorf(CodeInvalid, "must be a whole second"))
		}
	case Concurrency:
		if r.Max < 1 || r.Max > bounds.MaxConcurrency {
			add("max", Errorf(CodeInvalid, "must be from 1 to %d", bounds.MaxConcurrency))
		}
		if r.LeaseTTL < 0 || r.LeaseTTL > bounds.MaxRatePeriod {
			add("lease_ttl", Errorf(CodeInvalid, "must be from 0 to %v", bounds.MaxRatePeriod))
		}
	default:
		e := Errorf(CodeInvalid, "rule %q: algorithm is not set", r.Name)
		e.Field = "algorithm"
		return e
	}
	if c := r.Capacity(); len(errs) == 0 && (r.ShareCeiling < 0 || r.ShareCeiling > c) {
		add("share_ceiling", Errorf(CodeInvalid, "must be from 0 (half of the rule's capacity) to its capacity (%d)", c))
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return errors.Join(errs...)
}

// fail says that field is at fault: err is what is wrong with it.
func (r *Rule) fail(field string, err error) error {
	e := Errorf(CodeInvalid, "rule %q: %s: %w", r.Name, field, err)
	e.Field = field
	return e
}

// checkBucket bounds burst and burst × interval so that every bucket
// computation fits in int64 nanoseconds.
func checkBucket(rate Rate, burst int64) error {
	if burst < 1 || burst > bounds.MaxCount {
		return Errorf(CodeInvalid, "must be from 1 to %d", int64(bounds.MaxCount))
	}
	// burst*Per/N <= bounds.MaxSpan  <=>  burst*Per <= bounds.MaxSpan*N, compared in 128 bits.
	if wide.Mul(uint64(bounds.MaxSpan), uint64(rate.N)).Less(wide.Mul(uint64(burst), uint64(rate.Per))) {
		return Errorf(CodeInvalid, "burst %d at %v takes longer than 100 years to refill", burst, rate)
	}
	return nil
}

// Capacity returns the number a decision reports as the rule's limit: the
// burst of a bucket, both bursts of a combination, the limit of a window,
// the max of a concurrency rule.
func (r *Rule) Capacity() int64 {
	switch r.Algorithm {
	case TokenBucket, GCRA:
		return r.Burst
	case Combination:
		return r.Burst + r.Floor.N
	case Concurrency:
		return r.Max
	default:
		return r.Limit
	}
}
