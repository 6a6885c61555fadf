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
