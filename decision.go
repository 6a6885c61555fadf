package admit

import (
	"context"
	"time"

	"github.com/admitdev/admit/internal/slots"
)

// MaxCharges bounds the charges of one decision. A request resolves to a
// handful of charges (global, tenant, user, action…); the bound keeps a
// decision's locks, script arguments and stack buffers small.
const MaxCharges = 32

// Charge is one bucket a request is counted against: its key, the rule that
// governs it and the cost of the request. Cost 0 is a peek: the decision is
// computed and reported, and nothing is charged; a peek at a bucket in debt
// is refused, as any request is until the debt is repaid.
//
// The key is what a charge counts in, the rule how: a charge of a key under
// another rule than before (a rule changed by a reload or a deploy) decides
// from what the key holds, as Rule says.
type Charge struct {
	Key  string
	Rule *Rule
	Cost int64
	// LeaseTTL overrides Rule.LeaseTTL for the lease a concurrency charge
	// takes; zero keeps the rule's.
	LeaseTTL time.Duration
	// Debit charges Cost whether it fits or not: a cost known only after
	// the work (the tokens an LLM call took, the bytes sent), or counted
	// as envoyproxy/ratelimit counts every hit. A bucket goes into debt
	// (at most one burst), a window counts past its limit, and later
	// requests are refused until it is repaid. A debit never refuses the
	// decision it is in and is applied even when the decision's other
	// charges refuse it; those are all or nothing among themselves. Its
	// cost may exceed what the rule admits at once (up to MaxCost). Token
	// buckets, GCRA and fixed and sliding windows take debits (see
	// Rule.CheckDebit).
	Debit bool
	// DryRun asks what the decision would be without charging anything.
	// A decision is a dry run as a whole: if any of its charges sets
	// DryRun, the results are those of deciding every charge at its cost,
	// and no state changes.
	DryRun bool
	// Share, when set, names the class of callers the charge is made for
	// among those sharing the key, whose share the decision keeps (see
	// the package's fair shares). A charge without one is first come,
	// first served.
	Share *Share

	prepared slots.Key // its key's hashes, once prepared (see package slots)
}

// Result is the decision for one charge.
type Result struct {
	Rule    string // the rule's name
	Allowed bool   // whether this charge alone would admit the request
	Shadow  bool   // the rule is in shadow mode: reported, never refusing
	// Debit says the charge was a debit: applied whatever it found, never
	// refusing the decision. Allowed then says whether it fitted; when it
	// did not, RetryAfter is when a request of cost 1 would pass.
	Debit      bool
	Limit      int64
	Remaining  int64
	ResetAfter time.Duration
	RetryAfter time.Duration
	// Over is, for a debit that did not fit in a fixed window or a quota,
	// how far past its limit it took the count (what statistics of hits
	// over the limit count); 0 otherwise.
	Over int64
	// Share says how the charge's share of a shared limit decided it
	// (see Charge.Share): ShareRefused when the rule would have admitted
	// the request but its class was over its share while others wanted
	// theirs.
	Share SharePath
	// Shared is, for a charge with a share, what the rule itself has
	// left, Remaining being what the charge's class may still take of it.
	Shared int64
	// ShareWhole says, of a share's refusal (ShareRefused) of a charge
	// whose share has a sub (Share.Sub), that the whole class is over its
	// part, so that the class's other subs are refused too, not the sub
	// alone.
	ShareWhole bool
}

// Decision is the outcome of deciding a list of charges together. An empty
// bucket is a decision (Allowed false), never an error.
//
// When the request is refused, Limit, Remaining, ResetAfter and RetryAfter
// are those of the refusing charge that asks for the longest wait, named by
// DeniedBy. When it is admitted they are those of the non-shadow charge
// with the fewest remaining (the one closest to refusing).
type Decision struct {
	Allowed    bool
	Limit      int64
	Remaining  int64
	ResetAfter time.Duration
	RetryAfter time.Duration
	DeniedBy   string
	// Results has one entry per charge, in the order of the charges.
	Results []Result
	// Lease is set when the decision admitted concurrency charges: they are
	// held under this one lease until it is released or expires.
	Lease Lease
	// At is the store's clock when it made the decision, the time a
	// Refunder needs to give a charge back to the window it was counted
	// in. The zero time means the store did not say.
	At time.Time
	// FailedOpen says the store could not be reached and every limit
	// charged fails open (Limit.FailOpen): admitted, and counted nowhere.
	FailedOpen bool

	// A Limiter's charges and key bytes, kept for the next decision into
	// this Decision (see Limiter.Decide).
	charges []Charge
	key     []byte
}

// Result returns the result of the charge of rule, false when d has none:
// a Limiter's limits have names of their own.
func (d *Decision) Result(rule string) (Result, bool) {
	for i := range d.Results {
		if d.Results[i].Rule == rule {
			return d.Results[i], true
		}
	}
	return Result{}, false
}

// Reset clears d for reuse, keeping the backing array of d.Results.
func (d *Decision) Reset() {
	// Field by field: the Limiter's buffers stay, untouched.
	d.Allowed, d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter, d.DeniedBy = false, 0, 0, 0, 0, ""
	d.Results = d.Results[:0]
	d.Lease = Lease{}
	d.At = time.Time{}
	d.FailedOpen = false
}

// Summarize sets d's top-level fields from d.Results. Stores call it after
// appending every charge's result.
func (d *Decision) Summarize() {
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

// Lease is a slot in one or more concurrency limits, held from an admitted
// decision until it is released or expires. The zero Lease holds nothing.
type Lease struct {
	ID        string
	ExpiresAt time.Time
}

// Reservation is a booking of future capacity in token buckets and GCRA
// limits: the caller may act once Wait has passed (at At). When OK is false
// the wait would have exceeded the caller's maximum and nothing was booked;
// Wait then says how long the wait would have been.
type Reservation struct {
	ID   string
	OK   bool
	Wait time.Duration
	At   time.Time
}

// Store holds the state of every bucket and decides charges against it.
// Implementations are safe for concurrent use. An error means the store
// failed or the request was invalid (see ErrorCode); a refusal is a Decision
// with Allowed false.
type Store interface {
	// Decide decides charges together and fills d: if every non-shadow
	// charge admits the request, every admitting charge is charged;
	// otherwise nothing is charged. d.Results is reused.
	Decide(ctx context.Context, charges []Charge, d *Decision) error

	// Reserve books cost in every charge (all token_bucket or gcra) as
	// soon as all of them can bear it, if that is within maxWait, and
	// charges nothing otherwise.
	Reserve(ctx context.Context, charges []Charge, maxWait time.Duration) (Reservation, error)
	// CancelReservation gives back what a reservation booked, if the time
	// it was booked for has not come yet. An unknown or already cancelled
	// reservation is ErrNotFound.
	CancelReservation(ctx context.Context, id string) error

	// RenewLease extends every slot of a live lease by its TTL.
	RenewLease(ctx context.Context, id string) (Lease, error)
	// ReleaseLease frees the slots of a lease. An unknown or expired lease
	// is ErrNotFound.
	ReleaseLease(ctx context.Context, id string) error

	// Reset forgets the state of the charges' buckets, as if they had
	// never been used.
	Reset(ctx context.Context, charges []Charge) error

	// Close releases the store's resources. It is idempotent.
	Close() error
}

// A RuleChecker is a Store that cannot decide every valid rule, a store
// with bounds of its own (Redis keeps times in whole microseconds and
// windows of at most 52 days): NewLimiter asks it about each limit, so
// that a limit it cannot decide is refused at wiring rather than at every
// request. A Store that wraps another should pass CheckRule on.
type RuleChecker interface {
	// CheckRule reports why the store cannot decide r, a valid rule, or
	// nil.
	CheckRule(r *Rule) error
}

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
	Refund(ctx context.Context, charges []Charge, at time.Time) error
}

// CheckRefund reports whether r takes refunds: the algorithms that take
// debits do (see Refunder).
func (r *Rule) CheckRefund(cost int64) error {
	if err := r.CheckDebit(cost); err != nil {
		e := Errorf(CodeInvalid, "rule %q: %v takes no refunds; token_bucket, gcra, fixed_window, sliding_window and quota do", r.Name, r.Algorithm)
		e.Field = "refund"
		return e
	}
	return nil
}

// Check decides charges with s and returns the decision. It allocates the
// result; hot paths call s.Decide with a reused Decision instead.
func Check(ctx context.Context, s Store, charges ...Charge) (Decision, error) {
	var d Decision
	err := s.Decide(ctx, charges, &d)
	return d, err
}
