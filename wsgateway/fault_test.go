package wsgateway_test

import (
	"net/http"
	"testing"

	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/storetest"
	"github.com/admitdev/admit/wsgateway"
)

// TestStoreDown: with the store unavailable a connection is admitted open
// (past its limits: nothing can count them), refused 503 closed, and
// decided by the local limiter local; messages flow open; a store that
// answers fewer results than charges refuses with 500, never a panic.
func TestStoreDown(t *testing.T) {
	one := policy.GatewaySpec{ConnectionsPerSession: 1, TenantConnections: 5, TenantPerMinute: 100, SessionPerMinute: 100, MessagesPerMinute: 100}
	newFaulty := func(t *testing.T, mode string) (*harness, *storetest.Faulty) {
		f := &storetest.Faulty{Store: memstore.New(nil)}
		t.Cleanup(func() { f.Store.Close() })
		h := newHarness(t, one, one, &wsgateway.Options{Store: f})
		h.setPolicy(one, one, mode)
		return h, f
	}
	t.Run("open", func(t *testing.T) {
		h, f := newFaulty(t, "open")
		s := h.session("t1")
		f.Down.Store(true)
		a := h.mustDial("t1", s)
		b := h.mustDial("t1", s) // over connections_per_session 1: nothing counts it
		send(t, a, `{"route":"silo","id":"m1","data":1}`)
		if fr := read(t, a); fr.Type != "echo" || fr.ID != "m1" {
			t.Fatalf("echo while the store is down: %+v", fr)
		}
		if fr := read(t, b); fr.ID != "m1" {
			t.Fatalf("the other connection: %+v", fr)
		}
	})
	t.Run("closed", func(t *testing.T) {
		h, f := newFaulty(t, "closed")
		s := h.session("t1")
		f.Down.Store(true)
		h.mustRefuse("t1", s, http.StatusServiceUnavailable, "")
	})
	t.Run("local", func(t *testing.T) {
		h, f := newFaulty(t, "local")
		s := h.session("t1")
		f.Down.Store(true)
		h.mustDial("t1", s)
		h.mustRefuse("t1", s, http.StatusTooManyRequests, wsgateway.LimitConnectionsPerSession)
	})
	t.Run("short", func(t *testing.T) {
		h, f := newFaulty(t, "open")
		s := h.session("t1")
		f.Short.Store(true)
		h.mustRefuse("t1", s, http.StatusInternalServerError, "")
	})
}
