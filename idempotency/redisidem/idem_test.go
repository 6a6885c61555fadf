package redisidem_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit/idempotency"
	"github.com/admitdev/admit/idempotency/idemtest"
	"github.com/admitdev/admit/idempotency/redisidem"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
)

var prefixes atomic.Int64

func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	idemtest.Run(t, func(t *testing.T, perScope int) idempotency.Store {
		s, err := redisstore.Open(context.Background(), "redis://"+srv.Addr, &redisstore.Options{
			Prefix: "idem" + strconv.FormatInt(prefixes.Add(1), 10) + ":", Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return redisidem.New(s, perScope)
	})
}
