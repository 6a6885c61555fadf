package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/admitdev/admit"
)

// RunWait runs Limiter.Wait on stores of newStore, on the clock: it
// waits for real, a few hundred milliseconds in all.
func RunWait(t *testing.T, newStore Factory) {
	ctx := context.Background()
	who := admit.Who{Tenant: "acme"}
	limiter := func(t *testing.T, limits ...admit.Limit) *admit.Limiter {
		t.Helper()
		l, err := admit.NewLimiter(newStore(t, time.Now), limits...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}

	t.Run("waiters_admitted_in_turn", func(t *testing.T) {
		l := limiter(t, admit.Bucket("b", admit.PerSecond(20), 1).Per(admit.PerTenant))
		start := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, 5)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, err := l.Wait(ctx, who)
				if err == nil && !d.Allowed {
					err = errors.New("not admitted")
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
		}
		// A burst of 1 at 20 a second: the fifth 200 ms after the first.
		if took := time.Since(start); took < 190*time.Millisecond {
			t.Errorf("5 waiters of a bucket of burst 1 at 20/s admitted in %v, want at least 200 ms", took)
		}
	})

	t.Run("deadline_too_soon", func(t *testing.T) {
		l := limiter(t, admit.Bucket("b", admit.Rate{N: 1, Per: time.Minute}, 1).Per(admit.PerTenant))
		if d, err := l.Allow(ctx, who); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := l.Wait(dctx, who)
		if admit.ErrorCode(err) != admit.CodeExhausted || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a wait of a minute with a deadline in 1 s: %v; want refused at once (exhausted)", err)
		}
	})

	t.Run("never", func(t *testing.T) {
		l := limiter(t, admit.Bucket("b", admit.PerSecond(10), 3).Per(admit.PerTenant))
		if _, err := l.WaitN(ctx, who, 4); admit.ErrorCode(err) != admit.CodeInvalid {
			t.Errorf("WaitN of 4 with a burst of 3: %v; want invalid", err)
		}
		if _, err := l.WaitN(ctx, who, 0); admit.ErrorCode(err) != admit.CodeInvalid {
			t.Errorf("WaitN of 0: %v; want invalid", err)
		}
	})

	t.Run("cancelled_gives_back", func(t *testing.T) {
		l := limiter(t, admit.Bucket("b", admit.PerSecond(10), 1).Per(admit.PerTenant))
		if d, err := l.Allow(ctx, who); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { _, err := l.Wait(cctx, who); done <- err }()
		time.Sleep(10 * time.Millisecond)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("a cancelled wait: %v", err)
		}
		// Its booking given back, the next token is the drained bucket's
		// own: at most 100 ms away, not 200.
		d, err := l.Peek(ctx, who)
		if err != nil {
			t.Fatal(err)
		}
		if d.RetryAfter > 100*time.Millisecond {
			t.Errorf("after a cancelled wait, the next token in %v; want at most 100 ms (the booking given back)", d.RetryAfter)
		}
	})

	t.Run("window", func(t *testing.T) {
		l := limiter(t, admit.Window("w", 2, 200*time.Millisecond).Per(admit.PerTenant))
		for i := range 3 {
			d, err := l.Wait(ctx, who)
			if err != nil || !d.Allowed {
				t.Fatalf("wait %d: %+v, %v", i, d, err)
			}
		}
		h := limiter(t, admit.Window("h", 1, time.Hour).Per(admit.PerTenant))
		if d, err := h.Allow(ctx, who); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := h.Wait(dctx, who); admit.ErrorCode(err) != admit.CodeExhausted || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a wait for an hour's window with a deadline in 1 s: %v; want refused at once (exhausted)", err)
		}
	})
}
