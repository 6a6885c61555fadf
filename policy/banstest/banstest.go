// Package banstest is the conformance suite of policy.BanStore: every
// implementation runs it (the memory one in package policy, Redis's in
// package redisbans).
package banstest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/admitdev/admit/policy"
)

// Run runs the suite; open returns an empty store, and again the same
// store as another server (or, for a file, after a restart) sees it.
func Run(t *testing.T, open func(t *testing.T) (first func() policy.BanStore)) {
	ctx := context.Background()
	at := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	ban := func(id, value string, ttl time.Duration) policy.Ban {
		return policy.Ban{ID: id, Scope: policy.BanIP, Value: value, Source: "admin", Reason: "test",
			Created: at, Expires: at.Add(ttl)}
	}

	t.Run("AddLoadRemove", func(t *testing.T) {
		st := open(t)
		s := st()
		b, made, err := s.Add(ctx, ban("a1", "198.51.100.7", 10*time.Minute), at)
		if err != nil || !made || b.ID != "a1" || !b.Expires.Equal(at.Add(10*time.Minute)) {
			t.Fatalf("Add = %+v, %v, %v", b, made, err)
		}
		// Another server (or this one restarted) sees it.
		got, err := st().Load(ctx, at.Add(time.Second))
		if err != nil || len(got.Bans) != 1 || got.Bans[0].Value != "198.51.100.7" || got.Bans[0].Reason != "test" {
			t.Fatalf("Load = %+v, %v", got, err)
		}
		// A ban of the id in force stays as it is.
		again, made, err := s.Add(ctx, ban("a1", "198.51.100.7", time.Hour), at.Add(time.Second))
		if err != nil || made || !again.Expires.Equal(b.Expires) {
			t.Fatalf("Add again = %+v, %v, %v; want the first kept", again, made, err)
		}
		ok, err := st().Remove(ctx, "a1", at.Add(2*time.Second))
		if err != nil || !ok {
			t.Fatalf("Remove = %v, %v", ok, err)
		}
		if ok, err := s.Remove(ctx, "a1", at.Add(3*time.Second)); err != nil || ok {
			t.Fatalf("Remove again = %v, %v; want false", ok, err)
		}
		if got, err := s.Load(ctx, at.Add(3*time.Second)); err != nil || len(got.Bans) != 0 {
			t.Fatalf("Load after Remove = %+v, %v", got, err)
		}
	})

	t.Run("Expiry", func(t *testing.T) {
		s := open(t)()
		if _, _, err := s.Add(ctx, ban("e1", "198.51.100.8", time.Minute), at); err != nil {
			t.Fatal(err)
		}
		got, err := s.Load(ctx, at.Add(time.Minute))
		if err != nil || len(got.Bans) != 0 {
			t.Fatalf("Load at expiry = %+v, %v; want none", got, err)
		}
		// An expired ban of the id is no ban in force: Add saves anew.
		if _, made, err := s.Add(ctx, ban("e1", "198.51.100.8", 2*time.Minute), at.Add(time.Minute)); err != nil || !made {
			t.Fatalf("Add after expiry = %v, %v; want made", made, err)
		}
		if ok, err := s.Remove(ctx, "e1", at.Add(3*time.Minute)); err != nil || ok {
			t.Fatalf("Remove of an expired ban = %v, %v; want false", ok, err)
		}
	})

	t.Run("Escalate", func(t *testing.T) {
		st := open(t)
		s := st()
		e := policy.Escalated{Key: "k", Ban: policy.Ban{ID: "x1", Scope: policy.BanIP, Value: "198.51.100.9", Source: "escalation:abuse"},
			Base: 10 * time.Minute, Max: 25 * time.Minute, Forget: time.Hour}
		now := at
		for i, want := range []time.Duration{10 * time.Minute, 20 * time.Minute, 25 * time.Minute, 25 * time.Minute} {
			b, made, err := st().Escalate(ctx, e, now)
			if err != nil || !made || b.Strike != i+1 || b.Expires.Sub(now) != want {
				t.Fatalf("strike %d: Escalate = %+v, %v, %v; want %s long", i+1, b, made, err, want)
			}
			// While it is in force, no escalation lengthens it.
			if b2, made, err := s.Escalate(ctx, e, now.Add(time.Second)); err != nil || made || !b2.Expires.Equal(b.Expires) {
				t.Fatalf("strike %d again: Escalate = %+v, %v, %v; want the ban in force", i+1, b2, made, err)
			}
			now = b.Expires.Add(time.Minute)
		}
		h, err := s.Load(ctx, now)
		if err != nil || h.History["k"].Strikes != 4 {
			t.Fatalf("history = %+v, %v; want 4 strikes", h, err)
		}
		// Forgotten an hour after the last one ended: the next is the first.
		now = now.Add(2 * time.Hour)
		b, made, err := s.Escalate(ctx, e, now)
		if err != nil || !made || b.Strike != 1 || b.Expires.Sub(now) != 10*time.Minute {
			t.Fatalf("after forgetting: Escalate = %+v, %v, %v; want strike 1 of 10m", b, made, err)
		}
	})

	t.Run("EscalateConcurrently", func(t *testing.T) {
		st := open(t)
		e := policy.Escalated{Key: "c", Ban: policy.Ban{ID: "c1", Scope: policy.BanIP, Value: "198.51.100.10", Source: "escalation:abuse"},
			Base: time.Minute, Max: time.Hour, Forget: time.Hour}
		var wg sync.WaitGroup
		var mu sync.Mutex
		made := 0
		for range 16 {
			wg.Go(func() {
				_, m, err := st().Escalate(ctx, e, at)
				if err != nil {
					t.Error(err)
				}
				if m {
					mu.Lock()
					made++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if made != 1 {
			t.Fatalf("%d of 16 servers made the ban; want 1", made)
		}
	})

	t.Run("Bounded", func(t *testing.T) {
		if testing.Short() {
			t.Skip("adds policy.MaxBans bans")
		}
		s := open(t)()
		// The escalations' bans fill their part (the first the one to
		// end soonest)…
		for i := range policy.MaxEscalatedBans {
			base := time.Hour
			if i == 0 {
				base = 30 * time.Minute
			}
			e := policy.Escalated{Key: fmt.Sprint("k", i), Ban: ban(fmt.Sprint("e", i), fmt.Sprintf("10.%d.%d.1", i/256, i%256), 0),
				Base: base, Max: base, Forget: time.Hour}
			e.Ban.Source = "escalation:flood"
			if _, _, err := s.Escalate(ctx, e, at); err != nil {
				t.Fatalf("escalation %d: %v", i, err)
			}
		}
		// …and a new one replaces that one, rather than being refused.
		var evicted []string
		over := policy.Escalated{Key: "o", Ban: ban("over", "192.0.2.2", 0), Base: time.Minute, Max: time.Minute, Forget: time.Hour,
			Evicted: func(id string) { evicted = append(evicted, id) }}
		over.Ban.Source = "escalation:flood"
		if _, made, err := s.Escalate(ctx, over, at); err != nil || !made || len(evicted) != 1 || evicted[0] != "e0" {
			t.Fatalf("escalation past its part: %v, %v, evicted %q; want made, replacing e0", made, err, evicted)
		}
		st, err := s.Load(ctx, at)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(st.Bans); n != policy.MaxEscalatedBans || slices.ContainsFunc(st.Bans, func(b policy.Ban) bool { return b.ID == "e0" }) {
			t.Fatalf("%d bans after the replacement (e0 among them: %v); want %d without e0", n,
				slices.ContainsFunc(st.Bans, func(b policy.Ban) bool { return b.ID == "e0" }), policy.MaxEscalatedBans)
		}
		// …and an operator still bans, up to the whole bound.
		for i := range policy.MaxBans - policy.MaxEscalatedBans {
			if _, _, err := s.Add(ctx, ban(fmt.Sprint("a", i), fmt.Sprintf("11.%d.%d.1", i/256, i%256), time.Hour), at); err != nil {
				t.Fatalf("operator's ban %d: %v", i, err)
			}
		}
		if _, _, err := s.Add(ctx, ban("full", "192.0.2.1", time.Hour), at); !errors.Is(err, policy.ErrBansFull) {
			t.Fatalf("ban %d: %v; want ErrBansFull", policy.MaxBans+1, err)
		}
		// Once some expire there is room again.
		if _, made, err := s.Add(ctx, ban("later", "192.0.2.3", time.Hour), at.Add(time.Hour)); err != nil || !made {
			t.Fatalf("after expiry: %v, %v", made, err)
		}
	})

	t.Run("HistoryKeepsRepeatOffenders", func(t *testing.T) {
		if testing.Short() {
			t.Skip("fills the history")
		}
		s := open(t)()
		e := policy.Escalated{Key: "repeat", Ban: ban("r", "192.0.2.9", 0), Base: time.Second, Max: time.Hour, Forget: 24 * time.Hour}
		now := at
		for range 3 {
			b, _, err := s.Escalate(ctx, e, now)
			if err != nil {
				t.Fatal(err)
			}
			now = b.Expires.Add(time.Second)
		}
		// A flood of identifiers banned once fills the history.
		for i := range policy.MaxBanHistory + 10 {
			f := policy.Escalated{Key: fmt.Sprint("f", i), Ban: ban(fmt.Sprint("f", i), fmt.Sprintf("12.%d.%d.1", i/256, i%256), 0),
				Base: time.Second, Max: time.Second, Forget: 24 * time.Hour}
			if _, _, err := s.Escalate(ctx, f, now); err != nil && !errors.Is(err, policy.ErrBansFull) {
				t.Fatal(err)
			}
			if i%1000 == 999 {
				now = now.Add(2 * time.Second) // the flood's bans end, its history stays
			}
		}
		st, err := s.Load(ctx, now)
		if err != nil {
			t.Fatal(err)
		}
		if st.History["repeat"].Strikes != 3 || len(st.History) > policy.MaxBanHistory {
			t.Fatalf("the repeat offender's history: %+v of %d; want its 3 strikes kept", st.History["repeat"], len(st.History))
		}
	})
}
