package admit

import (
	"errors"
	"math/bits"
	"time"
	"unsafe"
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
}

// String returns the configuration name of a, such as "token_bucket".
func (a Algorithm) String() string {
	if a > 0 && int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return "invalid"
}

// ParseAlgorithm returns the Algorithm with the configuration name s. It also
// accepts "leaky_bucket" for GCRA, the leaky bucket as a meter.
func ParseAlgorithm(s string) (Algorithm, error) {
	if s == "leaky_bucket" {
		return GCRA, nil
	}
	for a, name := range algorithmNames {
		if a > 0 && name == s {
			return Algorithm(a), nil
		}
	}
	return 0, Errorf(CodeInvalid, "unknown algorithm %q (want token_bucket, gcra, fixed_window, sliding_window, sliding_log, combination, concurrency or quota)", s)
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

// ParseFailureMode parses "open", "closed", "local" or "" (the default).
func ParseFailureMode(s string) (FailureMode, error) {
	for m, name := range failureNames {
		if name == s {
			return FailureMode(m), nil
		}
	}
	return 0, Errorf(CodeInvalid, "unknown on_error %q (want open, closed or local)", s)
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
	// fixed and sliding windows and quotas can be leased (see
	// Algorithm.Leasable).
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

// ParseDistribution parses "exact", "leased" or "" (exact).
func ParseDistribution(s string) (Distribution, error) {
	if s == "" {
		return Exact, nil
	}
	for d, name := range distributionNames[:Counted] {
		if name == s {
			return Distribution(d), nil
		}
	}
	return 0, Errorf(CodeInvalid, "unknown distribution %q (want exact or leased)", s)
}

// Leasable reports whether a rule of algorithm a can have its capacity
// leased in allowances: a count of units that any server may spend where
// and when it likes within the allowance's life. The sliding log (whose
// entries are times), combinations (two buckets whose order matters) and
// concurrency (slots that are held, not spent) cannot.
func (a Algorithm) Leasable() bool {
	switch a {
	case TokenBucket, GCRA, FixedWindow, SlidingWindow, Quota:
		return true
	}
	return false
}

// Limits on what one rule may hold.
const (
	// MaxSlidingLogLimit caps a sliding log's limit: the log keeps one
	// timestamp per admitted unit of cost, so memory grows with the limit.
	MaxSlidingLogLimit = 10_000
	// MaxConcurrency caps a concurrency rule's max, for the same reason.
	MaxConcurrency = 100_000
	// MaxLeaseCost caps the slots one lease takes. A shared store keeps
	// a slot per unit of cost (Redis: a member of a sorted set each), so
	// taking, renewing and releasing a lease costs the store in
	// proportion: 60,000 slots held Redis for 130 ms, stalling every
	// tenant's decisions.
	MaxLeaseCost = 1000
	// maxSpan bounds burst × interval of a bucket, so that a bucket's
	// theoretical arrival time stays far from the int64 nanosecond horizon.
	maxSpan = 100 * 366 * 24 * time.Hour
	// DefaultLeaseTTL is a concurrency rule's lease TTL when it names none.
	DefaultLeaseTTL = 30 * time.Second
	// RememberFull is how long a store keeps a full token bucket whose
	// initial balance is below its burst. Such a bucket can never look like
	// a new one again, so it is forgotten this long after it filled up: a
	// day after its last use.
	RememberFull = 24 * time.Hour
)

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
//   - SlidingLog: Limit (at most MaxSlidingLogLimit), Window. An exact log of
//     admission times. RetryAfter is the time until enough entries leave the
//     window; ResetAfter until the newest one does.
//   - Combination: Floor, Rate, Burst, Initial. A floor bucket (rate Floor,
//     burst Floor.N) is tried first, then a burst bucket (Rate, Burst,
//     Initial). Remaining and Limit add both buckets.
//   - Concurrency: Max, LeaseTTL. Admitted iff live leases plus the cost
//     stay within Max; an admitted decision holds a lease until it is
//     released or expires. RetryAfter is the time until enough leases would
//     expire if none were renewed.
//   - Quota: Limit, Period, Location, Anchor. A counter per calendar period
//     (see PeriodAt): a day, week, month or year in Location's time, which
//     is why a day may last 23 or 25 hours. ResetAfter and RetryAfter are
//     the time to the period's end. A period in progress keeps its end when
//     the anchor changes: the new anchor applies from the next period.
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
	LeaseTTL time.Duration // concurrency; zero means DefaultLeaseTTL

	Period   Period         // quota
	Location *time.Location // quota; nil means UTC
	Anchor   time.Time      // quota; the zero Time means the calendar's (see PeriodAt)

	// MaxCost bounds the cost of one charge of the rule, debits included:
	// a larger cost is a request error. Zero bounds checks only by what
	// the rule can admit at once (see CheckCost) and debits only by the
	// package's MaxCost. A policy that serves untrusted callers sets it,
	// since a debit is never refused and one debit of any size would
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

	prepared unsafe.Pointer // the engine's preparation of the rule; see package slots
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
	case r.Distribution == Leased && r.Algorithm != 0 && !r.Algorithm.Leasable():
		add("distribution", Errorf(CodeInvalid, "%v cannot be leased; token_bucket, gcra, fixed_window, sliding_window and quota can", r.Algorithm))
	}
	if r.MaxCost < 0 || r.MaxCost > MaxCost {
		add("max_cost", Errorf(CodeInvalid, "must be from 0 (no bound of its own) to %d", int64(MaxCost)))
	}
	if r.MaxDebt != 0 && r.Algorithm != TokenBucket && r.Algorithm != GCRA {
		add("max_debt", Errorf(CodeInvalid, "only token_bucket and gcra owe a debt of their own bound; a combination owes one burst, a window counts debits up to %d", int64(MaxCount)))
	}
	switch r.Algorithm {
	case TokenBucket, GCRA, Combination:
		rateErr := r.Rate.Validate()
		if rateErr != nil {
			add("rate", rateErr)
		}
		// A burst's refill time needs a valid rate; its range does not.
		if err := checkBucket(r.Rate, r.Burst); err != nil && (rateErr == nil || r.Burst < 1 || r.Burst > MaxCount) {
			if rateErr != nil {
				err = Errorf(CodeInvalid, "must be from 1 to %d", int64(MaxCount))
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
			if err := r.Floor.Validate(); err != nil {
				add("floor", err)
			} else if err := checkBucket(r.Floor, r.Floor.N); err != nil {
				add("floor", err)
			}
		}
	case FixedWindow, SlidingWindow, SlidingLog:
		max := int64(MaxCount)
		if r.Algorithm == SlidingLog {
			max = MaxSlidingLogLimit
		}
		if r.Limit < 1 || r.Limit > max {
			add("limit", Errorf(CodeInvalid, "must be from 1 to %d", max))
		}
		if r.Window < time.Millisecond || r.Window > MaxRatePeriod {
			add("window", Errorf(CodeInvalid, "must be from 1ms to %v", MaxRatePeriod))
		}
	case Quota:
		if r.Limit < 1 || r.Limit > MaxCount {
			add("limit", Errorf(CodeInvalid, "must be from 1 to %d", int64(MaxCount)))
		}
		if r.Period < Day || r.Period > Year {
			add("period", Errorf(CodeInvalid, "want day, week, month or year"))
		}
		if r.Anchor.Nanosecond() != 0 {
			add("anchor", Errorf(CodeInvalid, "must be a whole second"))
		}
	case Concurrency:
		if r.Max < 1 || r.Max > MaxConcurrency {
			add("max", Errorf(CodeInvalid, "must be from 1 to %d", MaxConcurrency))
		}
		if r.LeaseTTL < 0 || r.LeaseTTL > MaxRatePeriod {
			add("lease_ttl", Errorf(CodeInvalid, "must be from 0 to %v", MaxRatePeriod))
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
	if burst < 1 || burst > MaxCount {
		return Errorf(CodeInvalid, "must be from 1 to %d", int64(MaxCount))
	}
	// burst*Per/N <= maxSpan  <=>  burst*Per <= maxSpan*N, compared in 128 bits.
	h1, l1 := bits.Mul64(uint64(burst), uint64(rate.Per))
	h2, l2 := bits.Mul64(uint64(maxSpan), uint64(rate.N))
	if h1 > h2 || (h1 == h2 && l1 > l2) {
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

// CheckCost reports whether a request may charge cost to r: cost must be
// from 0 to MaxCost, no more than r.MaxCost when it is set, and no more
// than the most the rule could ever admit at once (see MostAtOnce) — a
// larger cost is a request error, never a silent refusal.
func (r *Rule) CheckCost(cost int64) error {
	if err := r.checkMaxCost(cost); err != nil {
		return err
	}
	if most := r.MostAtOnce(); cost > most {
		if r.Algorithm == Concurrency && most == MaxLeaseCost {
			return r.costError(cost, "is more slots than one lease takes (%d)", most)
		}
		return r.costError(cost, "is more than rule %q can ever admit at once (%d)", r.Name, most)
	}
	return nil
}

// MostAtOnce returns the largest cost one request could ever be admitted
// at: the capacity, the larger of a combination's two buckets, or for
// concurrency the slots one lease may take (at most MaxLeaseCost).
func (r *Rule) MostAtOnce() int64 {
	switch r.Algorithm {
	case Combination:
		return max(r.Burst, r.Floor.N)
	case Concurrency:
		return min(r.Max, MaxLeaseCost)
	}
	return r.Capacity()
}

// checkMaxCost checks cost against the package's bound and r.MaxCost.
func (r *Rule) checkMaxCost(cost int64) error {
	if cost < 0 || cost > MaxCost {
		return r.costError(cost, "must be from 0 to %d", int64(MaxCost))
	}
	if r.MaxCost > 0 && cost > r.MaxCost {
		return r.costError(cost, "is more than rule %q takes in one charge (max_cost %d)", r.Name, r.MaxCost)
	}
	return nil
}

// costError is an invalid cost, about the field "cost".
func (r *Rule) costError(cost int64, format string, args ...any) error {
	e := Errorf(CodeInvalid, "cost %d "+format, append([]any{cost}, args...)...)
	e.Field = "cost"
	return e
}

// CheckDebit reports whether r takes a debit of cost (see Charge.Debit):
// token buckets, GCRA and fixed and sliding windows do, of any cost from
// 0 to MaxCost (a Counted window without a MaxCost of its own up to
// MaxCount, the most it counts), and to r.MaxCost when it is set. A combination (which half would owe?), a
// sliding log (one entry per unit, which a debt would grow without bound)
// and concurrency (a lease is not a cost) do not.
func (r *Rule) CheckDebit(cost int64) error {
	if r.Distribution == Counted && r.MaxCost == 0 && cost > MaxCost && cost <= MaxCount {
		return nil
	}
	if err := r.checkMaxCost(cost); err != nil {
		return err
	}
	switch r.Algorithm {
	case TokenBucket, GCRA, FixedWindow, SlidingWindow, Quota:
		return nil
	}
	e := Errorf(CodeInvalid, "rule %q: %v takes no debits; token_bucket, gcra, fixed_window, sliding_window and quota do", r.Name, r.Algorithm)
	e.Field = "debit"
	return e
}

// LeaseTTLOrDefault returns r.LeaseTTL, or DefaultLeaseTTL when it is zero.
func (r *Rule) LeaseTTLOrDefault() time.Duration {
	if r.LeaseTTL > 0 {
		return r.LeaseTTL
	}
	return DefaultLeaseTTL
}

// MostDebt returns the largest MaxDebt a bucket of rate may owe: MaxCount
// tokens, or what it repays in 100 years if that is less.
func MostDebt(rate Rate) int64 {
	if rate.N <= 0 || rate.Per <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(maxSpan), uint64(rate.N))
	if hi >= uint64(rate.Per) {
		return MaxCount
	}
	q, _ := bits.Div64(hi, lo, uint64(rate.Per))
	return int64(min(q, uint64(MaxCount)))
}

// Reservable reports whether a can book future capacity: token buckets and
// GCRA can.
func (a Algorithm) Reservable() bool { return a == TokenBucket || a == GCRA }
