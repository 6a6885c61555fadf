package redisbans_test

import (
	"context"
	"testing"
	"time"

	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/banstest"
	"github.com/admitdev/admit/policy/redisbans"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
)

func TestConformance(t *testing.T) {
	for name, url := range map[string]func(t *testing.T) string{
		"standalone": func(t *testing.T) string { return "redis://" + redistest.Start(t).Addr },
		"cluster":    func(t *testing.T) string { return "redis+cluster://" + redistest.StartCluster(t, 3)[0].Addr },
	} {
		t.Run(name, func(t *testing.T) {
			u := url(t)
			banstest.Run(t, func(t *testing.T) func() policy.BanStore {
				// Each call is another server of the deployment: a
				// store of its own over the same Redis and prefix.
				prefix := t.Name() + ":"
				return func() policy.BanStore {
					s, err := redisstore.Open(context.Background(), u, &redisstore.Options{Timeout: 10 * time.Second, Prefix: prefix})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { s.Close() })
					return redisbans.New(s)
				}
			})
		})
	}
}

// TestBansRestoredToAnEmptyRedis: Redis comes back empty; the next load
// finds it lost the bans and the server saves back the ones it holds.
func TestBansRestoredToAnEmptyRedis(t *testing.T) {
	ctx := context.Background()
	r := redistest.Start(t)
	open := func() *redisbans.Store {
		s, err := redisstore.Open(ctx, "redis://"+r.Addr, &redisstore.Options{Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return redisbans.New(s)
	}
	bans := policy.NewBans(open())
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := bans.Start(cctx, nil); err != nil {
		t.Fatal(err)
	}
	ban, err := bans.Add(ctx, policy.Ban{Scope: policy.BanIP, Value: "192.0.2.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := bans.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := redistest.Command(r.Addr, "FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	if err := bans.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := bans.Get(ban.ID); !ok {
		t.Fatal("the ban is gone from the server after Redis lost it")
	}
	st, err := open().Load(ctx, time.Now())
	if err != nil || len(st.Bans) != 1 || st.Bans[0].ID != ban.ID {
		t.Fatalf("Redis after the restore: %+v, %v", st, err)
	}
	if n := bans.Stats().Restored.Load(); n != 1 {
		t.Fatalf("restored %d; want 1", n)
	}
}
