package memstore

import (
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
)

// second returns the hash of a combination's burst bucket. It differs from
// h only in bits below the shard bits, so both halves share a shard.
func second(h uint64) uint64 { return h ^ 0x00009e3779b97f4b }

// hashOf returns the hash c's state is kept under: its key's, and for a
// fixed window its key's and its window's length, so that a key keeps the
// windows of each length apart, as the Redis store names each window's
// count after its end. A rule whose window changes length counts its new
// window from zero, once, and finds the old one's count again if it
// changes back while that window lasts, rather than starting from zero at
// every change.
func hashOf(c *admit.Charge) uint64 {
	h := engine.KeyHash(c)
	if c.Rule != nil && c.Rule.Algorithm == admit.FixedWindow {
		if h ^= uint64(c.Rule.Window) * 0x9e3779b97f4a7c15; h == 0 {
			h = 1 // 0 marks an empty slot
		}
	}
	return h
}

func (s *Store) shardOf(h uint64) int { return int(h>>s.shift) & (len(s.shards) - 1) }

// lockSet is the sorted set of shard indexes a decision locks.
type lockSet struct {
	idx [bounds.MaxCharges]uint16
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

// at is shard.at for the shards of l, locked: the latest of now and
// their last decisions' times within maxLockWait of it, which each of
// them keeps.
func (s *Store) at(l *lockSet, now int64) int64 {
	read := now
	for _, i := range l.idx[:l.n] {
		if last := s.shards[i].last; last > now && last-read <= maxLockWait {
			now = last
		}
	}
	for _, i := range l.idx[:l.n] {
		s.shards[i].last = now
	}
	return now
}

func (s *Store) unlock(l *lockSet) {
	for _, i := range l.idx[:l.n] {
		s.shards[i].mu.Unlock()
	}
}

// putState stores the states of a counter algorithm's key.
func (s *Store) putState(r *admit.Rule, h uint64, next [2]engine.State, protect []uint64) {
	sh := &s.shards[s.shardOf(h)]
	s.put(sh, h, next[0], protect)
	if r.Algorithm == admit.Combination {
		s.put(sh, second(h), next[1], protect)
	}
}

// put stores st under h in sh, which the caller holds. A state that is
// already new is dropped instead. protect lists the hashes of the current
// decision, which eviction must spare.
func (s *Store) put(sh *shard, h uint64, st engine.State, protect []uint64) {
	i := sh.t.find(h)
	switch {
	case i >= 0 && st.Expiry != 0:
		sh.t.slots[i].st = st
	case i >= 0:
		s.remove(sh, i)
	case st.Expiry != 0:
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
	if len(sh.shares) > 0 {
		delete(sh.shares, h)
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
		if victim < 0 || sl.st.Expiry < sh.t.slots[victim].st.Expiry {
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
		now := sh.at(s.now())
		for j := 0; j < len(sh.t.slots); {
			if sl := &sh.t.slots[j]; sl.h != 0 && sl.st.Expiry <= now {
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
