package engine

import (
	"slices"
	"time"

	"github.com/admitdev/admit"
)

func durNs(ns int64) time.Duration { return time.Duration(max(ns, 0)) }

// Log is the state of a sliding log key: the instants of admitted units of
// cost, oldest first, in a ring that grows up to the rule's limit. The zero
// Log is empty. A Log is not safe for concurrent use; stores guard it.
type Log struct {
	ts         []int64
	head, size int
}

func (l *Log) at(i int) int64 { return l.ts[(l.head+i)%len(l.ts)] }

// firstLive returns the index of the oldest entry still inside the window.
func (l *Log) firstLive(now int64, window time.Duration) int {
	lo, hi := 0, l.size // entries are sorted: binary search
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if l.at(m) <= now-int64(window) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// Expiry returns the instant the newest entry leaves the window, or 0.
func (l *Log) Expiry(window time.Duration) int64 {
	if l.size == 0 {
		return 0
	}
	return l.at(l.size-1) + int64(window)
}

// Eval decides a request of cost at now without changing l. pending counts
// units this same decision already placed in l at now (a request that
// charges one key twice).
func (l *Log) Eval(r *admit.Rule, now, cost, pending int64) (res admit.Result) {
	l.EvalTo(&res, r, now, cost, pending)
	return res
}

// EvalTo is Eval writing into *res.
func (l *Log) EvalTo(res *admit.Result, r *admit.Rule, now, cost, pending int64) {
	resetResult(res, r, false, r.Limit)
	first := l.firstLive(now, r.Window)
	live := int64(l.size-first) + pending
	if live+cost <= r.Limit {
		res.Allowed = true
		res.Remaining = r.Limit - live - cost
		if cost > 0 || pending > 0 {
			res.ResetAfter = r.Window
		} else if live > 0 {
			res.ResetAfter = durNs(l.at(l.size-1) + int64(r.Window) - now)
		}
		return
	}
	res.Remaining = max(r.Limit-live, 0)
	if pending > 0 {
		res.ResetAfter = r.Window
	} else {
		res.ResetAfter = durNs(l.at(l.size-1) + int64(r.Window) - now)
	}
	// The k oldest live entries must leave the window first.
	k := live + cost - r.Limit
	if k <= int64(l.size-first) {
		res.RetryAfter = durNs(l.at(first+int(k)-1) + int64(r.Window) - now)
	} else {
		res.RetryAfter = r.Window
	}
}

// Commit drops the entries that left the window and records cost units at
// now. The caller has decided, with Eval, that they fit.
func (l *Log) Commit(r *admit.Rule, now, cost int64) {
	first := l.firstLive(now, r.Window)
	l.head = (l.head + first) % max(len(l.ts), 1)
	l.size -= first
	if l.size == 0 {
		l.head = 0
	}
	need := l.size + int(cost)
	if need > len(l.ts) {
		grown := make([]int64, min(max(need, 2*len(l.ts), 4), max(int(r.Limit), need)))
		for i := 0; i < l.size; i++ {
			grown[i] = l.at(i)
		}
		l.ts, l.head = grown, 0
	}
	for range cost {
		l.ts[(l.head+l.size)%len(l.ts)] = now
		l.size++
	}
}

// Len returns the number of entries, live or not yet dropped.
func (l *Log) Len() int { return l.size }

// LeaseSet is the state of a concurrency key: the leases holding its slots.
// The zero LeaseSet is empty. It is not safe for concurrent use.
type LeaseSet struct {
	slots []leaseSlot
}

type leaseSlot struct {
	lease  uint64
	expiry int64
}

// Live returns how many slots are held at now.
func (s *LeaseSet) Live(now int64) int64 {
	n := int64(0)
	for _, l := range s.slots {
		if l.expiry > now {
			n++
		}
	}
	return n
}

// Expiry returns the instant the last slot expires, or 0.
func (s *LeaseSet) Expiry() int64 {
	e := int64(0)
	for _, l := range s.slots {
		e = max(e, l.expiry)
	}
	return e
}

// Eval decides a request for cost slots at now without changing s; pending
// counts slots this same decision already took.
func (s *LeaseSet) Eval(r *admit.Rule, now, cost, pending int64) (res admit.Result) {
	s.EvalTo(&res, r, now, cost, pending)
	return res
}

// EvalTo is Eval writing into *res.
func (s *LeaseSet) EvalTo(res *admit.Result, r *admit.Rule, now, cost, pending int64) {
	resetResult(res, r, false, r.Max)
	live := s.Live(now) + pending
	res.ResetAfter = durNs(s.Expiry() - now)
	if live+cost <= r.Max {
		res.Allowed = true
		res.Remaining = r.Max - live - cost
		if cost > 0 {
			res.ResetAfter = max(res.ResetAfter, LeaseTTL(r))
		}
		return
	}
	res.Remaining = max(r.Max-live, 0)
	// If no lease were renewed, the k soonest to expire would free room.
	k := int(live + cost - r.Max)
	if at, ok := s.kthExpiry(now, k); ok {
		res.RetryAfter = durNs(at - now)
	} else {
		res.RetryAfter = LeaseTTL(r)
	}
}

// kthExpiry returns the k-th soonest expiry of the slots live at now. A
// refusal asks it of a full set, often of up to MaxConcurrency slots, and
// k is usually 1: the soonest k are kept in a small sorted window as the
// slots pass, so that a refusal costs one pass and no allocation, and only
// a large k sorts.
func (s *LeaseSet) kthExpiry(now int64, k int) (int64, bool) {
	if k < 1 {
		return 0, false
	}
	if k > 16 {
		exp := make([]int64, 0, len(s.slots))
		for _, l := range s.slots {
			if l.expiry > now {
				exp = append(exp, l.expiry)
			}
		}
		if k > len(exp) {
			return 0, false
		}
		slices.Sort(exp)
		return exp[k-1], true
	}
	var buf [16]int64
	low := buf[:0]
	for _, l := range s.slots {
		e := l.expiry
		if e <= now || (len(low) == k && e >= low[k-1]) {
			continue
		}
		if len(low) < k {
			low = append(low, e)
		} else {
			low[k-1] = e
		}
		for i := len(low) - 1; i > 0 && low[i] < low[i-1]; i-- {
			low[i], low[i-1] = low[i-1], low[i]
		}
	}
	if len(low) < k {
		return 0, false
	}
	return low[k-1], true
}

// Commit drops expired slots and adds cost slots held by lease until expiry.
func (s *LeaseSet) Commit(now int64, lease uint64, cost, expiry int64) {
	s.prune(now)
	for range cost {
		s.slots = append(s.slots, leaseSlot{lease: lease, expiry: expiry})
	}
}

// Renew moves the expiry of lease's live slots to expiry and reports
// whether it held any.
func (s *LeaseSet) Renew(now int64, lease uint64, expiry int64) bool {
	found := false
	for i := range s.slots {
		if l := &s.slots[i]; l.lease == lease && l.expiry > now {
			l.expiry, found = expiry, true
		}
	}
	return found
}

// Release frees lease's slots and reports whether it held any live one.
func (s *LeaseSet) Release(now int64, lease uint64) bool {
	found := false
	s.slots = slices.DeleteFunc(s.slots, func(l leaseSlot) bool {
		if l.lease == lease {
			found = found || l.expiry > now
			return true
		}
		return false
	})
	return found
}

func (s *LeaseSet) prune(now int64) {
	s.slots = slices.DeleteFunc(s.slots, func(l leaseSlot) bool { return l.expiry <= now })
}
