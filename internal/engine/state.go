package engine

import "github.com/admitdev/admit"

// State is the compact state of one key of the counter algorithms (token
// bucket, GCRA, fixed and sliding window, and each half of a combination).
// It is 16 bytes so that a store can keep millions of keys cheaply.
//
// The zero State is a new key.
type State struct {
	// Expiry is when the key expires, in Unix nanoseconds: at and after
	// it the key is indistinguishable from one the store never saw, so a
	// store may drop it, and every algorithm treats a State whose Expiry
	// is at or before now as new. A bucket keeps its time in it (the
	// moment it is full again, plus how long it is remembered after).
	Expiry int64
	// Count is the count of a window's current period; a bucket keeps in
	// it the fraction of a nanosecond of its time, in units of 1/n ns.
	Count uint32
	// Prev is the count of a sliding window's previous period.
	Prev uint32
}

// Step is the pure transition of the counter algorithms: it decides a
// request of cost at now against st and returns the states to keep: if the
// request was admitted, the charged states; if not, states equal to st in
// effect, except that a new token bucket whose initial balance is below its
// burst is recorded, so that it starts refilling when it is first seen. A
// store that refuses a whole decision keeps the states of a peek (cost 0)
// instead. st[1] and next[1] are used by combinations only. A cost of 0
// peeks. Step does not validate: r must
// pass Validate and cost must pass r.CheckCost. For SlidingLog and
// Concurrency, which need a Log or a LeaseSet, Step reports a refusal.
func Step(r *admit.Rule, st [2]State, now, cost int64) (next [2]State, res admit.Result) {
	next = StepTo(&res, r, st, now, cost)
	return next, res
}

// StepTo is Step writing the result into *res, which it overwrites: stores
// decide into a reused Decision without copying results around.
func StepTo(res *admit.Result, r *admit.Rule, st [2]State, now, cost int64) (next [2]State) {
	b := bucketsOf(r)
	return stepTo(res, r, &b, st, now, cost, false)
}

// stepTo is StepTo with r's buckets, for a charge or a debit.
func stepTo(res *admit.Result, r *admit.Rule, b *buckets, st [2]State, now, cost int64, debit bool) (next [2]State) {
	if r.Algorithm == admit.Combination {
		resetResult(res, r, false, b.capacity)
		return stepCombination(b, st, now, cost, res)
	}
	next = st
	next[0] = stepOne(res, r, b, st[0], now, cost, debit)
	return next
}

// stepOne is stepTo for the algorithms of one State. A debit is charged
// whether it fits or not; res says whether it fitted and, when it did
// not, what a request of cost 1 meets after it.
func stepOne(res *admit.Result, r *admit.Rule, b *buckets, s State, now, cost int64, debit bool) State {
	resetResult(res, r, debit, b.capacity)
	next := stepOneAs(res, r, b, s, now, cost, debit)
	if debit && !res.Allowed {
		var after admit.Result
		stepOneAs(&after, r, b, next, now, 1, false)
		res.Remaining, res.ResetAfter, res.RetryAfter = after.Remaining, after.ResetAfter, after.RetryAfter
		if r.Algorithm == admit.FixedWindow || r.Algorithm == admit.Quota || r.Algorithm == admit.FirstHitWindow {
			res.Over = max(int64(next.Count)-r.Limit, 0)
		}
	}
	return next
}

func stepOneAs(res *admit.Result, r *admit.Rule, b *buckets, s State, now, cost int64, debit bool) State {
	switch r.Algorithm {
	case admit.TokenBucket, admit.GCRA:
		return b.main.eval(res, s, now, cost, debit)
	case admit.Quota:
		return stepQuota(r, b.period, s, now, cost, res, debit)
	case admit.FixedWindow:
		return stepFixed(r, s, now, cost, res, debit)
	case admit.FirstHitWindow:
		return stepCount(r.Limit, s, now, now+int64(r.Window), cost, res, debit)
	case admit.SlidingWindow:
		return stepSliding(r, s, now, cost, res, debit)
	}
	return s
}

// Slots returns how many States a key of algorithm a uses: 2 for a
// combination (floor and burst bucket), 1 for the other counter algorithms
// and 0 for the sliding log and concurrency, which keep a Log or a LeaseSet
// instead.
func Slots(a admit.Algorithm) int {
	switch a {
	case admit.Combination:
		return 2
	case admit.SlidingLog, admit.Concurrency:
		return 0
	default:
		return 1
	}
}

// resetResult sets res to r's result before deciding: every field zero
// but the rule's name, shadow, limit and the debit. Field by field, since
// a composite literal stored through a pointer into a Decision's Results
// (heap memory, a string among its fields) is copied whole with a write
// barrier check, which a decision's hot path notices.
func resetResult(res *admit.Result, r *admit.Rule, debit bool, capacity int64) {
	res.Rule, res.Shadow, res.Debit, res.Limit = r.Name, r.Shadow, debit, capacity
	res.Allowed, res.Remaining, res.ResetAfter, res.RetryAfter, res.Over = false, 0, 0, 0, 0
	res.Share, res.Shared, res.ShareWhole = admit.ShareNone, 0, false
}
