package wsgateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/storetest"
	"github.com/admitdev/admit/wsgateway"
)

// countingStore counts the calls that reach a store.
type countingStore struct {
	admit.Store
	calls atomic.Int64
}

func (s *countingStore) Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	s.calls.Add(1)
	return s.Store.Decide(ctx, charges, d)
}

func (s *countingStore) Reserve(ctx context.Context, charges []admit.Charge, maxWait time.Duration) (admit.Reservation, error) {
	s.calls.Add(1)
	return s.Store.Reserve(ctx, charges, maxWait)
}

func (s *countingStore) RenewLease(ctx context.Context, id string) (admit.Lease, error) {
	s.calls.Add(1)
	return s.Store.RenewLease(ctx, id)
}

func (s *countingStore) ReleaseLease(ctx context.Context, id string) error {
	s.calls.Add(1)
	return s.Store.ReleaseLease(ctx, id)
}

// countingSessions counts the calls that reach a Sessions.
type countingSessions struct {
	wsgateway.Sessions
	calls atomic.Int64
}

func (s *countingSessions) Get(ctx context.Context, id string) (wsgateway.Session, error) {
	s.calls.Add(1)
	return s.Sessions.Get(ctx, id)
}

func (s *countingSessions) Touch(ctx context.Context, id string, ttl time.Duration) (wsgateway.Session, error) {
	s.calls.Add(1)
	return s.Sessions.Touch(ctx, id, ttl)
}

func (s *countingSessions) Publish(ctx context.Context, id string, ttl time.Duration, frame []byte) (int64, error) {
	s.calls.Add(1)
	return s.Sessions.Publish(ctx, id, ttl, frame)
}

// reader reads a connection's frames in the background (a client's Ping
// needs a reader to see its pong) until the connection ends; then it sends
// the close code on code.
type reader struct {
	frames chan frame
	code   chan websocket.StatusCode
}

func readInBackground(c *websocket.Conn) *reader {
	r := &reader{frames: make(chan frame, 1024), code: make(chan websocket.StatusCode, 1)}
	go func() {
		for {
			_, b, err := c.Read(context.Background())
			if err != nil {
				r.code <- websocket.CloseStatus(err)
				return
			}
			var f frame
			_ = json.Unmarshal(b, &f)
			r.frames <- f
		}
	}()
	return r
}

func (r *reader) next(t *testing.T) frame {
	t.Helper()
	select {
	case f := <-r.frames:
		return f
	case code := <-r.code:
		t.Fatalf("the connection closed (%d) before a frame", code)
	case <-time.After(5 * time.Second):
		t.Fatal("no frame within 5s")
	}
	return frame{}
}

func (r *reader) closed(t *testing.T) websocket.StatusCode {
	t.Helper()
	for {
		select {
		case <-r.frames:
		case code := <-r.code:
			return code
		case <-time.After(5 * time.Second):
			t.Fatal("the connection stayed open")
		}
	}
}

func ping(c *websocket.Conn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Ping(ctx)
}

// TestRefusedFramesCostTheStoreNothing: once a tenant is over
// messages_per_minute, its frames over the limit, malformed frames and
// pings reach neither the store nor the sessions: one decision learns the
// refusal, and nothing moves the session's deadline but admitted messages.
// (Each once made a session Touch: 399,331 Redis scripts for 400,000
// throttled frames.)
func TestRefusedFramesCostTheStoreNothing(t *testing.T) {
	clock := storetest.NewClock()
	mem := memstore.New(&memstore.Options{Clock: clock.Now})
	defer mem.Close()
	store := &countingStore{Store: mem}
	sessions := &countingSessions{Sessions: wsgateway.NewMemorySessions(nil)}
	gw := roomy
	gw.MessagesPerMinute = 3
	// Leases of a day: the clock jumps minutes ahead below, and a
	// heartbeat meeting the jump must not find its connection's slot
	// expired.
	h := newHarness(t, gw, roomy, &wsgateway.Options{Store: store, Sessions: sessions, Clock: clock.Now, LeaseTTL: 24 * time.Hour})
	c := h.mustDial("t1", h.session("t1"))
	r := readInBackground(c)
	for i := range 3 {
		send(t, c, fmt.Sprintf(`{"route":"silo","id":"m%d"}`, i))
		if f := r.next(t); f.Type != "echo" {
			t.Fatalf("message %d: %+v", i, f)
		}
	}
	decisions, sessionCalls := store.calls.Load(), sessions.calls.Load()
	const n = 30
	for i := range n {
		send(t, c, fmt.Sprintf(`{"route":"pool","id":"over%d"}`, i))
		if f := r.next(t); f.Type != "throttled" || f.ID != fmt.Sprintf("over%d", i) || f.RetryAfterMS == nil || *f.RetryAfterMS <= 0 {
			t.Fatalf("throttled %d: %+v", i, f)
		}
		send(t, c, `{"route":`)
		if f := r.next(t); f.Type != "error" {
			t.Fatalf("malformed %d: %+v", i, f)
		}
		if err := ping(c); err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
	}
	if got := store.calls.Load() - decisions; got != 1 {
		t.Errorf("%d frames over the limit, malformed or pings made %d store calls, want 1 (the decision that learns the refusal)", 3*n, got)
	}
	if got := sessions.calls.Load() - sessionCalls; got != 0 {
		t.Errorf("%d refused frames made %d session calls (Touch), want 0", 3*n, got)
	}
	st := h.g.Stats()
	if st.Throttled != n || st.ThrottledLocally != n-1 || st.Malformed != n || st.Control != n || st.BudgetClosed != 0 {
		t.Errorf("stats %+v, want %d throttled (%d locally), %d malformed, %d pings", st, n, n-1, n, n)
	}
	// Once the refusal ends the store decides again.
	clock.Set(3 * time.Minute)
	send(t, c, `{"route":"silo","id":"later"}`)
	if f := r.next(t); f.Type != "echo" || f.ID != "later" {
		t.Errorf("after the refusal: %+v", f)
	}
}

// TestFrameBudget: frames that carry no admitted message — malformed,
// throttled, pings — draw on a budget per connection, refilled with time;
// the one that finds it empty closes its connection with 1008, and only
// its connection.
func TestFrameBudget(t *testing.T) {
	gw := roomy
	gw.MessagesPerMinute = 1
	h := newHarness(t, gw, roomy, &wsgateway.Options{FrameBudget: 10, FrameBudgetPerSecond: 2})
	s := h.session("t1")
	c, other := h.mustDial("t1", s), h.mustDial("t1", s)
	r, ro := readInBackground(c), readInBackground(other)

	// The one message of the minute is admitted and costs no budget;
	// its echo reaches both connections.
	send(t, c, `{"route":"silo","id":"ok"}`)
	for _, r := range []*reader{r, ro} {
		if f := r.next(t); f.Type != "echo" {
			t.Fatalf("the admitted message: %+v", f)
		}
	}
	// Ten frames of the budget: throttled, malformed and pings.
	for i := range 10 {
		switch i % 3 {
		case 0:
			send(t, c, `{"route":"silo","id":"over"}`)
			if f := r.next(t); f.Type != "throttled" {
				t.Fatalf("frame %d: %+v", i, f)
			}
		case 1:
			send(t, c, `[]`)
			if f := r.next(t); f.Type != "error" {
				t.Fatalf("frame %d: %+v", i, f)
			}
		default:
			if err := ping(c); err != nil {
				t.Fatalf("ping %d: %v", i, err)
			}
		}
	}
	// Two seconds refill four frames.
	h.clock.Set(2 * time.Second)
	for i := range 4 {
		send(t, c, `not json`)
		if f := r.next(t); f.Type != "error" {
			t.Fatalf("refilled frame %d: %+v", i, f)
		}
	}
	if st := h.g.Stats(); st.BudgetClosed != 0 {
		t.Fatalf("closed within the budget: %+v", st)
	}
	send(t, c, `not json`)
	if code := r.closed(t); code != websocket.StatusPolicyViolation {
		t.Errorf("past the budget: close code %d, want 1008", code)
	}
	if st := h.g.Stats(); st.BudgetClosed != 1 {
		t.Errorf("stats %+v, want 1 connection closed past its budget", st)
	}
	// The session's other connection keeps its own budget.
	if err := ping(other); err != nil {
		t.Errorf("the other connection: %v", err)
	}

	// A ping past the budget is not answered: the connection closes.
	p := h.mustDial("t1", h.session("t1"))
	rp := readInBackground(p)
	for i := range 10 {
		if err := ping(p); err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
	}
	if err := ping(p); err == nil {
		t.Error("the 11th ping was answered")
	}
	if code := rp.closed(t); code != websocket.StatusPolicyViolation {
		t.Errorf("pings past the budget: close code %d, want 1008", code)
	}
}

// TestRefusedUpgradesCostTheStoreOnce: a session refused a connection is
// refused again without asking the store, neither for the session nor for
// the limits — by a per-minute limit until its retry time, by a full count
// for at most a second or until a connection of the tenant ends here — and
// a preflight learns and answers the same.
func TestRefusedUpgradesCostTheStoreOnce(t *testing.T) {
	clock := storetest.NewClock()
	mem := memstore.New(&memstore.Options{Clock: clock.Now})
	defer mem.Close()
	store := &countingStore{Store: mem}
	sessions := &countingSessions{Sessions: wsgateway.NewMemorySessions(nil)}
	h := newHarness(t, policy.GatewaySpec{TenantConnections: 100, ConnectionsPerSession: 1, TenantPerMinute: 100, SessionPerMinute: 3},
		roomy, &wsgateway.Options{Store: store, Sessions: sessions, Clock: clock.Now})
	s := h.session("t1")
	c := h.mustDial("t1", s)
	calls := func() int64 { return store.calls.Load() + sessions.calls.Load() }
	before := calls()
	for range 20 {
		h.mustRefuse("t1", s, http.StatusTooManyRequests, wsgateway.LimitConnectionsPerSession)
	}
	if got := calls() - before; got != 2 {
		t.Errorf("20 refused upgrades made %d store and session calls, want 2 (the session, the decision)", got)
	}
	if st := h.g.Stats(); st.Refused[1] != 20 {
		t.Errorf("refused by connections_per_session: %d, want 20", st.Refused[1])
	}
	// The connection ends: its slot is free at once.
	c.Close(websocket.StatusNormalClosure, "")
	eventually(t, "the connection's end", func() bool { return h.g.Stats().Connections == 0 })
	c = h.mustDial("t1", s)
	// A second later the store is asked again.
	h.mustRefuse("t1", s, http.StatusTooManyRequests, wsgateway.LimitConnectionsPerSession)
	before = calls()
	h.mustRefuse("t1", s, http.StatusTooManyRequests, wsgateway.LimitConnectionsPerSession)
	clock.Set(time.Second)
	h.mustRefuse("t1", s, http.StatusTooManyRequests, wsgateway.LimitConnectionsPerSession)
	if got := calls() - before; got != 2 {
		t.Errorf("a refusal a second later made %d calls, want 2", got)
	}

	// Per minute: the third connection of the minute is the session's
	// last; the refusal that follows holds until its retry time, for
	// upgrades and preflights alike.
	c.Close(websocket.StatusNormalClosure, "")
	eventually(t, "the connection's end", func() bool { return h.g.Stats().Connections == 0 })
	h.mustDial("t1", s).Close(websocket.StatusNormalClosure, "")
	eventually(t, "the connection's end", func() bool { return h.g.Stats().Connections == 0 })
	r := h.mustRefuse("t1", s, http.StatusTooManyRequests, wsgateway.LimitSessionPerMinute)
	before = calls()
	for range 10 {
		if again := h.mustRefuse("t1", s, http.StatusTooManyRequests, wsgateway.LimitSessionPerMinute); again.retryAfter != r.retryAfter {
			t.Errorf("Retry-After %s, then %s", r.retryAfter, again.retryAfter)
		}
		rec := httptest.NewRecorder()
		h.g.Preflight(rec, httptest.NewRequest("GET", "/v1/ws/preflight?tenant=t1&session="+s, nil))
		if rec.Code != http.StatusTooManyRequests {
			t.Errorf("preflight: %d %s", rec.Code, rec.Body)
		}
	}
	if got := calls() - before; got != 0 {
		t.Errorf("10 refused upgrades and preflights made %d calls, want 0", got)
	}
	clock.Set(3 * time.Minute)
	h.mustDial("t1", s)
}
