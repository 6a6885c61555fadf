// Package memstore is Admit's in-process store, the embedded default.
//
// # Layout
//
// Keys are hashed with a per-store random seed (hash/maphash). The top bits
// of the hash choose one of Shards shards; each shard is a mutex over an
// open-addressing table of 24-byte slots (hash and admit.State), so a live
// key costs about 24 to 55 bytes whatever the length of its name, and a
// decision allocates nothing. Sliding logs and concurrency keys keep their
// variable-size state (an admit.Log or admit.LeaseSet) in a side map of
// their shard.
//
// Keys are identified by their 64-bit hash alone. Two distinct keys share
// state only if their hashes collide: about one chance in 2^64 per pair, or
// three in a million that any pair collides among ten million live keys.
// Key names never reach the table, so memory does not grow with them.
//
// # Atomic decisions over many keys
//
// A decision locks the shards of all its charges in increasing shard order,
// evaluates every charge, commits all of them or none, and unlocks. Every
// goroutine acquires shard locks in the same global order and holds no
// other lock meanwhile, so no cycle of waits — no deadlock — can form.
// Lease and reservation records live in their own maps under their own
// mutexes, which are never held while waiting for a shard lock.
//
// # Expiry and eviction
//
// Every state records the instant it becomes equivalent to a new key's
// (admit.State.A). Decisions treat older states as new, so expiry is exact
// whenever the sweeper runs; the sweeper only gives the memory back, every
// SweepInterval, shard by shard. When MaxKeys live keys are held, inserting
// a new key evicts one: among eight occupied slots sampled from a random
// position in the shard, the one that will become new soonest (for idle
// keys, the least recently used), never a key of the decision that is
// inserting. Evicting a key forgets part of its history, so it may admit
// more than its limit; the evictions counter says how often that happened.
package memstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"hash/maphash"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
)

// Options configure a Store. The zero Options is valid and gives the
// defaults documented on each field.
type Options struct {
	// Shards is the number of independently locked shards, rounded up to
	// a power of two; default 256.
	Shards int
	// MaxKeys caps the live keys (slots: a combination key takes two);
	// default 10,000,000. The cap is enforced per shard, at
	// ceil(MaxKeys/Shards) each.
	MaxKeys int
	// SweepInterval is how often expired keys are dropped; default 1s.
	// Negative disables the sweeper (see Sweep).
	SweepInterval time.Duration
	// Clock returns the current time. By default the store reads the
	// monotonic clock, anchored to the wall clock when the process
	// started; tests pass a manual clock.
	Clock func() time.Time
}

// Store is the in-memory admit.Store. Its zero value is not usable; call
// New. It is safe for concurrent use.
type Store struct {
	seed        maphash.Seed
	shards      []shard
	shift       uint // shard index = hash >> shift
	maxPerShard int
	now         func() int64 // Unix nanoseconds

	keys, evictions, expirations atomic.Int64

	leaseMu   sync.Mutex
	leases    map[string]*leaseRecord
	leaseNext atomic.Uint64

	resMu        sync.Mutex
	reservations map[string]*reservation

	stop      chan struct{}
	closeOnce sync.Once
	sweeper   sync.WaitGroup
}

type shard struct {
	mu     sync.Mutex
	t      table
	logs   map[uint64]*admit.Log
	leases map[uint64]*admit.LeaseSet
	rnd    uint64
	_      [64]byte // keep hot shard headers on separate cache lines
}

type leaseRecord struct {
	num    uint64
	refs   []leaseRef
	expiry int64
}

type leaseRef struct {
	h   uint64
	ttl int64
}

type reservation struct {
	at     int64
	hashes []uint64
	rules  []*admit.Rule
	costs  []int64
}

var _ admit.Store = (*Store)(nil)

// New returns a Store with the given options; nil means the defaults. It
// starts the sweeper goroutine, which Close stops.
func New(opts *Options) *Store {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Shards <= 0 {
		o.Shards = 256
	}
	bitsN := bits.Len(uint(o.Shards - 1))
	if bitsN > 16 {
		bitsN = 16
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = 10_000_000
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = time.Second
	}
	n := 1 << bitsN
	s := &Store{
		seed:         maphash.MakeSeed(),
		shards:       make([]shard, n),
		shift:        uint(64 - bitsN),
		maxPerShard:  (o.MaxKeys + n - 1) / n,
		now:          monoNow,
		leases:       map[string]*leaseRecord{},
		reservations: map[string]*reservation{},
		stop:         make(chan struct{}),
	}
	if clock := o.Clock; clock != nil {
		s.now = func() int64 { return clock().UnixNano() }
	}
	if bitsN == 0 {
		s.shift = 63 // a single shard: hash >> 63 is 0 or 1, masked below
	}
	for i := range s.shards {
		s.shards[i].rnd = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	if o.SweepInterval > 0 {
		s.sweeper.Add(1)
		go s.sweepLoop(o.SweepInterval)
	}
	return s
}

// Close stops the sweeper. The store stays usable; Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	s.sweeper.Wait()
	return nil
}

// Stats are the store's counters.
type Stats struct {
	Keys        int64 // live slots
	Evictions   int64 // keys dropped by the MaxKeys cap
	Expirations int64 // keys dropped by the sweeper after they expired
	Leases      int64 // lease records held
}

// Stats returns the current counters.
func (s *Store) Stats() Stats {
	s.leaseMu.Lock()
	leases := int64(len(s.leases))
	s.leaseMu.Unlock()
	return Stats{Keys: s.keys.Load(), Evictions: s.evictions.Load(), Expirations: s.expirations.Load(), Leases: leases}
}

func (s *Store) hash(key string) uint64 {
	h := maphash.String(s.seed, key)
	if h == 0 {
		h = 1
	}
	return h
}

// second returns the hash of a combination's burst bucket. It differs from
// h only in bits below the shard bits, so both halves share a shard.
func second(h uint64) uint64 { return h ^ 0x00009e3779b97f4b }

func (s *Store) shardOf(h uint64) int { return int(h>>s.shift) & (len(s.shards) - 1) }

// lockSet is the sorted set of shard indexes a decision locks.
type lockSet struct {
	idx [admit.MaxCharges]uint16
	n   int
}

func (l *lockSet) add(i int) {
	j := l.n
	for j > 0 && int(l.idx[j-1]) >= i {
		if int(l.idx[j-1]) == i {
			return
		}
		j--
	}
	copy(l.idx[j+1:l.n+1], l.idx[j:l.n])
	l.idx[j] = uint16(i)
	l.n++
}

func (s *Store) lock(l *lockSet) {
	for _, i := range l.idx[:l.n] {
		s.shards[i].mu.Lock()
	}
}

func (s *Store) unlock(l *lockSet) {
	for _, i := range l.idx[:l.n] {
		s.shards[i].mu.Unlock()
	}
}

// scratch is a decision's per-charge working space. Decisions of up to
// inlineCharges charges keep it on the stack.
const inlineCharges = 8

type scratch struct {
	hashes []uint64
	next   [][2]admit.State
	dirty  uint32 // bit i: next[i] differs from the stored state
	dup    bool   // some key is charged twice
}

func validate(charges []admit.Charge) error {
	if len(charges) > admit.MaxCharges {
		return admit.Errorf(admit.CodeInvalid, "%d charges in one decision; at most %d", len(charges), admit.MaxCharges)
	}
	for i := range charges {
		c := &charges[i]
		if err := c.Rule.Validate(); err != nil {
			return err
		}
		if err := c.Rule.CheckCost(c.Cost); err != nil {
			return err
		}
	}
	return nil
}

// Decide implements admit.Store.
func (s *Store) Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	d.Reset()
	if err := validate(charges); err != nil {
		return err
	}
	dry := false
	for i := range charges {
		dry = dry || charges[i].DryRun
	}
	if len(charges) == 1 && charges[0].Rule.Algorithm.Slots() == 1 && !dry {
		s.decideOne(&charges[0], d)
		return nil
	}
	var hashBuf [inlineCharges]uint64
	var nextBuf [inlineCharges][2]admit.State
	sc := scratch{hashes: hashBuf[:0], next: nextBuf[:0]}
	if len(charges) > inlineCharges {
		sc = scratch{hashes: make([]uint64, 0, len(charges)), next: make([][2]admit.State, 0, len(charges))}
	}
	var locks lockSet
	for i := range charges {
		h := s.hash(charges[i].Key)
		sc.dup = sc.dup || contains(sc.hashes, h)
		sc.hashes = append(sc.hashes, h)
		locks.add(s.shardOf(h))
	}
	sc.next = sc.next[:len(charges)]

	d.Results = slices.Grow(d.Results, len(charges))[:len(charges)]
	s.lock(&locks)
	now := s.now()
	allowed := true
	for i := range charges {
		res := &d.Results[i]
		s.eval(res, charges, i, &sc, now, false)
		allowed = allowed && (res.Allowed || res.Shadow)
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

	if lease != nil {
		d.Lease = s.recordLease(lease)
	}
	d.Summarize()
	return nil
}

// decideOne decides a single charge of a one-slot algorithm, the common
// case, without the bookkeeping of multi-key decisions: with one charge,
// the state Step returns is the one to keep whether it admitted or not.
func (s *Store) decideOne(c *admit.Charge, d *admit.Decision) {
	h := s.hash(c.Key)
	sh := &s.shards[s.shardOf(h)]
	d.Results = slices.Grow(d.Results, 1)[:1]
	res := &d.Results[0]
	sh.mu.Lock()
	now := s.now()
	var st [2]admit.State
	i := sh.t.find(h)
	if i >= 0 {
		st[0] = sh.t.slots[i].st
	}
	next := admit.StepTo(res, c.Rule, st, now, c.Cost)
	switch {
	case next[0] == st[0]:
	case i >= 0 && next[0].A != 0:
		sh.t.slots[i].st = next[0]
	default:
		s.put(sh, h, next[0], []uint64{h})
	}
	sh.mu.Unlock()
	d.Allowed = res.Allowed || res.Shadow
	d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter = res.Limit, res.Remaining, res.ResetAfter, res.RetryAfter
	if !d.Allowed {
		d.DeniedBy = res.Rule
	}
}

// refuse finishes a refused decision, which charges nothing. A charge that
// would have admitted reports what it holds now rather than what it would
// have held, so it is evaluated again at cost 0; when a key is charged twice
// every charge is, in order, so that they chain through unchanged states.
// New keys that a look must record (see admit.Step) are recorded.
func (s *Store) refuse(charges []admit.Charge, d *admit.Decision, sc *scratch, now int64) {
	for i := range charges {
		r := &d.Results[i]
		wouldAdmit := r.Allowed && charges[i].Cost > 0
		if wouldAdmit || sc.dup {
			var peek admit.Result
			s.eval(&peek, charges, i, sc, now, true)
			if wouldAdmit {
				r.Remaining, r.ResetAfter = peek.Remaining, peek.ResetAfter
			}
		}
		if sc.dirty&(1<<i) != 0 && charges[i].Rule.Algorithm.Slots() > 0 {
			s.putState(charges[i].Rule, sc.hashes[i], sc.next[i], sc.hashes)
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
	if peek {
		cost = 0
	} else if c.Rule.Algorithm.Slots() == 0 {
		extra = pending(charges, sc, i)
	}
	sh := &s.shards[s.shardOf(h)]
	switch c.Rule.Algorithm {
	case admit.SlidingLog:
		side(&sh.logs, h, false).EvalTo(res, c.Rule, now, cost, extra)
		return
	case admit.Concurrency:
		side(&sh.leases, h, false).EvalTo(res, c.Rule, now, cost, extra)
		return
	}
	var st [2]admit.State
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
	sc.next[i] = admit.StepTo(res, c.Rule, st, now, cost)
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
		if c.Rule.Algorithm.Slots() > 0 {
			// Refused shadow charges and peeks keep the state Step
			// returned for them, which charges nothing.
			if sc.dirty&(1<<i) != 0 {
				s.putState(c.Rule, h, sc.next[i], sc.hashes)
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
			s.put(sh, h, admit.State{A: lg.Expiry(c.Rule.Window)}, sc.hashes)
		case admit.Concurrency:
			if lease == nil {
				lease = &leaseRecord{num: s.leaseNext.Add(1)}
			}
			ttl := int64(c.LeaseTTL)
			if ttl <= 0 {
				ttl = int64(c.Rule.LeaseTTLOrDefault())
			}
			set := side(&sh.leases, h, true)
			set.Commit(now, lease.num, c.Cost, now+ttl)
			lease.refs = append(lease.refs, leaseRef{h: h, ttl: ttl})
			lease.expiry = max(lease.expiry, now+ttl)
			s.put(sh, h, admit.State{A: set.Expiry()}, sc.hashes)
		}
	}
	return lease
}

// putState stores the states of a counter algorithm's key.
func (s *Store) putState(r *admit.Rule, h uint64, next [2]admit.State, protect []uint64) {
	sh := &s.shards[s.shardOf(h)]
	s.put(sh, h, next[0], protect)
	if r.Algorithm == admit.Combination {
		s.put(sh, second(h), next[1], protect)
	}
}

// put stores st under h in sh, which the caller holds. A state that is
// already new is dropped instead. protect lists the hashes of the current
// decision, which eviction must spare.
func (s *Store) put(sh *shard, h uint64, st admit.State, protect []uint64) {
	i := sh.t.find(h)
	switch {
	case i >= 0 && st.A != 0:
		sh.t.slots[i].st = st
	case i >= 0:
		s.remove(sh, i)
	case st.A != 0:
		if sh.t.count >= s.maxPerShard {
			s.evict(sh, protect)
		}
		sh.t.insert(h, st)
		s.keys.Add(1)
	}
}

func (s *Store) remove(sh *shard, i int) {
	h := sh.t.slots[i].h
	sh.t.deleteAt(i)
	s.keys.Add(-1)
	if len(sh.logs) > 0 {
		delete(sh.logs, h)
	}
	if len(sh.leases) > 0 {
		delete(sh.leases, h)
	}
}

func (s *Store) evict(sh *shard, protect []uint64) {
	n := len(sh.t.slots)
	if n == 0 {
		return
	}
	sh.rnd ^= sh.rnd << 13 // xorshift: cheap, and only needs to scatter
	sh.rnd ^= sh.rnd >> 7
	sh.rnd ^= sh.rnd << 17
	victim, seen := -1, 0
	for k, i := 0, int(sh.rnd)&(n-1); k < n && seen < 8; k, i = k+1, (i+1)&(n-1) {
		sl := &sh.t.slots[i]
		if sl.h == 0 || contains(protect, sl.h) || contains(protect, second(sl.h)) {
			continue
		}
		seen++
		if victim < 0 || sl.st.A < sh.t.slots[victim].st.A {
			victim = i
		}
	}
	if victim >= 0 {
		s.remove(sh, victim)
		s.evictions.Add(1)
	}
}

func contains(hs []uint64, h uint64) bool {
	for _, x := range hs {
		if x == h {
			return true
		}
	}
	return false
}

func newLeaseID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

func (s *Store) recordLease(l *leaseRecord) admit.Lease {
	id := newLeaseID()
	s.leaseMu.Lock()
	s.leases[id] = l
	s.leaseMu.Unlock()
	return admit.Lease{ID: id, ExpiresAt: time.Unix(0, l.expiry)}
}

// RenewLease implements admit.Store.
func (s *Store) RenewLease(ctx context.Context, id string) (admit.Lease, error) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	l := s.leases[id]
	if l == nil {
		return admit.Lease{}, admit.Errorf(admit.CodeNotFound, "lease %q not found", id)
	}
	now := s.now()
	held := false
	expiry := int64(0)
	for _, ref := range l.refs {
		sh := &s.shards[s.shardOf(ref.h)]
		sh.mu.Lock()
		if set := sh.leases[ref.h]; set != nil && set.Renew(now, l.num, now+ref.ttl) {
			held = true
			expiry = max(expiry, now+ref.ttl)
			s.put(sh, ref.h, admit.State{A: set.Expiry()}, nil)
		}
		sh.mu.Unlock()
	}
	if !held {
		delete(s.leases, id)
		return admit.Lease{}, admit.Errorf(admit.CodeNotFound, "lease %q expired", id)
	}
	l.expiry = expiry
	return admit.Lease{ID: id, ExpiresAt: time.Unix(0, expiry)}, nil
}

// ReleaseLease implements admit.Store.
func (s *Store) ReleaseLease(ctx context.Context, id string) error {
	s.leaseMu.Lock()
	l := s.leases[id]
	delete(s.leases, id)
	s.leaseMu.Unlock()
	if l == nil {
		return admit.Errorf(admit.CodeNotFound, "lease %q not found", id)
	}
	now := s.now()
	held := false
	for _, ref := range l.refs {
		sh := &s.shards[s.shardOf(ref.h)]
		sh.mu.Lock()
		if set := sh.leases[ref.h]; set != nil {
			held = set.Release(now, l.num) || held
			if i := sh.t.find(ref.h); i >= 0 {
				if e := set.Expiry(); e > now {
					sh.t.slots[i].st.A = e
				} else {
					s.remove(sh, i)
				}
			}
		}
		sh.mu.Unlock()
	}
	if !held {
		return admit.Errorf(admit.CodeNotFound, "lease %q expired", id)
	}
	return nil
}

// Reserve implements admit.Store.
func (s *Store) Reserve(ctx context.Context, charges []admit.Charge, maxWait time.Duration) (admit.Reservation, error) {
	if err := validate(charges); err != nil {
		return admit.Reservation{}, err
	}
	for i := range charges {
		if r := charges[i].Rule; !r.Algorithm.Reservable() {
			return admit.Reservation{}, admit.Errorf(admit.CodeInvalid, "rule %q: %v cannot reserve; only token_bucket and gcra can", r.Name, r.Algorithm)
		}
	}
	rec := &reservation{
		hashes: make([]uint64, len(charges)),
		rules:  make([]*admit.Rule, len(charges)),
		costs:  make([]int64, len(charges)),
	}
	next := make([]admit.State, len(charges))
	var locks lockSet
	for i := range charges {
		rec.hashes[i] = s.hash(charges[i].Key)
		rec.rules[i], rec.costs[i] = charges[i].Rule, charges[i].Cost
		locks.add(s.shardOf(rec.hashes[i]))
	}
	s.lock(&locks)
	now := s.now()
	wait := int64(0)
	for i := range charges {
		h := rec.hashes[i]
		st, chained := admit.State{}, false
		for j := i - 1; j >= 0; j-- {
			if rec.hashes[j] == h {
				st, chained = next[j], true
				break
			}
		}
		if !chained {
			st = s.shards[s.shardOf(h)].t.get(h)
		}
		var w int64
		next[i], w = admit.StepReserve(rec.rules[i], st, now, rec.costs[i])
		if !rec.rules[i].Shadow {
			wait = max(wait, w)
		}
	}
	ok := wait <= int64(maxWait)
	if ok {
		for i, h := range rec.hashes {
			s.put(&s.shards[s.shardOf(h)], h, next[i], rec.hashes)
		}
	}
	s.unlock(&locks)
	r := admit.Reservation{OK: ok, Wait: time.Duration(wait), At: time.Unix(0, now+wait)}
	if ok {
		r.ID = newLeaseID()
		rec.at = now + wait
		s.resMu.Lock()
		s.reservations[r.ID] = rec
		s.resMu.Unlock()
	}
	return r, nil
}

// CancelReservation implements admit.Store. Cancelling after the booked
// time has come gives nothing back, as the capacity has been used.
func (s *Store) CancelReservation(ctx context.Context, id string) error {
	s.resMu.Lock()
	rec := s.reservations[id]
	delete(s.reservations, id)
	s.resMu.Unlock()
	if rec == nil {
		return admit.Errorf(admit.CodeNotFound, "reservation %q not found", id)
	}
	var locks lockSet
	for _, h := range rec.hashes {
		locks.add(s.shardOf(h))
	}
	s.lock(&locks)
	defer s.unlock(&locks)
	now := s.now()
	if now >= rec.at {
		return nil
	}
	for i, h := range rec.hashes {
		sh := &s.shards[s.shardOf(h)]
		s.put(sh, h, admit.StepCancel(rec.rules[i], sh.t.get(h), now, rec.costs[i]), nil)
	}
	return nil
}

// Reset implements admit.Store.
func (s *Store) Reset(ctx context.Context, charges []admit.Charge) error {
	for i := range charges {
		h := s.hash(charges[i].Key)
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

func (s *Store) sweepLoop(every time.Duration) {
	defer s.sweeper.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// Sweep drops every expired key and record now. The sweeper calls it; tests
// and callers that disabled the sweeper may call it themselves.
func (s *Store) Sweep() {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		for j := 0; j < len(sh.t.slots); {
			if sl := &sh.t.slots[j]; sl.h != 0 && sl.st.A <= now {
				s.remove(sh, j)
				s.expirations.Add(1)
				continue // another entry may have shifted into j
			}
			j++
		}
		sh.mu.Unlock()
	}
	now := s.now()
	s.leaseMu.Lock()
	for id, l := range s.leases {
		if l.expiry <= now {
			delete(s.leases, id)
		}
	}
	s.leaseMu.Unlock()
	s.resMu.Lock()
	for id, r := range s.reservations {
		if r.at <= now {
			delete(s.reservations, id)
		}
	}
	s.resMu.Unlock()
}
