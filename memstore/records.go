package memstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
)

type leaseRecord struct {
	num    uint64
	refs   []leaseRef
	expiry int64
}

type leaseRef struct {
	h   uint64
	ttl int64
	// fair, for the slots a class holds of a shared concurrency key,
	// says where the key's records are, for a renewal to yield.
	fair *fairRef
}

// fairRef names the records of the key whose class holdings a lease ref
// is: its rule, its pool's and the class's record.
type fairRef struct {
	p           *engine.PreparedRule
	pool, class uint64
}

type reservation struct {
	at     int64
	hashes []uint64
	rules  []*admit.Rule
	costs  []int64
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
	// A class holding more than its part while another claims slots
	// yields: its lease is not renewed, and ends when it expires.
	for _, ref := range l.refs {
		if ref.fair == nil {
			continue
		}
		sh := &s.shards[s.shardOf(ref.h)]
		sh.mu.Lock()
		yield := false
		if set := sh.leases[ref.h]; set != nil {
			when := sh.at(now)
			yield = ref.fair.p.ShareYields(s.shareRecord(sh, ref.fair.pool, when), s.shareRecord(sh, ref.fair.class, when), set.Live(when), when)
		}
		sh.mu.Unlock()
		if yield {
			return admit.Lease{}, errYield(id, ref.fair.p.Rule().Name, l.expiry)
		}
	}
	held := false
	expiry := int64(0)
	for _, ref := range l.refs {
		sh := &s.shards[s.shardOf(ref.h)]
		sh.mu.Lock()
		when := sh.at(now)
		if set := sh.leases[ref.h]; set != nil && set.Renew(when, l.num, when+ref.ttl) {
			held = true
			expiry = max(expiry, when+ref.ttl)
			s.put(sh, ref.h, engine.State{Expiry: set.Expiry()}, nil)
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
		when := sh.at(now)
		if set := sh.leases[ref.h]; set != nil {
			held = set.Release(when, l.num) || held
			if i := sh.t.find(ref.h); i >= 0 {
				if e := set.Expiry(); e > when {
					sh.t.slots[i].st.Expiry = e
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
	if _, err := validate(charges, nil); err != nil {
		return admit.Reservation{}, err
	}
	for i := range charges {
		if charges[i].Debit {
			return admit.Reservation{}, admit.Errorf(admit.CodeInvalid, "charge %d: a reservation books capacity ahead; it takes no debits", i)
		}
		if charges[i].Share != nil {
			return admit.Reservation{}, errShareReserve(i)
		}
		if r := charges[i].Rule; !engine.Reservable(r.Algorithm) {
			return admit.Reservation{}, admit.Errorf(admit.CodeInvalid, "rule %q: %v cannot reserve; only token_bucket and gcra can", r.Name, r.Algorithm)
		}
	}
	rec := &reservation{
		hashes: make([]uint64, len(charges)),
		rules:  make([]*admit.Rule, len(charges)),
		costs:  make([]int64, len(charges)),
	}
	next := make([]engine.State, len(charges))
	var locks lockSet
	for i := range charges {
		rec.hashes[i] = hashOf(&charges[i])
		rec.rules[i], rec.costs[i] = charges[i].Rule, charges[i].Cost
		locks.add(s.shardOf(rec.hashes[i]))
	}
	now := s.now()
	s.lock(&locks)
	now = s.at(&locks, now)
	wait := int64(0)
	for i := range charges {
		h := rec.hashes[i]
		st, chained := engine.State{}, false
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
		next[i], w = engine.StepReserve(rec.rules[i], st, now, rec.costs[i])
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
	now := s.at(&locks, s.now())
	if now >= rec.at {
		return nil
	}
	for i, h := range rec.hashes {
		sh := &s.shards[s.shardOf(h)]
		s.put(sh, h, engine.StepCancel(rec.rules[i], sh.t.get(h), now, rec.costs[i]), nil)
	}
	return nil
}
