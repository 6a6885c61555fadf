// Package idemtest is the conformance suite of idempotency.Store:
// every implementation runs it.
package idemtest

import (
	"context"
	"crypto/sha256"
	"sync"
	"testing"
	"time"

	"github.com/admitdev/admit/idempotency"
)

// Run runs the suite on stores that open returns, new and empty, holding
// at most perScope keys of a scope (0: the store's default). Claims and
// answers expire on the store's own clock: the suite waits out a claim
// of 50 ms.
func Run(t *testing.T, open func(t *testing.T, perScope int) idempotency.Store) {
	ctx := context.Background()
	fp := sha256.Sum256([]byte("request"))
	other := sha256.Sum256([]byte("another request"))

	t.Run("claim_answer_replay", func(t *testing.T) {
		s := open(t, 0)
		got, err := s.Begin(ctx, "scope", "k", fp, "t1", time.Minute)
		if err != nil || got.State != idempotency.Claimed {
			t.Fatalf("first Begin: %+v, %v; want new", got, err)
		}
		got, err = s.Begin(ctx, "scope", "k", other, "t2", time.Minute)
		if err != nil || got.State != idempotency.Pending || got.Fingerprint != fp {
			t.Fatalf("Begin while claimed: %+v, %v; want pending, the first's fingerprint", got, err)
		}
		if err := s.Finish(ctx, "scope", "k", idempotency.Entry{Fingerprint: fp, Status: 200, Body: []byte(`{"allowed":true}`)}, time.Minute); err != nil {
			t.Fatal(err)
		}
		got, err = s.Begin(ctx, "scope", "k", fp, "t3", time.Minute)
		if err != nil || got.State != idempotency.Done || got.Status != 200 || string(got.Body) != `{"allowed":true}` || got.Fingerprint != fp {
			t.Fatalf("Begin once answered: %+v, %v; want the answer", got, err)
		}
		// Abandon by a claim that no longer holds the key does nothing.
		if err := s.Abandon(ctx, "scope", "k", "t1"); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Begin(ctx, "scope", "k", fp, "t4", time.Minute); got.State != idempotency.Done {
			t.Errorf("an answer abandoned: %+v", got)
		}
	})

	t.Run("abandon", func(t *testing.T) {
		s := open(t, 0)
		if _, err := s.Begin(ctx, "scope", "k", fp, "t1", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Abandon(ctx, "scope", "k", "t2"); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Begin(ctx, "scope", "k", fp, "t3", time.Minute); got.State != idempotency.Pending {
			t.Errorf("another claim's Abandon let the key go: %+v", got)
		}
		if err := s.Abandon(ctx, "scope", "k", "t1"); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Begin(ctx, "scope", "k", fp, "t3", time.Minute); got.State != idempotency.Claimed {
			t.Errorf("Begin after its claim's Abandon: %+v, want new", got)
		}
	})

	t.Run("claim_expires", func(t *testing.T) {
		s := open(t, 0)
		if _, err := s.Begin(ctx, "scope", "k", fp, "t1", 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			got, err := s.Begin(ctx, "scope", "k", fp, "t2", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if got.State == idempotency.Claimed {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("a claim of 50 ms still held after 5 s")
			}
			time.Sleep(10 * time.Millisecond)
		}
	})

	t.Run("one_claim_of_many", func(t *testing.T) {
		s := open(t, 0)
		var mu sync.Mutex
		news := 0
		var wg sync.WaitGroup
		for i := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := s.Begin(ctx, "scope", "k", fp, string(rune('a'+i)), time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if got.State == idempotency.Claimed {
					mu.Lock()
					news++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if news != 1 {
			t.Errorf("32 claims at once: %d new, want 1", news)
		}
	})

	t.Run("keys_apart", func(t *testing.T) {
		s := open(t, 0)
		for _, k := range []string{"a", "b", "a\x00b", "tenant:x\x00k"} {
			if got, err := s.Begin(ctx, "scope", k, fp, "t", time.Minute); err != nil || got.State != idempotency.Claimed {
				t.Errorf("Begin %q: %+v, %v; want new", k, got, err)
			}
		}
		// The same key of another scope is another key.
		for _, sc := range []string{"other", "scope\x00", ""} {
			if got, err := s.Begin(ctx, sc, "a", fp, "t", time.Minute); err != nil || got.State != idempotency.Claimed {
				t.Errorf("Begin of scope %q: %+v, %v; want new", sc, got, err)
			}
		}
	})

	// A full scope's wait is until its first key, as kept, expires: keys
	// claimed for a minute and answered for an hour wait the hour.
	t.Run("full_waits_for_answers", func(t *testing.T) {
		s := open(t, 2)
		for _, k := range []string{"a", "b"} {
			if got, err := s.Begin(ctx, "scope", k, fp, "t"+k, time.Minute); err != nil || got.State != idempotency.Claimed {
				t.Fatalf("key %s: %+v, %v", k, got, err)
			}
			if err := s.Finish(ctx, "scope", k, idempotency.Entry{Fingerprint: fp, Status: 200}, time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.Begin(ctx, "scope", "c", fp, "tc", time.Minute)
		if err != nil || got.State != idempotency.Full || got.RetryAfter < 59*time.Minute || got.RetryAfter > time.Hour {
			t.Errorf("a third key: %+v, %v; want full for about an hour", got, err)
		}
	})

	// A scope holds at most its bound of keys, claimed or answered; past
	// it a claim is refused (full) with when the first expires, and other
	// scopes are not; a key let go, or expired, makes room.
	t.Run("bounded_per_scope", func(t *testing.T) {
		s := open(t, 3)
		for i, k := range []string{"a", "b", "c"} {
			if got, err := s.Begin(ctx, "greedy", k, fp, "t"+k, time.Minute); err != nil || got.State != idempotency.Claimed {
				t.Fatalf("key %d: %+v, %v", i, got, err)
			}
		}
		if err := s.Finish(ctx, "greedy", "a", idempotency.Entry{Fingerprint: fp, Status: 200}, time.Hour); err != nil {
			t.Fatal(err)
		}
		got, err := s.Begin(ctx, "greedy", "d", fp, "td", time.Minute)
		if err != nil || got.State != idempotency.Full || got.RetryAfter <= 0 || got.RetryAfter > time.Hour {
			t.Fatalf("a fourth key: %+v, %v; want full, with a wait of at most the longest key's", got, err)
		}
		// Keys held are still answered, and other scopes still claim.
		if got, err := s.Begin(ctx, "greedy", "a", fp, "t", time.Minute); err != nil || got.State != idempotency.Done {
			t.Errorf("a key held, its scope full: %+v, %v; want its answer", got, err)
		}
		if got, err := s.Begin(ctx, "modest", "d", fp, "t", time.Minute); err != nil || got.State != idempotency.Claimed {
			t.Errorf("another scope: %+v, %v; want new", got, err)
		}
		if err := s.Abandon(ctx, "greedy", "b", "tb"); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Begin(ctx, "greedy", "d", fp, "td", 50*time.Millisecond); err != nil || got.State != idempotency.Claimed {
			t.Fatalf("after one was let go: %+v, %v; want new", got, err)
		}
		// Once d's claim of 50 ms expires, e takes its place.
		deadline := time.Now().Add(5 * time.Second)
		for {
			got, err := s.Begin(ctx, "greedy", "e", fp, "te", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if got.State == idempotency.Claimed {
				break
			}
			if got.State != idempotency.Full || time.Now().After(deadline) {
				t.Fatalf("waiting for an expiry: %+v", got)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}
