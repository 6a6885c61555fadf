package memstore

import (
	"context"
	"slices"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
)

// scratch is a decision's per-charge working space. Decisions of up to
// inlineCharges charges keep it on the stack.
const inlineCharges = 8

type scratch struct {
	rules  []*engine.PreparedRule
	hashes []uint64
	next   [][2]engine.State
	dirty  uint32 // bit i: next[i] differs from the stored state
	dup    bool   // some key is charged twice
	// fair holds the fair charges' working sets; protect is hashes and
	// their records, which eviction must spare.
	fair    []fairCharge
	protect []uint64
}

// validate checks every charge and appends its prepared rule to rules.
func validate(charges []admit.Charge, rules []*engine.PreparedRule) ([]*engine.PreparedRule, error) {
	if len(charges) > bounds.MaxCharges {
		return nil, admit.Errorf(admit.CodeInvalid, "%d charges in one decision; at most %d", len(charges), bounds.MaxCharges)
	}
	if err := engine.CheckDebits(charges); err != nil {
		return nil, err
	}
	for i := range charges {
		p, err := prepare(&charges[i])
		if err != nil {
			return nil, err
		}
		rules = append(rules, p)
	}
	return rules, nil
}

func prepare(c *admit.Charge) (*engine.PreparedRule, error) {
	if c.Key == "" {
		return nil, engine.ErrEmptyKey
	}
	p, err := engine.Prepare(c.Rule)
	if err != nil {
		return nil, err
	}
	if err := engine.CheckCounted(c); err != nil {
		return nil, err
	}
	if c.Share != nil {
		if err := engine.CheckShare(c.Share); err != nil {
			return nil, err
		}
		if !c.Debit {
			if err := p.CheckShareCost(c.Cost); err != nil {
				return nil, err
			}
		}
	}
	if c.Debit {
		return p, engine.CheckDebit(c.Rule, c.Cost)
	}
	return p, p.CheckCost(c.Cost)
}

// Decide implements admit.Store.
func (s *Store) Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	d.Reset()
	if len(charges) == 1 && charges[0].Share == nil {
		c := &charges[0]
		p, err := prepare(c)
		if err != nil {
			return err
		}
		if engine.Slots(c.Rule.Algorithm) == 1 {
			s.decideOne(c, p, d)
			return nil
		}
	}
	var ruleBuf [inlineCharges]*engine.PreparedRule
	var hashBuf [inlineCharges]uint64
	var nextBuf [inlineCharges][2]engine.State
	sc := scratch{rules: ruleBuf[:0], hashes: hashBuf[:0], next: nextBuf[:0]}
	if len(charges) > inlineCharges {
		sc = scratch{rules: make([]*engine.PreparedRule, 0, len(charges)), hashes: make([]uint64, 0, len(charges)), next: make([][2]engine.State, 0, len(charges))}
	}
	var err error
	if sc.rules, err = validate(charges, sc.rules); err != nil {
		return err
	}
	dry := false
	for i := range charges {
		dry = dry || charges[i].DryRun
	}
	var locks lockSet
	for i := range charges {
		h := hashOf(&charges[i])
		sc.dup = sc.dup || contains(sc.hashes, h)
		sc.hashes = append(sc.hashes, h)
		locks.add(s.shardOf(h))
	}
	sc.next = sc.next[:len(charges)]
	sc.protect = sc.hashes
	if nf := fairCharges(charges); nf > 0 {
		// Allocated: a fair charge's working set is large, and a
		// decision with one is rarer than without.
		fair := make([]fairCharge, 0, nf)
		protect := make([]uint64, 0, len(charges)+5*nf)
		sc.fair, sc.protect = s.prepareFair(charges, sc.hashes, sc.rules, fair, append(protect, sc.hashes...))
	}

	d.Results = slices.Grow(d.Results, len(charges))[:len(charges)]
	now := s.now()
	s.lock(&locks)
	now = s.at(&locks, now)
	allowed := true
	for i := range charges {
		res := &d.Results[i]
		s.eval(res, charges, i, &sc, now, false)
		allowed = allowed && (res.Allowed || res.Shadow || res.Debit)
	}
	var lease *leaseRecord
	switch {
	case dry:
		// Nothing is stored, not even a new key a refusal would record:
		// a dry run leaves the store as it found it.
	case allowed:
		lease = s.commit(charges, d, &sc, now)
	default:
		s.refuse(charges, d, &sc, now)
	}
	s.unlock(&locks)
	d.At = time.Unix(0, now)

	if lease != nil {
		d.Lease = s.recordLease(lease)
	}
	engine.Summarize(d)
	return nil
}

// decideOne decides a single charge of a one-slot algorithm, the common
// case, without the bookkeeping of multi-key decisions: with one charge,
// the state Step returns is the one to keep whether it admitted or not
// (unless the charge is a dry run, which keeps nothing).
func (s *Store) decideOne(c *admit.Charge, p *engine.PreparedRule, d *admit.Decision) {
	h := hashOf(c)
	sh := &s.shards[s.shardOf(h)]
	d.Results = slices.Grow(d.Results, 1)[:1]
	res := &d.Results[0]
	now := s.now()
	sh.mu.Lock()
	now = sh.at(now)
	var st engine.State
	i := sh.t.find(h)
	if i >= 0 {
		st = sh.t.slots[i].st
	}
	next := p.StepOneTo(res, st, now, c.Cost, c.Debit)
	switch {
	case c.DryRun, next == st:
		// A dry run leaves the store as it found it.
	case i >= 0 && next.Expiry != 0:
		sh.t.slots[i].st = next
	default:
		s.put(sh, h, next, []uint64{h})
	}
	sh.mu.Unlock()
	d.At = time.Unix(0, now)
	d.Allowed = res.Allowed || res.Shadow || res.Debit
	d.Limit, d.Remaining, d.ResetAfter = res.Limit, res.Remaining, res.ResetAfter
	if !d.Allowed {
		d.RetryAfter, d.DeniedBy = res.RetryAfter, res.Rule
	}
}

// refuse finishes a refused decision, which charges nothing but its
// debits. A charge that would have admitted reports what it holds now
// rather than what it would have held, so it is evaluated again at cost 0
// (a debit at its cost); when a key is charged twice every charge is, in
// order, so that they chain through unchanged or debited states. New keys
// that a look must record (see engine.Step) are recorded, and debited keys
// kept.
func (s *Store) refuse(charges []admit.Charge, d *admit.Decision, sc *scratch, now int64) {
	for i := range charges {
		r := &d.Results[i]
		wouldAdmit := r.Allowed && charges[i].Cost > 0
		if wouldAdmit || sc.dup {
			var peek admit.Result
			s.eval(&peek, charges, i, sc, now, true)
			if charges[i].Debit {
				*r = peek // what the debit did, without the refused charges
			} else if wouldAdmit {
				r.Remaining, r.ResetAfter, r.Shared = peek.Remaining, peek.ResetAfter, peek.Shared
			}
		}
		if sc.dirty&(1<<i) != 0 && engine.Slots(charges[i].Rule.Algorithm) > 0 {
			s.putState(charges[i].Rule, sc.hashes[i], sc.next[i], sc.protect)
		}
		if c := &charges[i]; c.Share != nil && (c.Debit || !r.Allowed) {
			// The class asked and the shared limit refused it: it counts,
			// and a claim it made stands. One that another of the
			// request's limits refused did not get to ask.
			s.keepShare(sc.fairOf(i), c.Debit, sc.protect)
		}
	}
}

// pending returns the cost that earlier charges of the same decision put on
// charge i's key.
func pending(charges []admit.Charge, sc *scratch, i int) int64 {
	p := int64(0)
	for j := 0; j < i; j++ {
		if sc.hashes[j] == sc.hashes[i] {
			p += charges[j].Cost
		}
	}
	return p
}

// eval decides charge i into res and keeps the state to store in sc.
func (s *Store) eval(res *admit.Result, charges []admit.Charge, i int, sc *scratch, now int64, peek bool) {
	c := &charges[i]
	h := sc.hashes[i]
	cost, extra := c.Cost, int64(0)
	if peek && !c.Debit {
		cost = 0
	} else if !peek && engine.Slots(c.Rule.Algorithm) == 0 {
		extra = pending(charges, sc, i)
	}
	sh := &s.shards[s.shardOf(h)]
	switch c.Rule.Algorithm {
	case admit.SlidingLog:
		side(&sh.logs, h, false).EvalTo(res, c.Rule, now, cost, extra)
		if c.Share != nil {
			s.decideShare(res, c, sc.fairOf(i), now, peek)
		}
		return
	case admit.Concurrency:
		side(&sh.leases, h, false).EvalTo(res, c.Rule, now, cost, extra)
		if c.Share != nil {
			s.decideShare(res, c, sc.fairOf(i), now, peek)
		}
		return
	}
	var st [2]engine.State
	chained := false
	for j := i - 1; j >= 0; j-- { // a key charged twice sees the first charge
		if sc.hashes[j] == h {
			st, chained = sc.next[j], true
			break
		}
	}
	if !chained {
		st[0] = sh.t.get(h)
		if c.Rule.Algorithm == admit.Combination {
			st[1] = sh.t.get(second(h))
		}
	}
	sc.next[i] = sc.rules[i].StepTo(res, st, now, cost, c.Debit)
	if c.Share != nil {
		s.decideShare(res, c, sc.fairOf(i), now, peek)
		if res.Share == admit.ShareRefused {
			// The rule admitted what the share refuses: keep what a
			// look keeps.
			var look admit.Result
			sc.next[i] = sc.rules[i].StepTo(&look, st, now, 0, false)
		}
	}
	if sc.next[i] != st {
		sc.dirty |= 1 << i
	} else {
		sc.dirty &^= 1 << i
	}
}

// side returns the variable-size state of key h from a shard's side map. A
// missing one reads as empty; with create set it is added, map and all.
func side[T any](m *map[uint64]*T, h uint64, create bool) *T {
	if v := (*m)[h]; v != nil {
		return v
	}
	v := new(T)
	if create {
		if *m == nil {
			*m = map[uint64]*T{}
		}
		(*m)[h] = v
	}
	return v
}

// commit charges every admitting charge. It returns the lease to record
// when concurrency charges took slots.
func (s *Store) commit(charges []admit.Charge, d *admit.Decision, sc *scratch, now int64) *leaseRecord {
	var lease *leaseRecord
	for i := range charges {
		c := &charges[i]
		h := sc.hashes[i]
		sh := &s.shards[s.shardOf(h)]
		var fc *fairCharge
		if c.Share != nil {
			fc = sc.fairOf(i)
			s.keepShare(fc, (d.Results[i].Allowed || c.Debit) && c.Cost > 0, sc.protect)
		}
		if engine.Slots(c.Rule.Algorithm) > 0 {
			// Refused shadow charges and peeks keep the state Step
			// returned for them, which charges nothing.
			if sc.dirty&(1<<i) != 0 {
				s.putState(c.Rule, h, sc.next[i], sc.protect)
			}
			continue
		}
		if !d.Results[i].Allowed || c.Cost == 0 {
			continue
		}
		switch c.Rule.Algorithm {
		case admit.SlidingLog:
			lg := side(&sh.logs, h, true)
			lg.Commit(c.Rule, now, c.Cost)
			s.put(sh, h, engine.State{Expiry: lg.Expiry(c.Rule.Window)}, sc.protect)
		case admit.Concurrency:
			if lease == nil {
				lease = &leaseRecord{num: s.leaseNext.Add(1)}
			}
			ttl := int64(c.LeaseTTL)
			if ttl <= 0 {
				ttl = int64(engine.LeaseTTL(c.Rule))
			}
			set := side(&sh.leases, h, true)
			set.Commit(now, lease.num, c.Cost, now+ttl)
			lease.refs = append(lease.refs, leaseRef{h: h, ttl: ttl})
			lease.expiry = max(lease.expiry, now+ttl)
			s.put(sh, h, engine.State{Expiry: set.Expiry()}, sc.protect)
			if fc != nil {
				s.commitHeld(fc, lease, now, c.Cost, ttl, sc.protect)
			}
		}
	}
	return lease
}

// Reset implements admit.Store.
func (s *Store) Reset(ctx context.Context, charges []admit.Charge) error {
	for i := range charges {
		h := hashOf(&charges[i])
		sh := &s.shards[s.shardOf(h)]
		sh.mu.Lock()
		for _, x := range [2]uint64{h, second(h)} {
			if j := sh.t.find(x); j >= 0 {
				s.remove(sh, j)
			}
		}
		sh.mu.Unlock()
	}
	return nil
}

// Refund implements engine.Refunder.
func (s *Store) Refund(ctx context.Context, charges []admit.Charge, at time.Time) error {
	for i := range charges {
		c := &charges[i]
		if c.Key == "" {
			return engine.ErrEmptyKey
		}
		if err := c.Rule.Validate(); err != nil {
			return err
		}
		if err := engine.CheckRefund(c.Rule, c.Cost); err != nil {
			return err
		}
	}
	for i := range charges {
		c := &charges[i]
		h := hashOf(c)
		sh := &s.shards[s.shardOf(h)]
		sh.mu.Lock()
		if j := sh.t.find(h); j >= 0 {
			st := sh.t.slots[j].st
			if next := engine.StepRefund(c.Rule, st, sh.at(s.now()), at.UnixNano(), c.Cost); next != st {
				s.put(sh, h, next, []uint64{h})
			}
		}
		sh.mu.Unlock()
	}
	return nil
}

var _ engine.Refunder = (*Store)(nil)
