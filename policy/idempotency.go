package policy

import (
	"context"
	"sync"
	"time"

	"github.com/admitdev/admit"
)

// An IdempotencyStore keeps, for a while, the answers of requests made
// with an idempotency key, so that a retry of one is answered as it was
// and charges nothing. A key is claimed before its request is decided and
// holds the answer once it is: a retry meanwhile is told the first is
// still being decided. Servers that share an IdempotencyStore share the
// keys.
type IdempotencyStore interface {
	// Begin claims key, for a request of the given fingerprint, for at
	// most pending, unless key is claimed or answered already: it then
	// returns what key holds. token names this claim for Abandon.
	Begin(ctx context.Context, key string, fingerprint [32]byte, token string, pending time.Duration) (Idempotent, error)
	// Finish stores the answer of key's request, kept for keep.
	Finish(ctx context.Context, key string, answer Idempotent, keep time.Duration) error
	// Abandon lets key go if the claim named token still holds it: its
	// request was not answered with a charge, and a retry decides again.
	Abandon(ctx context.Context, key, token string) error
}

// IdempotentState is what an idempotency key holds.
type IdempotentState int

// The states of an idempotency key.
const (
	IdempotentNew     IdempotentState = iota // claimed by this Begin
	IdempotentPending                        // claimed by another request, not answered yet
	IdempotentDone                           // answered
)

// Idempotent is what an idempotency key holds: its request's fingerprint
// and, once answered, the answer's status and body.
type Idempotent struct {
	State       IdempotentState
	Fingerprint [32]byte
	Status      int
	Body        []byte
}

// DefaultIdempotencyWindow is how long an answer is kept for retries
// where the server or middleware is not told another window.
const DefaultIdempotencyWindow = time.Hour

// IdempotencyPending is how long a key is claimed for a request still
// being decided: a key whose server stopped meanwhile goes free then.
const IdempotencyPending = time.Minute

// MaxIdempotentKeys bounds the keys a MemoryIdempotency holds at once.
const MaxIdempotentKeys = 200_000

// MemoryIdempotency is an IdempotencyStore in this process's memory,
// for the memory store. Create it with NewMemoryIdempotency.
type MemoryIdempotency struct {
	mu   sync.Mutex
	keys map[string]*memIdem
	now  func() time.Time
}

type memIdem struct {
	Idempotent
	token string
	until time.Time
}

var _ IdempotencyStore = (*MemoryIdempotency)(nil)

// NewMemoryIdempotency returns an empty MemoryIdempotency.
func NewMemoryIdempotency() *MemoryIdempotency {
	return &MemoryIdempotency{keys: map[string]*memIdem{}, now: time.Now}
}

// Begin implements IdempotencyStore. Past MaxIdempotentKeys keys held,
// once the expired ones are forgotten, it fails with admit.CodeExhausted.
func (m *MemoryIdempotency) Begin(_ context.Context, key string, fp [32]byte, token string, pending time.Duration) (Idempotent, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if e, ok := m.keys[key]; ok && now.Before(e.until) {
		return e.Idempotent, nil
	}
	if len(m.keys) >= MaxIdempotentKeys {
		for k, e := range m.keys {
			if !now.Before(e.until) {
				delete(m.keys, k)
			}
		}
		if len(m.keys) >= MaxIdempotentKeys {
			return Idempotent{}, admit.Errorf(admit.CodeExhausted, "policy: %d idempotency keys held, the most this server holds; retry later", MaxIdempotentKeys)
		}
	}
	m.keys[key] = &memIdem{Idempotent: Idempotent{State: IdempotentPending, Fingerprint: fp}, token: token, until: now.Add(pending)}
	return Idempotent{State: IdempotentNew, Fingerprint: fp}, nil
}

// Finish implements IdempotencyStore.
func (m *MemoryIdempotency) Finish(_ context.Context, key string, a Idempotent, keep time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	a.State = IdempotentDone
	a.Body = append([]byte(nil), a.Body...)
	m.keys[key] = &memIdem{Idempotent: a, until: m.now().Add(keep)}
	return nil
}

// Abandon implements IdempotencyStore.
func (m *MemoryIdempotency) Abandon(_ context.Context, key, token string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.keys[key]; ok && e.State == IdempotentPending && e.token == token {
		delete(m.keys, key)
	}
	return nil
}
