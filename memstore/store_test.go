package memstore_test

import (
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/storetest"
)

func newStore(t *testing.T, clock func() time.Time) admit.Store {
	s := memstore.New(&memstore.Options{Clock: clock, Shards: 16})
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) { storetest.Run(t, newStore) }

func TestFairShares(t *testing.T) {
	storetest.RunFairShares(t, func(t *testing.T, clock func() time.Time) []admit.Store {
		return []admit.Store{newStore(t, clock)}
	})
}
