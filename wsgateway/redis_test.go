package wsgateway_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
	"github.com/admitdev/admit/wsgateway"
	"github.com/admitdev/admit/wsgateway/redissessions"
)

// redisGateway is one gateway server on a shared Redis.
type redisGateway struct {
	g   *wsgateway.Gateway
	srv *httptest.Server
}

func startRedisGateway(t *testing.T, url string, p *policy.Policy) *redisGateway {
	t.Helper()
	st, err := redisstore.Open(context.Background(), url, &redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sessions := redissessions.New(st)
	g, err := wsgateway.New(wsgateway.Options{Store: st, Policy: func() *policy.Policy { return p }, Sessions: sessions})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Close(ctx)
		srv.Close()
		sessions.Close()
		st.Close()
	})
	return &redisGateway{g: g, srv: srv}
}

func (r *redisGateway) dial(t *testing.T, tenant, session string) (*websocket.Conn, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u := "ws" + strings.TrimPrefix(r.srv.URL, "http") + "/v1/ws?tenant=" + tenant + "&session=" + session
	c, resp, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		if resp == nil {
			t.Fatal(err)
		}
		return nil, resp.StatusCode
	}
	t.Cleanup(func() { c.CloseNow() })
	return c, http.StatusSwitchingProtocols
}

// TestTwoGatewaysOnRedis: two gateway servers on one Redis share sessions,
// connection counts and limits, and a reply reaches the session's
// connections on the other server.
func TestTwoGatewaysOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	p, err := policy.Compile(&policy.Spec{
		Tiers: map[string]policy.TierSpec{"a": {Gateway: &policy.GatewaySpec{
			TenantConnections: 3, ConnectionsPerSession: 2, TenantPerMinute: 100,
			SessionPerMinute: 100, SessionTTL: "200s", MessagesPerMinute: 100000,
		}}},
		Tenants: map[string]policy.TenantSpec{"t1": {Tier: "a"}, "t2": {Tier: "a"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	one, two := startRedisGateway(t, url, p), startRedisGateway(t, url, p)
	s, err := one.g.CreateSession(context.Background(), "t1")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := one.dial(t, "t1", s.ID)
	b, _ := two.dial(t, "t1", s.ID)
	if a == nil || b == nil {
		t.Fatal("a session created on one server did not connect on both")
	}
	// The session's count is shared: a third connection is refused on
	// either server; so is the tenant's.
	for _, gw := range []*redisGateway{one, two} {
		if c, code := gw.dial(t, "t1", s.ID); c != nil || code != http.StatusTooManyRequests {
			t.Errorf("third connection of the session: %d", code)
		}
	}
	s2, _ := two.g.CreateSession(context.Background(), "t1")
	if c, _ := one.dial(t, "t1", s2.ID); c == nil {
		t.Fatal("third connection of the tenant refused")
	}
	if c, code := two.dial(t, "t1", s2.ID); c != nil || code != http.StatusTooManyRequests {
		t.Errorf("fourth connection of the tenant: %d", code)
	}

	// 500 messages from both servers' connections, in order on both.
	const n = 500
	go func() {
		for i := range n {
			c := a
			if i%2 == 1 {
				c = b
			}
			_ = c.Write(context.Background(), websocket.MessageText, fmt.Appendf(nil, `{"route":"pool","id":"%d"}`, i))
			if i%50 == 49 {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}()
	for name, c := range map[string]*websocket.Conn{"on one": a, "on two": b} {
		c.SetReadLimit(1 << 20)
		var last int64
		for range n {
			f := read(t, c)
			if f.Type != "echo" || f.Seq != last+1 {
				t.Fatalf("%s: after seq %d: %+v", name, last, f)
			}
			last = f.Seq
		}
	}

	// Deleting on server two closes the connection on server one.
	if err := two.g.DeleteSession(context.Background(), "t1", s.ID); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*websocket.Conn{a, b} {
		if code := closeCode(t, c, 3*time.Second); code != wsgateway.CloseSessionDeleted {
			t.Errorf("close code %d, want %d", code, wsgateway.CloseSessionDeleted)
		}
	}
	// Their slots are free again on both servers.
	eventually(t, "slots freed", func() bool {
		s3, _ := one.g.CreateSession(context.Background(), "t1")
		c, _ := two.dial(t, "t1", s3.ID)
		if c != nil {
			c.CloseNow()
		}
		return c != nil
	})
}
