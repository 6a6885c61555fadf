package wsgateway_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
	"github.com/admitdev/admit/storetest"
	"github.com/admitdev/admit/wsgateway"
)

// sharedStores are the stores the global rules on WebSocket traffic are
// tested on, each on the clock given: memory, and Redis (a redis-server
// the test starts).
var sharedStores = []struct {
	name string
	open func(t *testing.T, clock *storetest.Clock) admit.Store
}{
	{"memory", func(t *testing.T, clock *storetest.Clock) admit.Store {
		st := memstore.New(&memstore.Options{Clock: clock.Now})
		t.Cleanup(func() { st.Close() })
		return st
	}},
	{"redis", func(t *testing.T, clock *storetest.Clock) admit.Store {
		srv := redistest.Start(t)
		st, err := redisstore.Open(context.Background(), "redis://"+srv.Addr, &redisstore.Options{Timeout: 5 * time.Second, Clock: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}},
}

// sharedHarness is a harness on store whose policy has the global rules
// given, tiers a and b of roomy gateway limits, tenants t1, t2 (a) and t3
// (b), and unknown tenants in tier a. Frames without an admitted message
// have all the budget they want: flooding is what is measured. The
// connections' leases outlive any test's clock, which moves faster than
// the heartbeats that renew them.
// A connection comes from the address its X-Client header names, if any.
func sharedHarness(t testing.TB, store admit.Store, clock *storetest.Clock, global ...policy.RuleSpec) (*harness, *countingStore) {
	t.Helper()
	counting := &countingStore{Store: store}
	h := newHarness(t, roomy, roomy, &wsgateway.Options{
		Store: counting, Clock: clock.Now, FrameBudget: 1e6, FrameBudgetPerSecond: 1e6, LeaseTTL: 24 * time.Hour,
		ClientAddr: func(r *http.Request) string {
			if a := r.Header.Get("X-Client"); a != "" {
				return a
			}
			return strings.Split(r.RemoteAddr, ":")[0]
		},
	})
	h.clock = clock
	p, err := policy.Compile(&policy.Spec{
		UnknownTenant: "a",
		Global:        global,
		Tiers:         map[string]policy.TierSpec{"a": {Gateway: &roomy}, "b": {Gateway: &roomy}},
		Tenants:       map[string]policy.TenantSpec{"t1": {Tier: "a"}, "t2": {Tier: "a"}, "t3": {Tier: "b"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	h.pol.Store(p)
	return h, counting
}

func ptr(v int64) *int64 { return &v }

// sender is one connection that sends messages and counts what they
// became.
type sender struct {
	c                  *websocket.Conn
	r                  *reader
	admitted, refused  int
	deniedBy           map[string]int
	admittedInWindow   []int
	sentTotal, perStep int
}

func newSender(h *harness, tenant string, perStep int) *sender {
	return newSenderFrom(h, tenant, "", perStep)
}

// newSenderFrom is newSender from the client address addr ("": the
// connection's own).
func newSenderFrom(h *harness, tenant, addr string, perStep int) *sender {
	h.t.Helper()
	hdr := http.Header{}
	if addr != "" {
		hdr.Set("X-Client", addr)
	}
	c, r := h.dial(tenant, h.session(tenant), hdr)
	if r != nil {
		h.t.Fatalf("connect %s: %+v", tenant, *r)
	}
	return &sender{c: c, r: readInBackground(c), deniedBy: map[string]int{}, perStep: perStep}
}

// step sends the sender's messages of one step and waits for every answer:
// each is decided before the step ends.
func (s *sender) step(t *testing.T, window int) {
	t.Helper()
	for i := range s.perStep {
		send(t, s.c, fmt.Sprintf(`{"route":"pool","id":"%d"}`, i))
	}
	for len(s.admittedInWindow) <= window {
		s.admittedInWindow = append(s.admittedInWindow, 0)
	}
	for range s.perStep {
		switch f := s.r.next(t); f.Type {
		case "echo":
			s.admitted++
			s.admittedInWindow[window]++
		case "throttled":
			s.refused++
			s.deniedBy[f.DeniedBy]++
		default:
			t.Fatalf("answer %+v", f)
		}
	}
	s.sentTotal += s.perStep
}

// TestGlobalMessageRuleIsShared: a global fixed window naming ws:message
// is charged by every tenant's messages, never past its limit, and divided
// fairly: a tenant flooding at ten times its share cannot keep another,
// asking half its share, from what it asks, while it still gets its own
// share (and more, what the other leaves). The flooder's refusals are its
// own: they cost the store one decision each time the clock moves, and do
// not refuse the other tenant's messages. Without shares (fair_share:
// false) the flood takes the window first.
func TestGlobalMessageRuleIsShared(t *testing.T) {
	const (
		limit   = 600 // a minute
		step    = 2 * time.Second
		steps   = 60 // two windows
		flood   = 100
		modest  = 5 // 2.5/s: half of a share of 5/s
		minutes = 2
	)
	rule := func(fair bool) policy.RuleSpec {
		return policy.RuleSpec{Name: "global-ws", Scope: "global", Actions: []string{wsgateway.ActionMessage},
			Algorithm: "fixed_window", Limit: ptr(limit), Window: "1m", FairShare: &fair}
	}
	for _, st := range sharedStores {
		t.Run(st.name, func(t *testing.T) {
			clock := storetest.NewClock()
			h, counting := sharedHarness(t, st.open(t, clock), clock, rule(true))
			flooder, victim := newSender(h, "t1", flood), newSender(h, "t2", modest)
			decisions := counting.calls.Load()
			for i := range steps {
				clock.Set(time.Duration(i) * step)
				window := int(time.Duration(i) * step / time.Minute)
				flooder.step(t, window)
				victim.step(t, window)
			}
			decisions = counting.calls.Load() - decisions
			t.Logf("flooder %d of %d, victim %d of %d, %d decisions", flooder.admitted, flooder.sentTotal, victim.admitted, victim.sentTotal, decisions)
			for w := range minutes {
				if got := flooder.admittedInWindow[w] + victim.admittedInWindow[w]; got > limit {
					t.Errorf("window %d: %d messages admitted, over the global limit of %d", w, got, limit)
				}
			}
			if victim.admitted*100 < victim.sentTotal*95 {
				t.Errorf("the tenant asking half its share got %d of %d messages (%v refused): the flood took its share", victim.admitted, victim.sentTotal, victim.deniedBy)
			}
			if share := minutes * limit / 2; flooder.admitted*100 < share*95 {
				t.Errorf("the flooder got %d messages, under its share of %d", flooder.admitted, share)
			}
			if flooder.refused == 0 || flooder.deniedBy["global-ws"] != flooder.refused {
				t.Errorf("the flooder's refusals: %v, want all by global-ws", flooder.deniedBy)
			}
			// One decision per admitted message, and one per step that
			// learns a refusal (the clock stands still within a step).
			if max := flooder.admitted + victim.admitted + 2*steps; decisions > int64(max) {
				t.Errorf("%d store decisions for %d admitted messages in %d steps, want at most %d: refusals are not remembered", decisions, flooder.admitted+victim.admitted, steps, max)
			}
			if st := h.g.Stats(); st.Throttled != int64(flooder.refused+victim.refused) || st.ThrottledLocally == 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}

	// Without shares the flood empties each window before the modest
	// tenant asks: what the shares prevent.
	clock := storetest.NewClock()
	h, _ := sharedHarness(t, sharedStores[0].open(t, clock), clock, rule(false))
	flooder, victim := newSender(h, "t1", flood), newSender(h, "t2", modest)
	for i := range steps {
		clock.Set(time.Duration(i) * step)
		window := int(time.Duration(i) * step / time.Minute)
		flooder.step(t, window)
		victim.step(t, window)
	}
	if victim.admitted*2 > victim.sentTotal {
		t.Errorf("first come, first served: the modest tenant got %d of %d; the test cannot tell shares from none", victim.admitted, victim.sentTotal)
	}
}

// TestAnonymousTenantsShareOnePart: tenants only the default tier knows
// are named by anyone (their sessions need no key), so on a global rule
// they are the anonymous callers, one class: nine of them flooding get
// one part between them, and a tenant of the catalog asking half its
// share gets what it asks. Were each a class of its own, the nine would
// take nine parts of ten.
func TestAnonymousTenantsShareOnePart(t *testing.T) {
	const (
		limit  = 600
		step   = 2 * time.Second
		steps  = 30
		modest = 5
	)
	clock := storetest.NewClock()
	h, _ := sharedHarness(t, sharedStores[0].open(t, clock), clock, policy.RuleSpec{
		Name: "global-ws", Scope: "global", Actions: []string{wsgateway.ActionMessage},
		Algorithm: "fixed_window", Limit: ptr(limit), Window: "1m",
	})
	var sybils []*sender
	for i := range 9 {
		sybils = append(sybils, newSender(h, fmt.Sprintf("anyone-%d", i), 20))
	}
	victim := newSender(h, "t2", modest)
	anonymous := 0
	for i := range steps {
		clock.Set(time.Duration(i) * step)
		for _, s := range sybils {
			s.step(t, 0)
		}
		victim.step(t, 0)
	}
	for _, s := range sybils {
		anonymous += s.admitted
	}
	t.Logf("anonymous %d, victim %d of %d", anonymous, victim.admitted, victim.sentTotal)
	if anonymous+victim.admitted > limit {
		t.Errorf("%d admitted in the window, over %d", anonymous+victim.admitted, limit)
	}
	if victim.admitted*100 < victim.sentTotal*95 {
		t.Errorf("the catalog's tenant got %d of %d messages (%v refused): the default tier's names took its share", victim.admitted, victim.sentTotal, victim.deniedBy)
	}
}

// TestAnonymousRefusalsAreTheAddress: the anonymous callers' part is
// shared by client address, so a refusal of one address's share is that
// address's: another address of the same tenant of the default tier keeps
// its part, and is not refused by what the gateway remembers of the
// first.
func TestAnonymousRefusalsAreTheAddress(t *testing.T) {
	clock := storetest.NewClock()
	h, _ := sharedHarness(t, sharedStores[0].open(t, clock), clock, policy.RuleSpec{
		Name: "global-ws", Scope: "global", Actions: []string{wsgateway.ActionMessage},
		Algorithm: "fixed_window", Limit: ptr(600), Window: "1m",
	})
	flooder := newSenderFrom(h, "anyone", "192.0.2.1", 100)
	modest := newSenderFrom(h, "anyone", "192.0.2.2", 2)
	// The first second the flood comes before the other address has
	// asked, when the class's part is the flooder's alone: from then on
	// the other address is among the class's members.
	flooder.step(t, 0)
	modest.step(t, 0)
	asked, got := 0, 0
	for i := 1; i < 30; i++ {
		clock.Set(time.Duration(i) * time.Second)
		flooder.step(t, 0)
		before := modest.admitted
		modest.step(t, 0)
		asked, got = asked+modest.perStep, got+modest.admitted-before
	}
	t.Logf("flooding address %d of %d, modest address %d of %d", flooder.admitted, flooder.sentTotal, modest.admitted, modest.sentTotal)
	if flooder.refused == 0 {
		t.Fatal("the flooding address was never refused")
	}
	if got != asked {
		t.Errorf("the modest address got %d of %d (%v refused): refused for the other address's share", got, asked, modest.deniedBy)
	}
}

// TestGlobalConnectionRulesAreShared: global rules naming ws:connect are
// decided with the connection limits and divided fairly. A concurrency
// rule's slots are held for the connection's life: a tenant alone takes
// at most its share ceiling (half), and one that comes later finds its
// share at once; a bucket of new connections keeps a tenant asking half
// its share admitted while another floods. The flooder's refusals, which
// the gateway remembers, are its own.
func TestGlobalConnectionRulesAreShared(t *testing.T) {
	for _, st := range sharedStores {
		t.Run(st.name+"/concurrency", func(t *testing.T) {
			clock := storetest.NewClock()
			h, _ := sharedHarness(t, st.open(t, clock), clock, policy.RuleSpec{
				Name: "global-ws-conns", Scope: "global", Actions: []string{wsgateway.ActionConnect},
				Algorithm: "concurrency", Max: ptr(10),
			})
			s1 := h.session("t1")
			var held []*websocket.Conn
			for i := range 10 {
				c, r := h.dial("t1", s1, nil)
				if i < 5 {
					if r != nil {
						t.Fatalf("connection %d of the tenant alone: %+v", i, *r)
					}
					held = append(held, c)
					continue
				}
				if r == nil {
					t.Fatalf("connection %d admitted: a tenant alone took more than its share ceiling of the global slots", i)
				}
				if r.status != http.StatusTooManyRequests || r.deniedBy != "global-ws-conns" || r.retryAfter == "" {
					t.Fatalf("connection %d: %+v", i, *r)
				}
			}
			// The other tenant finds its share, and no more.
			s2 := h.session("t2")
			for i := range 5 {
				h.mustDial("t2", s2)
				_ = i
			}
			r := h.mustRefuse("t2", s2, http.StatusTooManyRequests, "global-ws-conns")
			if !strings.Contains(r.detail, "share") {
				t.Errorf("refusal detail %q", r.detail)
			}
			if st := h.g.Stats(); st.RefusedGlobal != 6 {
				t.Errorf("stats %+v, want 6 refused by global rules", st)
			}
			// A connection's end frees its global slot.
			held[0].Close(websocket.StatusNormalClosure, "")
			eventually(t, "the slot freed", func() bool {
				c, r := h.dial("t1", s1, nil)
				if c != nil {
					c.CloseNow()
				}
				return r == nil
			})
		})
		t.Run(st.name+"/bucket", func(t *testing.T) {
			clock := storetest.NewClock()
			h, _ := sharedHarness(t, st.open(t, clock), clock, policy.RuleSpec{
				Name: "global-ws-connects", Scope: "global", Actions: []string{wsgateway.ActionConnect},
				Algorithm: "token_bucket", Rate: "1/s", Burst: ptr(4),
			})
			s1, s2 := h.session("t1"), h.session("t2")
			flooded, victim, asked := 0, 0, 0
			const steps = 60
			for i := range steps {
				clock.Set(time.Duration(i) * time.Second)
				for range 10 { // 20 times its share of 0.5/s
					if c, r := h.dial("t1", s1, nil); r == nil {
						flooded++
						c.CloseNow()
					} else if r.deniedBy != "global-ws-connects" {
						t.Fatalf("the flooder refused by %+v", *r)
					}
				}
				if i%4 == 0 { // half its share
					asked++
					if c, r := h.dial("t2", s2, nil); r == nil {
						victim++
						c.CloseNow()
					} else {
						t.Errorf("step %d: the modest tenant refused: %+v", i, *r)
					}
				}
			}
			t.Logf("flooder %d, victim %d of %d", flooded, victim, asked)
			if flooded+victim > 4+steps {
				t.Errorf("%d connections admitted in %d s: over the bucket's 1/s and burst 4", flooded+victim, steps)
			}
			if flooded < steps/2 {
				t.Errorf("the flooder got %d connections, under its share", flooded)
			}
		})
	}
}

// TestRulesOfEveryActionSpareWebSockets: a global rule that names no
// action (every action) is not charged by WebSocket traffic, so a
// configuration written for HTTP requests keeps its buckets for them; nor
// is a rule naming ws:message charged by connections.
func TestRulesOfEveryActionSpareWebSockets(t *testing.T) {
	fcfs := false // a tenant alone would take half a window this small
	clock := storetest.NewClock()
	h, _ := sharedHarness(t, sharedStores[0].open(t, clock), clock,
		policy.RuleSpec{Name: "global-requests", Scope: "global", Algorithm: "fixed_window", Limit: ptr(1), Window: "1m"},
		policy.RuleSpec{Name: "global-star", Scope: "global", Actions: []string{"*", wsgateway.ActionMessage}, Algorithm: "fixed_window", Limit: ptr(1), Window: "1m"},
		policy.RuleSpec{Name: "global-ws", Scope: "global", Actions: []string{wsgateway.ActionMessage}, Algorithm: "fixed_window", Limit: ptr(3), Window: "1m", FairShare: &fcfs},
	)
	s := h.session("t1")
	for range 5 {
		h.mustDial("t1", s).CloseNow()
	}
	c := newSender(h, "t1", 5)
	c.step(t, 0)
	if c.admitted != 3 || c.deniedBy["global-ws"] != 2 {
		t.Errorf("%d admitted, refused by %v; want 3, then global-ws", c.admitted, c.deniedBy)
	}
}

// TestDuplicateKeysInFrames: a frame holding a key twice is refused with
// an error frame and counted malformed, as the HTTP API refuses such a
// body: the decoder keeps the last value, while whoever reads the frame
// or its echo may keep the first. Route and id are matched in any case,
// as the decoder matches them; the keys of data exactly.
func TestDuplicateKeysInFrames(t *testing.T) {
	h := newHarness(t, roomy, roomy, nil)
	c := h.mustDial("t1", h.session("t1"))
	r := readInBackground(c)
	for _, tc := range []struct{ frame, key string }{
		{`{"route":"silo","route":"pool","id":"a"}`, "route"},
		{`{"route":"pool","Route":"silo"}`, "Route"},
		{`{"route":"pool","id":"a","ID":"b"}`, "ID"},
		{`{"route":"pool","data":{"amount":1,"amount":1000}}`, "amount"},
		{`{"route":"pool","data":[{"to":"a","to":"b"}]}`, "to"},
		{`{"route":"pool","id":"ok","data":{"a":1,"A":2}}`, ""},
	} {
		send(t, c, tc.frame)
		f := r.next(t)
		if tc.key == "" {
			if f.Type != "echo" || f.ID != "ok" {
				t.Errorf("%s: %+v, want its echo", tc.frame, f)
			}
			continue
		}
		if f.Type != "error" || !strings.Contains(f.Error, fmt.Sprintf("%q twice", tc.key)) {
			t.Errorf("%s: %+v, want an error naming %q", tc.frame, f, tc.key)
		}
	}
	if st := h.g.Stats(); st.Malformed != 5 || st.Messages != 1 {
		t.Errorf("stats %+v, want 5 malformed and 1 message", st)
	}
}
