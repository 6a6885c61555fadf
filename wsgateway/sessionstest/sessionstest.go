// Package sessionstest is the conformance suite of wsgateway.Sessions: the
// behaviour every implementation must have, run on each of them.
package sessionstest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/wsgateway"
)

// recorder collects a subscriber's events.
type recorder struct {
	mu  sync.Mutex
	evs []wsgateway.Event
}

func (r *recorder) add(ev wsgateway.Event) { r.mu.Lock(); r.evs = append(r.evs, ev); r.mu.Unlock() }

func (r *recorder) events() []wsgateway.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]wsgateway.Event(nil), r.evs...)
}

func (r *recorder) wait(t *testing.T, n int) []wsgateway.Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(r.events()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d events of %d within 5s", len(r.events()), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return r.events()
}

// Run runs the suite. open returns two Sessions that share their sessions,
// as two gateway servers of one deployment do (for a store of one
// process, the same Sessions twice), closed when the test ends.
func Run(t *testing.T, open func(t *testing.T) (a, b wsgateway.Sessions)) {
	ctx := context.Background()
	a, b := open(t)

	t.Run("lifecycle", func(t *testing.T) {
		s, err := a.Create(ctx, wsgateway.Session{Tenant: "t1", ID: "life"}, 300*time.Millisecond)
		if err != nil || s.Tenant != "t1" || time.Until(s.ExpiresAt) > time.Second {
			t.Fatalf("Create: %+v %v", s, err)
		}
		if _, err := b.Create(ctx, wsgateway.Session{Tenant: "t2", ID: "life"}, time.Minute); admit.ErrorCode(err) != admit.CodeConflict {
			t.Errorf("creating an existing id: %v", err)
		}
		got, err := b.Get(ctx, "life")
		if err != nil || got.Tenant != "t1" || got.ExpiresAt.Sub(s.ExpiresAt).Abs() > 50*time.Millisecond {
			t.Errorf("Get on the other server: %+v %v (created %+v)", got, err, s)
		}
		time.Sleep(200 * time.Millisecond)
		touched, err := b.Touch(ctx, "life", 300*time.Millisecond)
		if err != nil || !touched.ExpiresAt.After(s.ExpiresAt) {
			t.Errorf("Touch: %+v %v", touched, err)
		}
		time.Sleep(200 * time.Millisecond) // past the first deadline, before the second
		if _, err := a.Get(ctx, "life"); err != nil {
			t.Errorf("touched session gone: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
		for _, err := range []error{
			func() error { _, err := a.Get(ctx, "life"); return err }(),
			func() error { _, err := a.Touch(ctx, "life", time.Minute); return err }(),
			func() error { _, err := a.Publish(ctx, "life", time.Minute, []byte(`{"x":1`)); return err }(),
			a.Delete(ctx, "life"),
		} {
			if admit.ErrorCode(err) != admit.CodeNotFound {
				t.Errorf("after expiry: %v, want not found", err)
			}
		}
	})

	t.Run("frames in order on both servers", func(t *testing.T) {
		if _, err := a.Create(ctx, wsgateway.Session{Tenant: "t1", ID: "order"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		var ra, rb, rb2, other recorder
		for _, sub := range []struct {
			s  wsgateway.Sessions
			id string
			r  *recorder
		}{{a, "order", &ra}, {b, "order", &rb}, {b, "order", &rb2}} {
			stop, err := sub.s.Subscribe(ctx, sub.id, sub.r.add)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(stop)
		}
		if _, err := a.Create(ctx, wsgateway.Session{Tenant: "t1", ID: "elsewhere"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		stop, _ := b.Subscribe(ctx, "elsewhere", other.add)
		defer stop()
		// Both servers publish at once: every subscriber sees 1..n in
		// order, whatever server published.
		const n = 300
		var wg sync.WaitGroup
		for _, s := range []wsgateway.Sessions{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range n / 2 {
					if _, err := s.Publish(ctx, "order", time.Minute, fmt.Appendf(nil, `{"i":%d`, i)); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		for name, r := range map[string]*recorder{"a": &ra, "b": &rb, "b2": &rb2} {
			evs := r.wait(t, n)
			for i, ev := range evs {
				if ev.Seq != int64(i+1) || string(ev.Frame[len(ev.Frame)-len(fmt.Sprintf(`,"seq":%d}`, i+1)):]) != fmt.Sprintf(`,"seq":%d}`, i+1) {
					t.Fatalf("%s: event %d: seq %d frame %s", name, i, ev.Seq, ev.Frame)
				}
				if time.Until(ev.ExpiresAt) < 50*time.Second {
					t.Fatalf("%s: expires_at %v", name, ev.ExpiresAt)
				}
			}
		}
		if got := len(other.events()); got != 0 {
			t.Errorf("another session's subscriber got %d events", got)
		}
		// Delete reaches both servers.
		if err := b.Delete(ctx, "order"); err != nil {
			t.Fatal(err)
		}
		for _, r := range []*recorder{&ra, &rb} {
			if evs := r.wait(t, n+1); evs[n].Closed != "deleted" {
				t.Errorf("last event %+v", evs[n])
			}
		}
	})

	t.Run("subscribe to a missing session", func(t *testing.T) {
		if _, err := a.Subscribe(ctx, "missing", func(wsgateway.Event) {}); admit.ErrorCode(err) != admit.CodeNotFound {
			t.Errorf("Subscribe: %v", err)
		}
	})
}
