package redisstore_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
)

// TestHomeGiveBacksOnce: a give-back sent twice, or late after a later
// one, or for another incarnation of the key, is applied at most once;
// so a duplicated or reordered message never hands out a unit twice.
func TestHomeGiveBacksOnce(t *testing.T) {
	srv, s := scriptStore(t)
	// A bucket of 1 a minute, burst 100: nothing refills meanwhile.
	bucket := func(want int, back ...string) []int64 {
		t.Helper()
		args := append([]string{"a", "b", strconv.Itoa(want), "0", "1", "60000000", "100", "100", "0", "100"}, back...)
		v, err := redisstore.HomeCall(s, "home", args...)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// A fresh server fences new buckets for τ + lookahead (100 minutes
	// here): wait it out by letting the key start long after.
	if _, err := redistest.Command(srv.Addr, "HSET", "home", "tat", "0", "gen", "1"); err != nil {
		t.Fatal(err)
	}
	g := bucket(60)
	if g[0] != 60 || g[3] != 1 {
		t.Fatalf("granted %v, want 60 of gen 1", g)
	}
	// Give back 10 with seq 5, twice: applied once.
	bucket(0, "1", "10", "5")
	bucket(0, "1", "10", "5")
	// Then a late one (seq 4) and one of another incarnation: ignored.
	bucket(0, "1", "10", "4")
	bucket(0, "2", "10", "6")
	if g = bucket(1000); g[0] != 50 {
		t.Errorf("after give-backs, granted %d of what was left; want 50 (40 left + 10 given back once)", g[0])
	}
}

// TestPoolDepositsOnce: a grant added to a pool twice (the call sent
// again) is added once.
func TestPoolDepositsOnce(t *testing.T) {
	_, s := scriptStore(t)
	for range 2 {
		v, err := redisstore.PoolCall(s, "pool", "d", "7", "0", "25", "1000", "4000000000000000", "12345", "0", "100")
		if err != nil {
			t.Fatal(err)
		}
		if v[0] != 25 {
			t.Fatalf("the pool holds %d after the grant of 25 was added twice", v[0])
		}
	}
	// A take of everything gets 25, all unlocked within the horizon.
	v, err := redisstore.PoolCall(s, "pool", "t", "100", "0", "60000000", "300000", "1000", "0", "0")
	if err != nil {
		t.Fatal(err)
	}
	if v[0] != 25 || v[7] != 25 {
		t.Errorf("took %d (%d ready), want the 25 added, all unlocked", v[0], v[7])
	}
}

// scriptStore starts a redis-server and a store on it, for calling the
// regions' scripts directly.
func scriptStore(t *testing.T) (*redistest.Server, *redisstore.Store) {
	t.Helper()
	srv := redistest.Start(t)
	s, err := redisstore.Open(context.Background(), "redis://"+srv.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return srv, s
}

// TestPoolResendsUntilAcknowledged: what a pool has to send home (a
// debt here) is sent again by every refill until the home has it, and
// the home applies it once: a refill whose reply was lost loses nothing.
func TestPoolResendsUntilAcknowledged(t *testing.T) {
	_, s := scriptStore(t)
	if _, err := redisstore.PoolCall(s, "pool", "r", "7", "0", "0", "-40"); err != nil {
		t.Fatal(err)
	}
	prepare := func() []int64 {
		v, err := redisstore.PoolCall(s, "pool", "a", "300000", "0")
		if err != nil {
			t.Fatal(err)
		}
		return v[4:] // gen, units, seq triples
	}
	first := prepare() // its reply lost: never acknowledged
	again := prepare()
	if len(first) != 3 || first[0] != 7 || first[1] != -40 || len(again) != 3 || again[2] != first[2] {
		t.Fatalf("sent %v, then %v: want the debt of 40, gen 7, sent again with its number", first, again)
	}
	if _, err := redisstore.PoolCall(s, "pool", "k", itoa(again[2])); err != nil {
		t.Fatal(err)
	}
	if rest := prepare(); len(rest) != 0 {
		t.Errorf("after the home acknowledged it, the pool sends %v", rest)
	}
}
