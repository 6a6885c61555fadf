package redisquota_test

import (
	"context"
	"testing"
	"time"

	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/envoyrls/quotaledgertest"
	"github.com/admitdev/admit/envoyrls/redisquota"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
)

func open(url string) func(t *testing.T) (a, b envoyrls.QuotaLedger) {
	return func(t *testing.T) (a, b envoyrls.QuotaLedger) {
		server := func() envoyrls.QuotaLedger {
			st, err := redisstore.Open(context.Background(), url, &redisstore.Options{Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return redisquota.New(st)
		}
		return server(), server()
	}
}

func TestLedgerStandalone(t *testing.T) {
	srv := redistest.Start(t)
	quotaledgertest.Run(t, open("redis://"+srv.Addr))
}

func TestLedgerCluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	quotaledgertest.Run(t, open("redis+cluster://"+nodes[0].Addr+","+nodes[1].Addr))
}

// TestLedgerDown: with Redis gone, an update fails as the store does, and
// fn is not called.
func TestLedgerDown(t *testing.T) {
	srv := redistest.Start(t)
	a, _ := open("redis://" + srv.Addr)(t)
	srv.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := a.Update(ctx, "k", time.Minute, func(time.Time, []byte) ([]byte, bool, error) {
		t.Error("fn called without Redis")
		return nil, false, nil
	})
	if err == nil {
		t.Fatal("no error without Redis")
	}
}
