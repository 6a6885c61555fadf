package envoyrls_test

import (
	"context"
	"testing"
	"time"

	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/envoyrls/quotaledgertest"
)

func TestMemoryLedger(t *testing.T) {
	quotaledgertest.Run(t, func(t *testing.T) (a, b envoyrls.QuotaLedger) {
		l := envoyrls.NewMemoryLedger(nil)
		return l, l
	})
}

// TestMemoryLedgerExpires: a state not updated for its TTL is gone, and
// swept from memory.
func TestMemoryLedgerExpires(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := envoyrls.NewMemoryLedger(func() time.Time { return now })
	ctx := context.Background()
	put := func(key string) {
		_ = l.Update(ctx, key, time.Minute, func(time.Time, []byte) ([]byte, bool, error) { return []byte("x"), true, nil })
	}
	put("a")
	now = now.Add(time.Minute)
	var got []byte
	_ = l.Update(ctx, "a", time.Minute, func(_ time.Time, s []byte) ([]byte, bool, error) { got = s; return nil, false, nil })
	if got != nil {
		t.Fatalf("state %q after its TTL", got)
	}
	now = now.Add(2 * time.Minute)
	put("b")
	if n := l.Len(); n != 1 {
		t.Fatalf("%d states held; want the one live", n)
	}
}
