package engine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/storetest"
)

func seedStore(t *testing.T) (*memstore.Store, *storetest.Clock) {
	clock := storetest.NewClock()
	s := memstore.New(&memstore.Options{Clock: clock.Now})
	t.Cleanup(func() { s.Close() })
	return s, clock
}

// Seed 002: user 100/s b 50, tenant 1000/s b 200, global 10000/s b 1000.
// At one instant a user never gets past 50, the tenant's users together
// never past 200, and refused requests charge nothing.
func TestSeed002Hierarchy(t *testing.T) {
	s, _ := seedStore(t)
	user := &admit.Rule{Name: "user", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(100), Burst: 50}
	tenant := &admit.Rule{Name: "tenant", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1000), Burst: 200}
	global := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10000), Burst: 1000}
	var d admit.Decision
	admitted := map[string]int{}
	for _, u := range []string{"alice", "bob", "carol", "dave", "eve"} {
		for range 60 {
			c := []admit.Charge{
				{Key: "user/acme/" + u, Rule: user, Cost: 1},
				{Key: "tenant/acme", Rule: tenant, Cost: 1},
				{Key: "global", Rule: global, Cost: 1},
			}
			if err := s.Decide(context.Background(), c, &d); err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted[u]++
			}
		}
	}
	want := map[string]int{"alice": 50, "bob": 50, "carol": 50, "dave": 50}
	if fmt.Sprint(admitted) != fmt.Sprint(want) {
		t.Fatalf("admitted %v, want %v (eve refused by the tenant)", admitted, want)
	}
	// 300 requests, 200 admitted: the 100 refusals charged nothing.
	peek := []admit.Charge{{Key: "user/acme/eve", Rule: user}, {Key: "global", Rule: global}}
	if err := s.Decide(context.Background(), peek, &d); err != nil || d.Results[0].Remaining != 50 || d.Results[1].Remaining != 800 {
		t.Fatalf("eve and global after the refusals: %v %+v", err, d.Results)
	}
}

// Seed 000: a consumer may claim several tokens at once, and waits when
// they are not there.
func TestSeed000ClaimSeveral(t *testing.T) {
	s, clock := seedStore(t)
	email := &admit.Rule{Name: "schedule-email", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 10, Per: time.Minute}, Burst: 1000}
	c := []admit.Charge{{Key: admit.Key{Scope: "tenant", Tenant: "t1234", Action: "schedule-email"}.String(), Rule: email, Cost: 1000}}
	if d, err := storetest.Check(context.Background(), s, c...); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("claim all 1000 at once: %v %+v", err, d)
	}
	c[0].Cost = 5
	d, _ := storetest.Check(context.Background(), s, c...)
	if d.Allowed || d.RetryAfter != 30*time.Second {
		t.Fatalf("claim 5 of none: %+v, want refused, retry after 30s", d)
	}
	clock.Set(30 * time.Second)
	if d, _ := storetest.Check(context.Background(), s, c...); !d.Allowed {
		t.Fatalf("claim 5 after 30s at 10/min: %+v", d)
	}
}

// Seed 004: a bucket of size 5 refilled with 2 tokens every 2 s (1 QPS),
// offered 4 requests a second for 20 s, admits its 5 and then 1 a second.
func TestSeed004TokenBucket(t *testing.T) {
	s, clock := seedStore(t)
	r := &admit.Rule{Name: "seed004", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 2, Per: 2 * time.Second}, Burst: 5}
	c := []admit.Charge{{Key: "client", Rule: r, Cost: 1}}
	admitted := 0
	for at := time.Duration(0); at <= 20*time.Second; at += 250 * time.Millisecond {
		clock.Set(at)
		if d, _ := storetest.Check(context.Background(), s, c...); d.Allowed {
			admitted++
		}
	}
	if admitted != 25 {
		t.Fatalf("admitted %d, want 5 + 20", admitted)
	}
}
