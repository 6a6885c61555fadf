// Package idempotency keeps the answers of requests made with an
// Idempotency-Key, so that a retry is answered as the first was and
// charges nothing again: a Store interface, the in-memory Memory, and
// (package redisidem) one shared by servers on one Redis. Keys belong to
// a scope, the caller that chose them, and a scope holds a bounded
// number, so that one caller cannot fill what every caller shares.
package idempotency

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// An Store keeps, for a while, the answers of requests made
// with an idempotency key, so that a retry of one is answered as it was
// and charges nothing. A key is claimed before its request is decided and
// holds the answer once it is: a retry meanwhile is told the first is
// still being decided. Servers that share an Store share the
// keys.
//
// Every key belongs to a scope, the caller that chose it (a tenant, an
// address): keys of two scopes never meet, and a store holds at most its
// bound of keys per scope, so that one caller cannot fill what every
// caller shares.
type Store interface {
	// Begin claims scope's key, for a request of the given fingerprint,
	// for at most pending, unless key is claimed or answered already: it
	// then returns what key holds. token names this claim for Abandon.
	// When scope holds its bound of keys, it claims nothing and returns
	// Full, with when the first of them expires.
	Begin(ctx context.Context, scope, key string, fingerprint [32]byte, token string, pending time.Duration) (Entry, error)
	// Finish stores the answer of scope's key's request, kept for keep.
	Finish(ctx context.Context, scope, key string, answer Entry, keep time.Duration) error
	// Abandon lets scope's key go if the claim named token still holds
	// it: its request was not answered with a charge, and a retry decides
	// again.
	Abandon(ctx context.Context, scope, key, token string) error
}

// State is what an idempotency key holds.
type State int

// The states of an idempotency key.
const (
	Claimed State = iota // claimed by this Begin
	Pending              // claimed by another request, not answered yet
	Done                 // answered
	Full                 // not claimed: its scope holds the most keys it may
)

// Entry is what an idempotency key holds: its request's fingerprint
// and, once answered, the answer's status and body. For Full,
// RetryAfter is how long until the scope's first key expires.
type Entry struct {
	State       State
	Fingerprint [32]byte
	Status      int
	Body        []byte
	RetryAfter  time.Duration
}

// DefaultWindow is how long an answer is kept for retries
// where the server or middleware is not told another window.
const DefaultWindow = time.Hour

// PendingTTL is how long a key is claimed for a request still
// being decided: a key whose server stopped meanwhile goes free then.
const PendingTTL = time.Minute

// MaxKeys bounds the keys a Memory holds at once,
// of every scope.
const MaxKeys = 200_000

// DefaultKeysPerScope is the bound of the keys one scope holds
// at once where no other is set.
const DefaultKeysPerScope = 20_000

// Memory is an Store in this process's memory,
// for the memory store. Create it with NewMemory.
type Memory struct {
	perScope, maxKeys int
	mu                sync.Mutex
	scopes            map[string]*memScope
	held              int // keys of every scope
	now               func() time.Time
}

// memScope is a scope's keys, and the order they expire in: each key's
// claim and answer is pushed on a heap by its expiry when made, and the
// heap's top popped while it has expired (an entry whose key was made
// again since is skipped).
type memScope struct {
	keys     map[string]*memIdem
	expiries expiryHeap
}

type memExpiry struct {
	key   string
	until time.Time
}

// expiryHeap is a min-heap of expiries (container/heap).
type expiryHeap []memExpiry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(memExpiry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

type memIdem struct {
	Entry
	token string
	until time.Time
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty Memory that holds at
// most perScope keys of a scope (DefaultKeysPerScope when 0)
// and maxKeys in all (MaxKeys when 0, and at most that).
func NewMemory(perScope, maxKeys int) *Memory {
	if perScope <= 0 {
		perScope = DefaultKeysPerScope
	}
	if maxKeys <= 0 || maxKeys > MaxKeys {
		maxKeys = MaxKeys
	}
	return &Memory{perScope: perScope, maxKeys: maxKeys, scopes: map[string]*memScope{}, now: time.Now}
}

// expire forgets sc's keys that expired by now. m.mu is held.
func (m *Memory) expire(name string, sc *memScope, now time.Time) {
	for len(sc.expiries) > 0 && !now.Before(sc.expiries[0].until) {
		x := heap.Pop(&sc.expiries).(memExpiry)
		if e, ok := sc.keys[x.key]; ok && e.until.Equal(x.until) {
			delete(sc.keys, x.key)
			m.held--
		}
	}
	if len(sc.keys) == 0 {
		delete(m.scopes, name)
	}
}

// Begin implements Store. Past its bound of keys held in all, once the expired ones are forgotten, it answers Full
// too, with when the first key of all expires.
func (m *Memory) Begin(_ context.Context, scope, key string, fp [32]byte, token string, pending time.Duration) (Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	sc := m.scopes[scope]
	if sc != nil {
		m.expire(scope, sc, now)
		if e, ok := sc.keys[key]; ok {
			return e.Entry, nil
		}
		if len(sc.keys) >= m.perScope {
			return Entry{State: Full, RetryAfter: sc.firstExpiry().Sub(now)}, nil
		}
	}
	if m.held >= m.maxKeys {
		first := time.Time{}
		for name, s := range m.scopes {
			m.expire(name, s, now)
			if len(s.keys) > 0 && (first.IsZero() || s.firstExpiry().Before(first)) {
				first = s.firstExpiry()
			}
		}
		if m.held >= m.maxKeys {
			return Entry{State: Full, RetryAfter: first.Sub(now)}, nil
		}
	}
	if sc = m.scopes[scope]; sc == nil {
		sc = &memScope{keys: map[string]*memIdem{}}
		m.scopes[scope] = sc
	}
	m.put(sc, key, &memIdem{Entry: Entry{State: Pending, Fingerprint: fp}, token: token, until: now.Add(pending)})
	return Entry{State: Claimed, Fingerprint: fp}, nil
}

// firstExpiry returns when the first of sc's keys expires, the stale
// entries at the heap's top (a key made again since) dropped first.
func (sc *memScope) firstExpiry() time.Time {
	for len(sc.expiries) > 0 {
		x := sc.expiries[0]
		if e, ok := sc.keys[x.key]; ok && e.until.Equal(x.until) {
			return x.until
		}
		heap.Pop(&sc.expiries)
	}
	return time.Time{}
}

// put sets sc's key to e, queued for its expiry. m.mu is held.
func (m *Memory) put(sc *memScope, key string, e *memIdem) {
	if _, ok := sc.keys[key]; !ok {
		m.held++
	}
	sc.keys[key] = e
	heap.Push(&sc.expiries, memExpiry{key, e.until})
}

// Finish implements Store.
func (m *Memory) Finish(_ context.Context, scope, key string, a Entry, keep time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	sc := m.scopes[scope]
	if sc == nil {
		sc = &memScope{keys: map[string]*memIdem{}}
		m.scopes[scope] = sc
	}
	a.State = Done
	a.Body = append([]byte(nil), a.Body...)
	m.put(sc, key, &memIdem{Entry: a, until: m.now().Add(keep)})
	return nil
}

// Abandon implements Store.
func (m *Memory) Abandon(_ context.Context, scope, key, token string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	sc := m.scopes[scope]
	if sc == nil {
		return nil
	}
	if e, ok := sc.keys[key]; ok && e.State == Pending && e.token == token {
		delete(sc.keys, key)
		m.held--
		if len(sc.keys) == 0 {
			delete(m.scopes, scope)
		}
	}
	return nil
}
