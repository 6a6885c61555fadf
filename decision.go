package admit

import (
	"context"
	"time"

	"github.com/admitdev/admit/internal/slots"
)

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
	// cost may exceed what the rule admits at once (up to 1,000,000,000).
	// Token buckets, GCRA, fixed and sliding windows and quotas take
	// debits.
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

	// Prepared is what the charge's maker computed of its key once, its
	// hash and its tenant's, so that a store reads them rather than hash
	// the key again or parse it for its tenant. A Limiter's and a
	// policy's charges carry it; on a charge built by hand leave it zero.
	Prepared slots.Key
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
	// store needs to give a charge back to the window it was counted
	// in. The zero time means the store did not say.
	At time.Time
	// FailedOpen says the store could not be reached and every limit
	// charged fails open (Limit.FailOpen): admitted, and counted nowhere.
	FailedOpen bool

	// A Limiter's charges and key bytes, kept for the next decision into
	// this Decision (see Limiter.Decide); keyed is how many of the charges
	// its last decision into d made, index by index with Results, 0 once d
	// is reset.
	charges []Charge
	key     []byte
	keyed   int
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

// Key returns the key of the charge whose result is d.Results[i] when
// Limiter.Decide made d, and "" otherwise:
// the bucket a request was counted in, which a front end may report
// hashed (as the partition of the RateLimit header fields) to tell one
// caller's buckets apart.
func (d *Decision) Key(i int) string {
	if i < 0 || i >= d.keyed || i >= len(d.Results) {
		return ""
	}
	return d.charges[i].Key
}

// Reset clears d for reuse, keeping the backing array of d.Results.
func (d *Decision) Reset() {
	// Field by field: the Limiter's buffers stay, untouched.
	d.Allowed, d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter, d.DeniedBy = false, 0, 0, 0, 0, ""
	d.keyed = 0
	d.Results = d.Results[:0]
	d.Lease = Lease{}
	d.At = time.Time{}
	d.FailedOpen = false
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
	// reservation is CodeNotFound.
	CancelReservation(ctx context.Context, id string) error

	// RenewLease extends every slot of a live lease by its TTL.
	RenewLease(ctx context.Context, id string) (Lease, error)
	// ReleaseLease frees the slots of a lease. An unknown or expired lease
	// is CodeNotFound.
	ReleaseLease(ctx context.Context, id string) error

	// Reset forgets the state of the charges' buckets, as if they had
	// never been used.
	Reset(ctx context.Context, charges []Charge) error

	// Close releases the store's resources. It is idempotent.
	Close() error
}
