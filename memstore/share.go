package memstore

import (
	"hash/maphash"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
)

// Fair charges (admit.Charge.Share) keep records beside their key: the
// pool of the key's classes, the class's record and its sub's, and for a
// concurrency key the slots the class and its sub hold. Each lives under a
// hash of its own, derived from the key's so that it falls in the key's
// shard: a decision locks no more shards for its fair charges, and their
// records change atomically with the key. A record's table slot holds its
// expiry, so that the sweeper, the MaxKeys cap and eviction treat it as
// any key; its data lives in the shard's side map.

// The kinds of a key's share records.
const (
	recPool uint8 = iota + 1
	recClass
	recSub
	recHeld    // the slots a class holds of a concurrency key
	recSubHeld // the slots a sub holds
)

var shareSeed = maphash.MakeSeed()

// shareHash returns the hash of the record of kind k of key hash h, for
// class and sub: in h's shard, never h, second(h) or 0.
func (s *Store) shareHash(h uint64, k uint8, class, sub string) uint64 {
	var mh maphash.Hash
	mh.SetSeed(shareSeed)
	var b [9]byte
	for i := range 8 {
		b[i] = byte(h >> (8 * i))
	}
	b[8] = k
	_, _ = mh.Write(b[:])
	if k != recPool {
		_, _ = mh.WriteString(class)
		_ = mh.WriteByte(0)
	}
	if k == recSub || k == recSubHeld {
		_, _ = mh.WriteString(sub)
	}
	x := mh.Sum64()
	low := uint64(1)<<s.shift - 1
	if len(s.shards) == 1 {
		low = ^uint64(0) >> 1
	}
	r := h&^low | x&low
	if r == h || r == second(h) || r == 0 {
		r ^= 1 << 1
	}
	return r
}

// errYield refuses the renewal of lease id: its class holds more than its
// part of rule's slots while another class claims them.
func errYield(id, rule string, expiry int64) error {
	return admit.Errorf(admit.CodeExhausted, "lease %q is not renewed: its class holds more than its part of %s, which tenants share, while another is owed slots; it ends at %s",
		id, rule, time.Unix(0, expiry).UTC().Format(time.RFC3339Nano))
}

// errShareReserve refuses a reservation of fair charge i: booked ahead in
// a limit tenants share, its capacity would be taken from every class.
func errShareReserve(i int) error {
	return admit.Errorf(admit.CodeInvalid, "charge %d: a limit tenants share is not reserved ahead; decide its charges (its class's share keeps the order)", i)
}

// fairCharge is a decision's working set for one fair charge.
type fairCharge struct {
	i       int
	p       *engine.PreparedRule
	recs    [3]uint64 // pool, class, sub
	held    [2]uint64 // a concurrency key's class and sub holdings; 0: none
	in      engine.ShareInput
	out     engine.ShareOutcome
	decided bool
}

// fairCharges returns how many of charges are fair.
func fairCharges(charges []admit.Charge) int {
	n := 0
	for i := range charges {
		if charges[i].Share != nil {
			n++
		}
	}
	return n
}

// fairOf returns the working set of charge i, or nil when it is not fair.
func (sc *scratch) fairOf(i int) *fairCharge {
	for k := range sc.fair {
		if sc.fair[k].i == i {
			return &sc.fair[k]
		}
	}
	return nil
}

// prepareFair appends to fair the working set of every fair charge, and
// to protect its records' hashes; hashes and rules are the charges'. The
// records share their key's shard, so they need no lock of their own.
func (s *Store) prepareFair(charges []admit.Charge, hashes []uint64, rules []*engine.PreparedRule, fair []fairCharge, protect []uint64) ([]fairCharge, []uint64) {
	for i := range charges {
		c := &charges[i]
		if c.Share == nil {
			continue
		}
		h := hashes[i]
		fc := fairCharge{i: i, p: rules[i]}
		fc.recs[0] = s.shareHash(h, recPool, "", "")
		fc.recs[1] = s.shareHash(h, recClass, c.Share.Class, "")
		if c.Share.Sub != "" {
			fc.recs[2] = s.shareHash(h, recSub, c.Share.Class, c.Share.Sub)
		}
		if c.Rule.Algorithm == admit.Concurrency {
			fc.held[0] = s.shareHash(h, recHeld, c.Share.Class, "")
			if c.Share.Sub != "" {
				fc.held[1] = s.shareHash(h, recSubHeld, c.Share.Class, c.Share.Sub)
			}
		}
		fair = append(fair, fc)
		protect = append(protect, fc.recs[0], fc.recs[1], fc.recs[2], fc.held[0], fc.held[1])
	}
	return fair, protect
}

// shareRecord returns the record under h, or a new one when there is none
// or it expired.
func (s *Store) shareRecord(sh *shard, h uint64, now int64) engine.ShareState {
	if h == 0 {
		return engine.ShareState{}
	}
	if i := sh.t.find(h); i < 0 || sh.t.slots[i].st.Expiry <= now {
		return engine.ShareState{}
	}
	if st := sh.shares[h]; st != nil {
		return *st
	}
	return engine.ShareState{}
}

// held returns the slots the holdings under h hold at now.
func held(sh *shard, h uint64, now int64) int64 {
	if h == 0 {
		return 0
	}
	if set := sh.leases[h]; set != nil {
		return set.Live(now)
	}
	return 0
}

// decideShare decides the share of fair charge fc, whose rule result res
// holds, at now; a peek (a refused decision's second look) leaves the
// outcome of the decision as it was.
func (s *Store) decideShare(res *admit.Result, c *admit.Charge, fc *fairCharge, now int64, peek bool) {
	sh := &s.shards[s.shardOf(fc.recs[0])]
	in := engine.ShareInput{
		Pool: s.shareRecord(sh, fc.recs[0], now), Class: s.shareRecord(sh, fc.recs[1], now), Sub: s.shareRecord(sh, fc.recs[2], now),
		Share: c.Share, Cost: c.Cost, Debit: c.Debit,
		Held: held(sh, fc.held[0], now), SubHeld: held(sh, fc.held[1], now),
	}
	if peek && !c.Debit {
		in.Cost = 0
	}
	out := fc.p.DecideShare(res, &in, now)
	if !peek || !fc.decided {
		fc.in, fc.out, fc.decided = in, out, true
	}
}

// keepShare stores the records of fair charge fc that changed: those an
// admitted decision keeps when charged is set, else those any decision
// keeps.
func (s *Store) keepShare(fc *fairCharge, charged bool, protect []uint64) {
	recs, dirty := &fc.out.Touched, fc.out.TouchedDirty
	if charged {
		recs, dirty = &fc.out.Charged, fc.out.ChargedDirty
	}
	sh := &s.shards[s.shardOf(fc.recs[0])]
	for k := range recs {
		if dirty&(1<<k) == 0 || fc.recs[k] == 0 {
			continue
		}
		h := fc.recs[k]
		st := recs[k]
		s.put(sh, h, engine.State{Expiry: st.Expiry(fc.p)}, protect)
		if sh.t.find(h) < 0 {
			continue // already new: dropped
		}
		if p := sh.shares[h]; p != nil {
			*p = st
		} else {
			if sh.shares == nil {
				sh.shares = map[uint64]*engine.ShareState{}
			}
			v := st
			sh.shares[h] = &v
		}
	}
}

// commitHeld adds the slots a fair concurrency charge took to its class's
// and sub's holdings, under the decision's lease.
func (s *Store) commitHeld(fc *fairCharge, lease *leaseRecord, now, cost, ttl int64, protect []uint64) {
	sh := &s.shards[s.shardOf(fc.recs[0])]
	for k, h := range fc.held {
		if h == 0 {
			continue
		}
		set := side(&sh.leases, h, true)
		set.Commit(now, lease.num, cost, now+ttl)
		ref := leaseRef{h: h, ttl: ttl}
		if k == 0 {
			ref.fair = &fairRef{p: fc.p, pool: fc.recs[0], class: fc.recs[1]}
		}
		lease.refs = append(lease.refs, ref)
		s.put(sh, h, engine.State{Expiry: set.Expiry()}, protect)
	}
}
