package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/admitdev/admit"
)

// RunLimiter runs what admit.Limiter promises of a store's decisions, on
// a stopped clock.
func RunLimiter(t *testing.T, newStore Factory) {
	ctx := context.Background()
	// Peek says each limit's level, the refusing and the admitting alike,
	// charging none: after 15 requests at a 10/s bucket and a daily
	// window, the bucket is spent and the window holds what the 10
	// admitted left.
	t.Run("peek_per_limit", func(t *testing.T) {
		clock := NewClock()
		l, err := admit.NewLimiter(newStore(t, clock.Now), admit.Bucket("second", admit.PerSecond(10), 10).Per(admit.PerUser),
			admit.Window("daily", 1000, 24*time.Hour).Per(admit.PerUser))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		who := admit.Who{User: "alice"}
		for range 15 {
			if _, err := l.Allow(ctx, who); err != nil {
				t.Fatal(err)
			}
		}
		for range 2 { // the second peek sees what the first left
			p, err := l.Peek(ctx, who)
			if err != nil || p.Allowed || p.DeniedBy != "second" {
				t.Fatalf("peek: %+v %v; want refused by the bucket", p, err)
			}
			second, ok := p.Result("second")
			if !ok || second.Allowed || second.Remaining != 0 || second.RetryAfter != 100*time.Millisecond {
				t.Errorf("peek's result of the bucket: %+v %v; want refused, nothing left, retry in 100ms", second, ok)
			}
			daily, ok := p.Result("daily")
			if !ok || !daily.Allowed || daily.Limit != 1000 || daily.Remaining != 989 {
				t.Errorf("peek's result of the daily window: %+v %v; want admitting, 989 left after a request (10 admitted of 1,000)", daily, ok)
			}
		}
	})
}
