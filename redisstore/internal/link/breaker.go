package link

import (
	"sync/atomic"
	"time"
)

// Breaker is a circuit breaker: after threshold consecutive failures it
// opens, and calls fail at once instead of waiting out a timeout on a store
// that is down. After cooldown it lets one probe call through (half-open);
// the probe's success closes it, its failure opens it for another cooldown.
// A breaker with its threshold and cooldown set starts closed. It is safe
// for concurrent use, and a closed breaker costs two atomic loads a call.
type Breaker struct {
	Threshold int64
	Cooldown  time.Duration

	failures atomic.Int64 // consecutive
	openAt   atomic.Int64 // Unix ns the breaker opened; 0 while closed
	probing  atomic.Bool  // a probe call is out
}

// allow reports whether a call may go to the store now.
func (b *Breaker) allow(now time.Time) bool {
	at := b.openAt.Load()
	if at == 0 {
		return true
	}
	if now.UnixNano()-at < int64(b.Cooldown) {
		return false
	}
	return b.probing.CompareAndSwap(false, true)
}

func (b *Breaker) success() {
	if b.failures.Load() != 0 {
		b.failures.Store(0)
	}
	if b.openAt.Load() != 0 {
		b.openAt.Store(0)
		b.probing.Store(false)
	}
}

// failure records a failed call, and reports whether it opened a closed
// breaker.
func (b *Breaker) failure(now time.Time) bool {
	if n := b.failures.Add(1); n >= b.Threshold || b.probing.Load() {
		opened := b.openAt.Swap(now.UnixNano()) == 0
		b.probing.Store(false)
		return opened
	}
	return false
}

// State names the breaker's state at now: closed, open or half-open.
func (b *Breaker) State(now time.Time) string {
	at := b.openAt.Load()
	switch {
	case at == 0:
		return "closed"
	case b.probing.Load() || now.UnixNano()-at >= int64(b.Cooldown):
		return "half-open"
	}
	return "open"
}
