package admit

import (
	"context"
	"math"
	"time"
)

// Wait blocks until a request of cost 1 from w is admitted, or ctx ends:
// WaitN(ctx, w, 1).
func (l *Limiter) Wait(ctx context.Context, w Who) (Decision, error) {
	return l.WaitN(ctx, w, 1)
}

// WaitN blocks until a request of cost n ≥ 1 from w is admitted, as
// x/time/rate's Limiter.WaitN does. It returns an error, having charged
// nothing, when n is more than a limit ever holds, when ctx ends first,
// or at once when ctx's deadline comes before the request could be
// admitted. The admitted Decision is returned as AllowN's is: a
// concurrency limit's slots it holds are released with Release.
//
// When every limit is a token bucket or GCRA, the request books its
// place (see Store.Reserve): waiters are admitted in the order they
// arrived, each at the time the limits can bear it, and one whose ctx
// ends gives its booking back. Otherwise WaitN asks again each time a
// refusal says a request could pass, so waiters are admitted in no set
// order.
func (l *Limiter) WaitN(ctx context.Context, w Who, n int64) (Decision, error) {
	if n < 1 {
		return Decision{}, costError("WaitN", n)
	}
	// A cost a limit can never admit at once is the store's CodeInvalid,
	// returned at the first call rather than waited on.
	if l.reservable {
		return l.waitReserved(ctx, w, n)
	}
	for {
		d, err := l.AllowN(ctx, w, n)
		if err != nil || d.Allowed {
			return d, err
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d.RetryAfter {
			return Decision{RetryAfter: d.RetryAfter}, Errorf(CodeExhausted, "admit.Limiter.WaitN: %q admits in %v, after the context's deadline", d.DeniedBy, d.RetryAfter.Round(time.Millisecond))
		}
		if err := sleep(ctx, d.RetryAfter); err != nil {
			return Decision{}, err
		}
	}
}

// waitReserved books n in every limit of l, all reservable, and waits
// for the booking.
func (l *Limiter) waitReserved(ctx context.Context, w Who, n int64) (Decision, error) {
	maxWait := time.Duration(math.MaxInt64)
	if dl, ok := ctx.Deadline(); ok {
		maxWait = max(time.Until(dl), 0)
	}
	var d Decision
	charges := make([]Charge, len(l.rules))
	for i, r := range l.rules {
		c := &charges[i]
		if err := l.charge(c, &d, i, &w); err != nil {
			return Decision{}, err
		}
		c.Rule, c.Cost = r, n
	}
	res, err := l.store.Reserve(ctx, charges, maxWait)
	if err != nil {
		if ErrorCode(err) == CodeUnavailable && failsOpen(charges) {
			return Decision{Allowed: true, FailedOpen: true, At: time.Now()}, nil
		}
		return Decision{}, err
	}
	if !res.OK {
		e := Errorf(CodeExhausted, "admit.Limiter.WaitN: admitted in %v, after the context's deadline", res.Wait.Round(time.Millisecond))
		return Decision{RetryAfter: res.Wait}, e
	}
	if err := sleep(ctx, time.Until(res.At)); err != nil {
		// Give the booking back, for the waiters behind it.
		_ = l.store.CancelReservation(context.WithoutCancel(ctx), res.ID)
		return Decision{}, err
	}
	return Decision{Allowed: true, At: res.At}, nil
}

// sleep waits d, or until ctx ends with its error.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
