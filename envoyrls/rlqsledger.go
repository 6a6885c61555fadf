package envoyrls

import (
	"context"
	"sync"
	"time"
)

// A QuotaLedger keeps the ledgers the quota service divides limits among
// Envoys with: one opaque state per limit, shared by every server that
// uses the same ledger. Servers of one deployment share one (Redis's, in
// package redisquota), so that the Envoys of all of them divide a limit.
type QuotaLedger interface {
	// Update reads key's state (nil if there is none) and the ledger's
	// clock, calls fn with them, and stores the state fn returns when it
	// returns store, all or nothing against other updates of key: fn may
	// be called again with the newer state. The state is kept for ttl
	// after its last update. An error from fn is returned as it is; an
	// update that lost to others too many times in a row fails with
	// admit.CodeConflict.
	Update(ctx context.Context, key string, ttl time.Duration, fn func(now time.Time, state []byte) (next []byte, store bool, err error)) error
}

// MemoryLedger is a QuotaLedger in the process's memory, for a server
// that is the only one of its deployment. It is safe for concurrent use.
type MemoryLedger struct {
	now func() time.Time

	mu     sync.Mutex
	states map[string]memoryState
	swept  time.Time
}

type memoryState struct {
	data    []byte
	expires time.Time
}

var _ QuotaLedger = (*MemoryLedger)(nil)

// NewMemoryLedger returns an empty MemoryLedger reading the clock with now
// (time.Now if nil).
func NewMemoryLedger(now func() time.Time) *MemoryLedger {
	if now == nil {
		now = time.Now
	}
	return &MemoryLedger{now: now, states: map[string]memoryState{}}
}

// Update implements QuotaLedger. fn runs under the ledger's lock: states
// of all keys are updated one at a time.
func (m *MemoryLedger) Update(ctx context.Context, key string, ttl time.Duration, fn func(time.Time, []byte) ([]byte, bool, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if now.Sub(m.swept) > time.Minute {
		m.swept = now
		for k, s := range m.states {
			if !now.Before(s.expires) {
				delete(m.states, k)
			}
		}
	}
	var cur []byte
	if s, ok := m.states[key]; ok && now.Before(s.expires) {
		cur = s.data
	}
	next, store, err := fn(now, cur)
	if err != nil || !store {
		return err
	}
	m.states[key] = memoryState{data: next, expires: now.Add(ttl)}
	return nil
}

// Len returns how many limits the ledger holds states of.
func (m *MemoryLedger) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.states)
}
