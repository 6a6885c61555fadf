package idempotency

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestMemoryIdempotencyBounded: callers sending a new key with every
// request fill at most MaxKeys; past them they are refused
// (full, a 429 with when to retry) rather than held, until keys expire.
func TestMemoryIdempotencyBounded(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	m := NewMemory(0, 0)
	m.now = func() time.Time { return now }
	ctx := context.Background()
	for i := range MaxKeys {
		if _, err := m.Begin(ctx, "scope"+strconv.Itoa(i%20), "k"+strconv.Itoa(i), [32]byte{}, "t", time.Minute); err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
	}
	if got, err := m.Begin(ctx, "another", "one more", [32]byte{}, "t", time.Minute); err != nil || got.State != Full || got.RetryAfter != time.Minute {
		t.Fatalf("a key past %d held: %+v %v; want full, until the first expires (a minute)", MaxKeys, got, err)
	}
	now = now.Add(time.Minute)
	if got, err := m.Begin(ctx, "another", "one more", [32]byte{}, "t", time.Minute); err != nil || got.State != Claimed {
		t.Fatalf("once the others expired: %+v, %v", got, err)
	}
	if m.held != 1 || len(m.scopes) != 1 {
		t.Errorf("%d keys held in %d scopes, want the expired ones forgotten", m.held, len(m.scopes))
	}
}

// TestMemoryIdempotencyMaxKeys: a store made with a bound of its own in
// all (anonymous callers' keys, a tenth of the tenants') holds no more,
// however many scopes share it, and says when the first key expires.
func TestMemoryIdempotencyMaxKeys(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	m := NewMemory(5, 10)
	m.now = func() time.Time { return now }
	ctx := context.Background()
	for i := range 10 {
		if got, err := m.Begin(ctx, "addr"+strconv.Itoa(i%4), "k"+strconv.Itoa(i), [32]byte{}, "t", time.Minute); err != nil || got.State != Claimed {
			t.Fatalf("key %d: %+v %v", i, got, err)
		}
	}
	if got, err := m.Begin(ctx, "addr9", "k", [32]byte{}, "t", time.Minute); err != nil || got.State != Full || got.RetryAfter != time.Minute {
		t.Errorf("an eleventh key, of a new scope: %+v %v; want full for a minute", got, err)
	}
}
