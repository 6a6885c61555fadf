package wsgateway_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/coder/websocket"

	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/storetest"
	"github.com/admitdev/admit/wsgateway"
)

var unlimited = policy.GatewaySpec{
	TenantConnections: 100000, ConnectionsPerSession: 100000, TenantPerMinute: 1e9,
	SessionPerMinute: 1e9, SessionTTL: "1h", MessagesPerMinute: 1e9,
}

// BenchmarkConnect measures a connection's whole life on loopback: the
// client's dial and handshake, the authorizer, the admission decision,
// the upgrade, and the close that releases the slot.
func BenchmarkConnect(b *testing.B) {
	h := newHarness(b, unlimited, unlimited, nil)
	s, err := h.g.CreateSession(context.Background(), "t1")
	if err != nil {
		b.Fatal(err)
	}
	u := h.url("t1", s.ID)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c, _, err := websocket.Dial(context.Background(), u, nil)
			if err != nil {
				b.Error(err)
				return
			}
			c.CloseNow()
		}
	})
}

// BenchmarkMessage measures one message's round trip: decided against
// messages_per_minute (and, shared, a fair global rule naming
// ws:message), queued on its route, echoed to the session.
func BenchmarkMessage(b *testing.B) {
	for _, route := range []string{wsgateway.RouteSilo, wsgateway.RoutePool, "shared"} {
		b.Run(route, func(b *testing.B) {
			var h *harness
			if route == "shared" {
				clock := storetest.NewClock()
				st := memstore.New(&memstore.Options{Clock: clock.Now})
				defer st.Close()
				// Tiers of roomy limits: 100,000 messages a minute.
				h, _ = sharedHarness(b, st, clock, policy.RuleSpec{
					Name: "global-ws", Scope: "global", Actions: []string{wsgateway.ActionMessage},
					Algorithm: "token_bucket", Rate: "1000000000/s", Burst: ptr(1e9),
				})
				route = wsgateway.RoutePool
			} else {
				h = newHarness(b, unlimited, unlimited, nil)
			}
			var tenant atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				// Each goroutine is a session of its own tenant (t1,
				// t2, t3 in turn): the silo route's workers are per
				// tenant.
				tn := fmt.Sprintf("t%d", tenant.Add(1)%3+1)
				s, err := h.g.CreateSession(context.Background(), tn)
				if err != nil {
					b.Error(err)
					return
				}
				c, _, err := websocket.Dial(context.Background(), h.url(tn, s.ID), nil)
				if err != nil {
					b.Error(err)
					return
				}
				defer c.CloseNow()
				msg := []byte(`{"route":"` + route + `","id":"b","data":{"n":1}}`)
				for pb.Next() {
					if err := c.Write(context.Background(), websocket.MessageText, msg); err != nil {
						b.Error(err)
						return
					}
					if _, data, err := c.Read(context.Background()); err != nil || !strings.Contains(string(data), `"echo"`) {
						b.Errorf("%s %v", data, err)
						return
					}
				}
			})
		})
	}
}
