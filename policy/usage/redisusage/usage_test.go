package redisusage_test

import (
	"context"
	"testing"
	"time"

	"github.com/admitdev/admit/policy/usage"
	"github.com/admitdev/admit/policy/usage/redisusage"
	"github.com/admitdev/admit/policy/usage/usagetest"
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
			usagetest.Run(t, func(t *testing.T) usage.Store {
				s, err := redisstore.Open(context.Background(), u, &redisstore.Options{Timeout: 10 * time.Second, Prefix: t.Name() + ":"})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return redisusage.New(s, 0)
			})
		})
	}
}
