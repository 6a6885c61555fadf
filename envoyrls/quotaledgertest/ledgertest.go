// Package quotaledgertest is the conformance suite of
// envoyrls.QuotaLedger, run on every implementation.
package quotaledgertest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/envoyrls"
)

// Run runs the suite. open returns two ledgers of one deployment (two
// servers' views of it).
func Run(t *testing.T, open func(t *testing.T) (a, b envoyrls.QuotaLedger)) {
	ctx := context.Background()
	t.Run("empty, stored, read back", func(t *testing.T) {
		a, b := open(t)
		key := t.Name()
		if err := a.Update(ctx, key, time.Minute, func(now time.Time, s []byte) ([]byte, bool, error) {
			if s != nil {
				t.Errorf("a new key's state is %q", s)
			}
			if now.IsZero() {
				t.Error("no clock")
			}
			return []byte("one"), true, nil
		}); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := b.Update(ctx, key, time.Minute, func(_ time.Time, s []byte) ([]byte, bool, error) {
			got = string(s)
			return nil, false, nil
		}); err != nil {
			t.Fatal(err)
		}
		if got != "one" {
			t.Fatalf("the other server read %q; want one", got)
		}
	})
	t.Run("not stored", func(t *testing.T) {
		a, _ := open(t)
		key := t.Name()
		for range 2 {
			if err := a.Update(ctx, key, time.Minute, func(_ time.Time, s []byte) ([]byte, bool, error) {
				if s != nil {
					t.Errorf("state %q; an update that stores nothing left one", s)
				}
				return []byte("x"), false, nil
			}); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("error", func(t *testing.T) {
		a, _ := open(t)
		bad := errors.New("bad")
		if err := a.Update(ctx, t.Name(), time.Minute, func(time.Time, []byte) ([]byte, bool, error) { return []byte("x"), true, bad }); !errors.Is(err, bad) {
			t.Fatalf("got %v; want fn's error", err)
		}
	})
	t.Run("all or nothing", func(t *testing.T) {
		// Two servers' updates, many at once, each adding one: none is
		// lost.
		a, b := open(t)
		key := t.Name()
		const each = 40
		var wg sync.WaitGroup
		var failed sync.Map
		for g := range 8 {
			l := a
			if g%2 == 1 {
				l = b
			}
			wg.Go(func() {
				for range each {
					for {
						err := l.Update(ctx, key, time.Minute, func(_ time.Time, s []byte) ([]byte, bool, error) {
							n, _ := strconv.Atoi(string(s))
							return []byte(strconv.Itoa(n + 1)), true, nil
						})
						if err == nil {
							break
						}
						if admit.ErrorCode(err) != admit.CodeConflict {
							failed.Store(g, err)
							return
						}
					}
				}
			})
		}
		wg.Wait()
		failed.Range(func(_, v any) bool { t.Error(v); return true })
		var got string
		_ = a.Update(ctx, key, time.Minute, func(_ time.Time, s []byte) ([]byte, bool, error) {
			got = string(s)
			return nil, false, nil
		})
		if got != strconv.Itoa(8*each) {
			t.Fatalf("count %s; want %d", got, 8*each)
		}
	})
}
