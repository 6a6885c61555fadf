package exact

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
)

// Local refusals. When Redis refuses a charge, its reply says how long
// until the key could admit that cost: the window's end, the next token,
// the oldest log entry's expiry, the first lease's. Until then nothing the
// other servers do can make it admit sooner — they can only charge it
// more — so a decision that charges the key at least that cost under the
// same rule is refused here, with no call: a key under attack costs Redis
// one call per period of refusal per server, not one per request. What
// could end a refusal early is capacity coming back: a reservation
// cancelled, a lease released, a Cluster decision given back, a key reset
// (which forgets its refusals here), a rule changed (a new rule is
// another rule). Then the refusal stands until its time, which only
// admits less, and never more, than the exact limit; docs/architecture.md
// ("Refused locally") has the argument.
//
// Concurrency keys are refused locally for a moment only (concHold): their
// capacity comes back whenever a lease is released, which is how they are
// meant to be used. A release on this server forgets the refusals of its
// keys at once; one on another server may leave a slot refused here for
// up to concHold. A decision with a debit is always sent: a debit is
// applied whatever the others decide. A dry run is answered as the
// decision it mirrors would be, refused here too, so that a look
// (Limiter.Peek) says what the decision would.

// concHold bounds how long a refused concurrency key is refused locally:
// a full limit's slot may come back on another server any time, and then
// stays refused here at most this long; meanwhile a caller asking again
// and again costs Redis a call per key per concHold on each server.
const concHold = 250 * time.Millisecond

// maxRefusals bounds the refusals a store remembers: one entry per
// refused key, a few hundred bytes, so at most a few tens of MB however
// many keys an attacker drives over their limits. Past it, expired
// entries are dropped, and new ones are not kept until there is room.
var maxRefusals = 1 << 16 // a variable for the tests

// refusal is what a store knows of a key Redis refused.
type refusal struct {
	rule   *admit.Rule
	cost   int64     // the smallest cost refused until then
	sent   time.Time // local clock, when the call that refused was sent
	until  time.Time // local clock: sent + the refusal's wait (at most concHold for concurrency)
	result admit.Result
}

// refusals are a store's refusals by charge key, and for a fair charge
// its share refused (admit.ShareRefused), by key, class and sub.
type refusals struct {
	n  atomic.Int64 // len(m), read without the lock on every decision
	mu sync.RWMutex
	m  map[refusalKey]refusal
}

// refusalKey names what a refusal refuses: a key, whoever charges it, or
// one class's (and sub's) charges of it.
type refusalKey struct{ key, class, sub string }

// refusalKeyOf returns the refusal key of charge c refused with res: the
// key's own when the rule refused, the class's when its share did.
func refusalKeyOf(c *admit.Charge, res *admit.Result) refusalKey {
	if res.Share == admit.ShareRefused && c.Share != nil {
		if res.ShareWhole {
			return refusalKey{c.Key, c.Share.Class, ""} // every sub's
		}
		return refusalKey{c.Key, c.Share.Class, c.Share.Sub}
	}
	return refusalKey{key: c.Key}
}

// RefuseLocally reports whether a refusal known at now refuses charges,
// and if so fills d as a refusal by that charge. The other charges report
// their rules and limits, undecided: what they hold is in Redis.
func (s *Room) RefuseLocally(charges []admit.Charge, now time.Time, d *admit.Decision) bool {
	rs := &s.refused
	if s.exactRefusals || rs.n.Load() == 0 {
		return false
	}
	for i := range charges {
		if charges[i].Debit {
			return false
		}
	}
	rs.mu.RLock()
	by, r := -1, refusal{}
	for i := range charges {
		c := &charges[i]
		if c.Cost <= 0 || c.Rule.Shadow {
			continue
		}
		if e, ok := rs.m[refusalKey{key: c.Key}]; ok && e.rule == c.Rule && c.Cost >= e.cost && now.Before(e.until) {
			by, r = i, e
			break
		}
		if c.Share == nil {
			continue
		}
		if e, ok := rs.m[refusalKey{c.Key, c.Share.Class, ""}]; ok && e.rule == c.Rule && c.Cost >= e.cost && now.Before(e.until) {
			by, r = i, e
			break
		}
		if c.Share.Sub == "" {
			continue
		}
		if e, ok := rs.m[refusalKey{c.Key, c.Share.Class, c.Share.Sub}]; ok && e.rule == c.Rule && c.Cost >= e.cost && now.Before(e.until) {
			by, r = i, e
			break
		}
	}
	rs.mu.RUnlock()
	if by < 0 {
		return false
	}
	d.Reset()
	d.Results = d.Results[:0]
	for i := range charges {
		c := &charges[i]
		res := admit.Result{Rule: c.Rule.Name, Shadow: c.Rule.Shadow, Limit: c.Rule.Capacity()}
		if i == by {
			res = r.result
			res.Remaining = 0
			// The wait Redis gave, less the time since: for a
			// concurrency key, longer than the local hold (a lease's
			// expiry), as Redis would answer.
			res.RetryAfter = r.result.RetryAfter - now.Sub(r.sent)
			res.ResetAfter = max(res.ResetAfter-r.result.RetryAfter+res.RetryAfter, res.RetryAfter)
		}
		d.Results = append(d.Results, res)
	}
	engine.Summarize(d)
	s.Decisions.Add(1)
	s.LocalDecisions.Add(1)
	s.LocalRefusals.Add(1)
	return true
}

// LearnRefusals remembers the refusals of d, the decision of charges
// Redis made for a call sent at sent.
func (s *Room) LearnRefusals(charges []admit.Charge, d *admit.Decision, sent time.Time) {
	rs := &s.refused
	if s.exactRefusals {
		return
	}
	var learn [bounds.MaxCharges]bool
	any := false
	for i := range charges {
		c, res := &charges[i], &d.Results[i]
		if res.Allowed || res.Shadow || c.Debit || c.Cost <= 0 || res.RetryAfter <= 0 {
			continue
		}
		if res.Share == admit.ShareRefused && c.Rule.Algorithm == admit.SlidingLog {
			// A log's entries may leave at once, sooner than the share's
			// wait says: no lower bound to keep.
			continue
		}
		// A key charged twice was refused for both costs together: no
		// refusal of one of them may be learned from it.
		dup := false
		for j := range charges {
			dup = dup || j != i && charges[j].Key == c.Key
		}
		learn[i] = !dup
		any = any || !dup
	}
	if !any {
		return
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.m == nil {
		rs.m = make(map[refusalKey]refusal)
	}
	if len(rs.m) >= maxRefusals {
		for k, e := range rs.m {
			if !sent.Before(e.until) {
				delete(rs.m, k)
			}
		}
	}
	for i := range charges {
		if !learn[i] {
			continue
		}
		c := &charges[i]
		k := refusalKeyOf(c, &d.Results[i])
		if _, ok := rs.m[k]; !ok && len(rs.m) >= maxRefusals {
			continue
		}
		until := sent.Add(d.Results[i].RetryAfter)
		if c.Rule.Algorithm == admit.Concurrency || c.Rule.Distribution == admit.Counted {
			// A counted key's count may fall back when the checks of
			// refused decisions are taken back: held a moment only.
			until = sent.Add(min(d.Results[i].RetryAfter, concHold))
		}
		rs.m[k] = refusal{rule: c.Rule, cost: c.Cost, sent: sent, until: until, result: d.Results[i]}
	}
	rs.n.Store(int64(len(rs.m)))
}

// ForgetRefusals drops the refusals of charges' keys, as Reset clears
// them in Redis; with debitsOnly, of the keys charges debit, whose wait a
// debit moves.
func (s *Room) ForgetRefusals(charges []admit.Charge, debitsOnly bool) {
	rs := &s.refused
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for i := range charges {
		if !debitsOnly || charges[i].Debit {
			rs.forget(&charges[i])
		}
	}
	rs.n.Store(int64(len(rs.m)))
}

// forget drops the refusals of c's key: its own, and its class's and
// sub's when it carries a share. The caller holds rs.mu.
func (rs *refusals) forget(c *admit.Charge) {
	delete(rs.m, refusalKey{key: c.Key})
	if c.Share != nil {
		delete(rs.m, refusalKey{c.Key, c.Share.Class, ""})
		delete(rs.m, refusalKey{c.Key, c.Share.Class, c.Share.Sub})
	}
}

// forgetReleased drops the refusals a release of a lease may end, whose
// record holds the Redis keys fields (each the store's prefix, a hash tag
// and a charge's key: outside Cluster one record holds every tag's): its
// keys', and the classes' whose holdings it names (see shareKeys).
func (s *Room) forgetReleased(fields []string) {
	rs := &s.refused
	if rs.n.Load() == 0 {
		return
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, f := range fields {
		rest, ok := strings.CutPrefix(f, s.link.Prefix+"{")
		if !ok {
			continue
		}
		_, key, ok := strings.Cut(rest, "}") // tags hold no "}"
		if !ok {
			continue
		}
		if k, class, ok := heldClass(key); ok {
			delete(rs.m, refusalKey{k, class, ""})
			continue
		}
		delete(rs.m, refusalKey{key: key})
	}
	rs.n.Store(int64(len(rs.m)))
}

// heldClass parses the key of a class's holdings of a concurrency key
// (key + sufHeld + len:class) into the key and the class.
func heldClass(k string) (key, class string, ok bool) {
	i := strings.LastIndex(k, sufHeld)
	if i < 0 {
		return "", "", false
	}
	n, rest, found := strings.Cut(k[i+len(sufHeld):], ":")
	size, err := strconv.Atoi(n)
	if !found || err != nil || size != len(rest) {
		return "", "", false
	}
	return k[:i], rest, true
}
