package redishook

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
	"github.com/redis/rueidis"
)

// Follow calls changed whenever a server saves what a store keeps beside
// its limits under revKey (the tenant catalog, the bans), until ctx ends:
// on the save's message on channel, and when a poll of revKey every poll
// interval finds it changed (a message published while this server was
// disconnected is lost; a Redis that came back empty has none). It also
// calls it after each lost subscription, and once each subscription is
// made again. store is a *redisstore.Store; timeout bounds each poll.
//
// changed runs on a goroutine of its own, never on the connection's: the
// subscription's callback only marks that a call is due, so a changed
// that waits (for a lock an admin write holds while it waits for Redis)
// never holds up the replies of the connection the store's decisions
// share. Calls due while one runs are made once, after it; a call that
// fails is made again at every poll until one succeeds.
func Follow(ctx context.Context, store any, channel, revKey string, timeout, poll time.Duration, changed func() error) {
	due := make(chan struct{}, 1)
	kick := func() {
		select {
		case due <- struct{}{}:
		default:
		}
	}
	var failed atomic.Bool
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-due:
				failed.Store(changed() != nil)
			}
		}
	}()
	go pollRevision(ctx, store, revKey, timeout, poll, kick, &failed)
	// While Redis is down, subscribing fails at once: wait longer after
	// each failure (200 ms doubling to 5 s), and start again from 200 ms
	// after a subscription that held.
	const minWait, maxWait = 200 * time.Millisecond, 5 * time.Second
	wait := minWait
	// Each (re)subscription catches up at once: messages published while
	// this server was away are lost, and Redis may have come back empty
	// (the catalog then saves its copy back).
	hooked := rueidis.WithOnSubscriptionHook(ctx, func(s rueidis.PubSubSubscription) {
		if s.Kind == "subscribe" {
			kick()
		}
	})
	for ctx.Err() == nil {
		began := time.Now()
		var err error = admit.Errorf(admit.CodeUnavailable, "no connection to Redis yet")
		if client := Client(store); client != nil {
			err = client.Receive(hooked, client.B().Subscribe().Channel(channel).Build(), func(rueidis.PubSubMessage) {
				kick()
			})
		}
		if ctx.Err() != nil {
			return
		}
		_ = err // the connection dropped: subscribe again, and catch up
		if time.Since(began) > maxWait {
			wait = minWait
		}
		kick()
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, maxWait)
	}
}

// pollRevision reads the saved revision every poll interval and calls
// kick when it is not the one it read last (absent included: a Redis that
// lost the catalog), cannot be read, or the last call failed, and every
// 30 polls whatever it reads: a catalog saved by a server that does not
// keep the revision apart is seen then.
func pollRevision(ctx context.Context, store any, revKey string, timeout, poll time.Duration, kick func(), failed *atomic.Bool) {
	t := time.NewTicker(poll)
	defer t.Stop()
	last := ""
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rev := "?"
		if client := Client(store); client != nil {
			pctx, cancel := context.WithTimeout(ctx, timeout)
			v, err := client.Do(pctx, client.B().Get().Key(revKey).Build()).ToString()
			cancel()
			switch {
			case err == nil:
				rev = v
			case rueidis.IsRedisNil(err):
				rev = ""
			}
		}
		if rev != last || rev == "?" || failed.Load() || n%30 == 0 {
			kick()
		}
		last = rev
	}
}
