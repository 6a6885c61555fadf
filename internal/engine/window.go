package engine

import (
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/wide"
)

// Windows are aligned to the Unix epoch, so every store and every server
// agrees on where a window starts without sharing anything but the clock.

// A debit that does not fit is counted all the same, up to MaxCount: the
// window refuses until it ends (fixed) or until enough of it has slid out
// (sliding).

// fixed window: A = the end of the counted window (its expiry), B = count.
func stepFixed(r *admit.Rule, s State, now, cost int64, res *admit.Result, debit bool) State {
	w := int64(r.Window)
	end := now - now%w + w
	switch {
	case s.Expiry <= now:
		s = State{}
	case s.Expiry > end:
		// A later window: the clock went back. Its count stands until it
		// ends, as a store that keeps each window under a name of its
		// own would find it again when the clock comes forward;
		// meanwhile it is the strict one. (A store keeps a key's windows
		// of each length apart: memstore's slots, Redis's count keys.)
	case s.Expiry != end:
		s = State{}
	}
	return stepCount(r.Limit, s, now, end, cost, res, debit)
}

// stepCount counts up to limit in a period that ends at end, or at the end
// s holds while it runs: a fixed window, or a quota's calendar period.
func stepCount(limit int64, s State, now, end, cost int64, res *admit.Result, debit bool) State {
	count := int64(0)
	if s.Expiry > now {
		count, end = int64(s.Count), s.Expiry
	}
	res.ResetAfter = durNs(end - now)
	if count+cost <= limit {
		res.Allowed = true
		res.Remaining = limit - count - cost
		if cost > 0 {
			return State{Expiry: end, Count: uint32(count + cost)}
		}
		return s
	}
	res.Remaining = max(limit-count, 0)
	res.RetryAfter = durNs(end - now)
	if debit {
		return State{Expiry: end, Count: uint32(min(count+cost, bounds.MaxCount))}
	}
	return s
}

// sliding window counter: A = the end of the current window plus one
// window (when both counts have slid out, the key's expiry), B = the
// current window's count, C = the previous window's count.
//
// The request is admitted iff prev·(W−e)/W + cur + cost <= limit, where e is
// the time elapsed in the current window. The comparison is made exactly,
// multiplied through by W in 128 bits, so there is no rounding at all.
func stepSliding(r *admit.Rule, s State, now, cost int64, res *admit.Result, debit bool) State {
	w := int64(r.Window)
	start := now - now%w
	end := start + w
	tag := slideTag(w)
	var cur, prev int64
	if isShapeID(s.Prev) {
		s = State{} // a bucket's, after the rule's algorithm changed
	}
	switch stateEnd := s.Expiry - tag - w; {
	case s.Expiry-tag <= now: // expired at its window's end, not its tag's
	case stateEnd == end:
		cur, prev = int64(s.Count), int64(s.Prev)
	case stateEnd == start:
		prev = int64(s.Count)
	default:
		// A window of another length (the rule changed), or a later
		// one (the clock went back): every unit it counts is counted in
		// this window, the strict reading, which a longer window is
		// right to make and a shorter one forgets within two of its
		// windows. It is kept so, refused or not, or every look would
		// read it so again until it expired.
		cur = min(int64(s.Count)+int64(s.Prev), bounds.MaxCount)
		s = State{Expiry: end + w + tag, Count: uint32(cur)}
	}
	left := uint64(max(end-now, 0)) // W − e
	weighted := wide.Mul(uint64(prev), left)
	capacity := wide.Mul(uint64(r.Limit), uint64(w))
	admitted := !capacity.Less(weighted.Add(wide.Mul(uint64(cur+cost), uint64(w))))

	after := cur
	if admitted {
		after += cost
	}
	if weighted.Less(capacity) {
		q, _ := capacity.Sub(weighted).Div(uint64(w))
		res.Remaining = max(q-after, 0)
	}
	switch {
	case after > 0:
		res.ResetAfter = durNs(end + w - now)
	case prev > 0:
		res.ResetAfter = durNs(end - now)
	}
	if admitted {
		res.Allowed = true
		if cost > 0 {
			return State{Expiry: end + w + tag, Count: uint32(after), Prev: uint32(prev)}
		}
		return s
	}
	if debit { // what it meets after is for the caller to ask (see stepTo)
		return State{Expiry: end + w + tag, Count: uint32(min(cur+cost, bounds.MaxCount)), Prev: uint32(prev)}
	}
	// The earliest instant the same request would pass, if nothing else
	// is admitted meanwhile.
	if room := r.Limit - cur - cost; room >= 0 {
		// Within this window, once enough of the previous one slides out:
		// prev·(end−t) <= room·W.
		k, _ := wide.Mul(uint64(room), uint64(w)).Div(uint64(prev))
		res.RetryAfter = durNs(end - k - now)
	} else {
		// In the next window, where this window's count is the previous.
		k, _ := wide.Mul(uint64(r.Limit-cost), uint64(w)).Div(uint64(cur))
		res.RetryAfter = durNs(end + w - k - now)
	}
	return s
}

// slideTag is what a sliding window's state adds to its expiry, 1 to 999
// ns, after its window's length: a state of another length (the rule
// changed) is then told from one of this length whose windows happen to
// end where this one's do, which the state would otherwise read as its
// own (an hour's 20 of 20 read by a two-hour window as its previous
// window's, weighing 15). The Redis store keeps the length itself.
func slideTag(w int64) int64 {
	return 1 + int64((uint64(w)*0x9e3779b97f4a7c15)>>32%999)
}

// StepRefund gives back cost that a charge of r took at the store's time
// at, into s at now, and returns the state to keep (see Refunder): a
// bucket gets the tokens back; a window or quota gets them back only from
// the count of the window or period at fell in, while it lasts, never
// below zero. r must take refunds (Rule.CheckRefund).
func StepRefund(r *admit.Rule, s State, now, at, cost int64) State {
	if s.Expiry <= now || cost <= 0 {
		return s
	}
	give := func(n uint32) uint32 { return n - uint32(min(int64(n), cost)) }
	switch r.Algorithm {
	case admit.TokenBucket, admit.GCRA:
		b := mainBucket(r)
		return b.unreserve(s, now, cost)
	case admit.FixedWindow:
		w := int64(r.Window)
		if s.Expiry == at-at%w+w {
			s.Count = give(s.Count)
		}
	case admit.Quota:
		if _, end := PeriodAt(r, time.Unix(0, at)); s.Expiry == end.UnixNano() {
			s.Count = give(s.Count)
		}
	case admit.FirstHitWindow:
		// The window at fell in is the one running if it ends within a
		// window of at (a window started after at ends later).
		if s.Expiry <= at+int64(r.Window) {
			s.Count = give(s.Count)
		}
	case admit.SlidingWindow:
		w := int64(r.Window)
		switch end := at - at%w + w; s.Expiry - slideTag(w) - w {
		case end: // at's window is still the current one
			s.Count = give(s.Count)
		case end + w: // it is the previous one now
			s.Prev = give(s.Prev)
		}
	}
	return s
}
