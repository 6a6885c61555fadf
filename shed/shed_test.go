package shed

import (
	"container/heap"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// clock is a manual clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) set(t time.Time) { c.mu.Lock(); c.now = t; c.mu.Unlock() }

// completion is an admitted request's end in the simulation.
type completion struct {
	at  time.Time
	tok *Token
}

type completions []completion

func (h completions) Len() int           { return len(h) }
func (h completions) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h completions) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *completions) Push(x any)        { *h = append(*h, x.(completion)) }
func (h *completions) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// service is a simulated upstream of workers workers taking base each:
// with more in flight than workers, they share them, and every request
// takes longer in proportion.
type service struct {
	workers  int
	base     time.Duration
	inFlight int
}

func (s *service) latency() time.Duration {
	return time.Duration(float64(s.base) * max(1, float64(s.inFlight)/float64(s.workers)))
}

// arrival is one simulated request: its class and tenant.
type arrival struct {
	class  Class
	tenant string
}

type result struct {
	admitted, shed [3]int
	byTenant       map[string][2]int // admitted, shed
	latencies      []time.Duration
	limit          int
}

// simulate offers rate requests a second for d, taking their class and
// tenant from pick, to a limiter over svc, on a manual clock: no sleeping,
// the same result every run.
func simulate(t *testing.T, o Options, svc *service, rate float64, d time.Duration, pick func(i int) arrival) result {
	t.Helper()
	c := &clock{now: time.Unix(1_800_000_000, 0)}
	o.Now = c.Now
	l, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	start := c.Now()
	gap := time.Duration(float64(time.Second) / rate)
	var ends completions
	res := result{byTenant: map[string][2]int{}}
	type started struct {
		at time.Time
		a  arrival
	}
	startedAt := map[*Token]started{}
	for i := 0; ; i++ {
		next := start.Add(time.Duration(i) * gap)
		if next.Sub(start) >= d {
			break
		}
		for len(ends) > 0 && !ends[0].at.After(next) {
			e := heap.Pop(&ends).(completion)
			c.set(e.at)
			svc.inFlight--
			s := startedAt[e.tok]
			delete(startedAt, e.tok)
			if e.at.Sub(start) > d/2 { // the second half: after it settled
				res.latencies = append(res.latencies, e.at.Sub(s.at))
			}
			e.tok.Done()
		}
		c.set(next)
		a := pick(i)
		tok, err := l.TryAcquire(a.class, a.tenant)
		bt := res.byTenant[a.tenant]
		if err != nil {
			if !errors.Is(err, ErrShed) {
				t.Fatalf("TryAcquire: %v", err)
			}
			res.shed[a.class]++
			bt[1]++
			res.byTenant[a.tenant] = bt
			continue
		}
		res.admitted[a.class]++
		bt[0]++
		res.byTenant[a.tenant] = bt
		svc.inFlight++
		startedAt[tok] = started{next, a}
		heap.Push(&ends, completion{next.Add(svc.latency()), tok})
	}
	res.limit = l.Stats().Limit
	slices.Sort(res.latencies)
	return res
}

func (r result) p99() time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	return r.latencies[len(r.latencies)*99/100]
}

func plain(int) arrival { return arrival{class: Default} }

// TestGradientFindsCapacity: offered three times what a service of 20
// workers can take, the gradient limit settles near its capacity, and the
// requests it lets through are served at most twice as slow as unloaded.
func TestGradientFindsCapacity(t *testing.T) {
	svc := &service{workers: 20, base: 10 * time.Millisecond} // 2000/s
	r := simulate(t, Options{CriticalReserve: 0.01}, svc, 6000, 20*time.Second, plain)
	t.Logf("limit %d, p99 %v, goodput %d/s", r.limit, r.p99(), r.admitted[Default]/20)
	if r.limit < 20 || r.limit > 40 {
		t.Errorf("limit %d, want 20 to 40 (the service has 20 workers)", r.limit)
	}
	if p99 := r.p99(); p99 > 2*svc.base {
		t.Errorf("p99 of admitted %v, more than twice the unloaded %v", p99, svc.base)
	}
	goodput := float64(r.admitted[Default]) / 20
	if goodput < 0.9*2000 {
		t.Errorf("goodput %.0f/s, want at least 90%% of the service's 2000/s", goodput)
	}
}

// TestGradientFollowsCapacity: when the service loses half its workers, the
// limit comes down.
func TestGradientFollowsCapacity(t *testing.T) {
	svc := &service{workers: 40, base: 10 * time.Millisecond}
	high := simulate(t, Options{CriticalReserve: 0.01}, svc, 12000, 10*time.Second, plain).limit
	svc = &service{workers: 10, base: 10 * time.Millisecond}
	low := simulate(t, Options{CriticalReserve: 0.01, InitialLimit: high}, svc, 3000, 10*time.Second, plain).limit
	t.Logf("limit %d with 40 workers, %d with 10", high, low)
	if low >= high/2 || low < 10 {
		t.Errorf("limit %d with 40 workers, %d after dropping to 10: want it to follow", high, low)
	}
}

// TestAIMD: the simple alternative settles near capacity too, backing off
// when latency passes its timeout.
func TestAIMD(t *testing.T) {
	svc := &service{workers: 20, base: 10 * time.Millisecond}
	r := simulate(t, Options{Algorithm: AIMD, Timeout: 15 * time.Millisecond, CriticalReserve: 0.01}, svc, 6000, 20*time.Second, plain)
	t.Logf("limit %d, p99 %v", r.limit, r.p99())
	if r.limit < 15 || r.limit > 35 {
		t.Errorf("limit %d, want near the 20 workers", r.limit)
	}
}

// TestClassesUnderOverload: at three times capacity, critical requests are
// admitted, sheddable ones go first.
func TestClassesUnderOverload(t *testing.T) {
	svc := &service{workers: 20, base: 10 * time.Millisecond}
	mix := func(i int) arrival {
		switch i % 10 {
		case 0:
			return arrival{class: Critical}
		case 1, 2, 3:
			return arrival{class: Sheddable}
		}
		return arrival{class: Default}
	}
	r := simulate(t, Options{}, svc, 6000, 20*time.Second, mix)
	rate := func(c Class) float64 { return float64(r.admitted[c]) / float64(r.admitted[c]+r.shed[c]) }
	if rate(Critical) < 0.99 {
		t.Errorf("critical admitted %.3f, want ≥ 0.99", rate(Critical))
	}
	if !(rate(Sheddable) < rate(Default) && rate(Default) < rate(Critical)) {
		t.Errorf("admitted: critical %.3f, default %.3f, sheddable %.3f: want sheddable shed first", rate(Critical), rate(Default), rate(Sheddable))
	}
}

// TestTenantShare: one tenant's flood cannot take the whole limit; another
// tenant's trickle still goes through.
func TestTenantShare(t *testing.T) {
	svc := &service{workers: 20, base: 10 * time.Millisecond}
	mix := func(i int) arrival {
		if i%20 == 0 {
			return arrival{class: Default, tenant: "small"}
		}
		return arrival{class: Default, tenant: "flood"}
	}
	r := simulate(t, Options{}, svc, 6000, 20*time.Second, mix)
	rate := func(r result) float64 { s := r.byTenant["small"]; return float64(s[0]) / float64(s[0]+s[1]) }
	if rate(r) < 0.95 {
		t.Errorf("the small tenant's requests admitted %.3f, want ≥ 0.95 beside a flood", rate(r))
	}
	// Without the share, the flood takes the slots the small tenant needs.
	off := simulate(t, Options{TenantShare: 1}, &service{workers: 20, base: 10 * time.Millisecond}, 6000, 20*time.Second, mix)
	if rate(off) >= rate(r) {
		t.Errorf("small tenant admitted %.3f without a share, %.3f with: the share should matter", rate(off), rate(r))
	}
}

// TestIdleLimitHolds: a light load says nothing of the service's
// capacity, and the limit does not grow on it (a burst would then go
// through whole).
func TestIdleLimitHolds(t *testing.T) {
	svc := &service{workers: 20, base: 10 * time.Millisecond}
	r := simulate(t, Options{}, svc, 200, 20*time.Second, plain) // a tenth of capacity
	if r.limit > 20 {
		t.Errorf("limit %d after 20 s at a tenth of capacity, want at most the initial 20", r.limit)
	}
}

// TestQueueNewestFirst: waiters are served newest first, and one that
// waited MaxWait is shed rather than served.
func TestQueueNewestFirst(t *testing.T) {
	c := &clock{now: time.Unix(1_800_000_000, 0)}
	l, err := New(Options{Algorithm: AIMD, InitialLimit: 1, MaxLimit: 1, MaxQueue: 10, MaxWait: time.Minute, CriticalReserve: 0.01, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	hold, err := l.TryAcquire(Default, "")
	if err != nil {
		t.Fatal(err)
	}
	// Critical waiters, which wait the whole MaxWait.
	type got struct {
		who int
		tok *Token
		err error
	}
	out := make(chan got, 3)
	for i := range 3 {
		go func() {
			tok, err := l.Acquire(context.Background(), Critical, "")
			out <- got{i, tok, err}
		}()
		for l.Stats().Queued != i+1 { // queued in this order
			time.Sleep(time.Millisecond)
		}
		if i == 0 {
			c.set(c.Now().Add(40 * time.Second)) // 0 waits 40 s longer than 1 and 2
		}
	}
	hold.Done()
	first := <-out
	if first.who != 2 || first.err != nil {
		t.Fatalf("first out: %d (%v), want the newest waiter, 2", first.who, first.err)
	}
	// 30 s on, 0 has waited 70 s, past MaxWait: when the slot frees, it is
	// shed and 1 is served.
	c.set(c.Now().Add(30 * time.Second))
	first.tok.Done()
	a, b := <-out, <-out
	if a.who > b.who {
		a, b = b, a
	}
	if _, shed := IsShed(a.err); a.who != 0 || !shed || b.who != 1 || b.err != nil {
		t.Fatalf("then %d (%v) and %d (%v): want 0 shed, 1 served", a.who, a.err, b.who, b.err)
	}
	b.tok.Done()
	if st := l.Stats(); st.Shed[Critical] != 1 || st.Admitted[Critical] != 2 || st.Admitted[Default] != 1 || st.InFlight != 0 || st.Queued != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []Options{
		{Algorithm: "vegas"}, {MinLimit: 5, MaxLimit: 2}, {Tolerance: 0.5}, {Backoff: 1.5},
		{CriticalReserve: 1}, {SheddableShare: 2}, {TenantShare: -1}, {MaxWait: -1},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%+v: accepted", o)
		}
	}
	if _, err := ParseClass("urgent"); err == nil {
		t.Error("ParseClass accepted urgent")
	}
}

// TestHold: a held token (an upgraded connection) keeps its slot, and its
// tenant's share, until it ends, and reports only its handshake's latency:
// an hour-long connection does not look like an hour-long request. Held
// slots do not take a probe's few slots, or a probe could wait on them
// for as long as they last.
func TestHold(t *testing.T) {
	c := &clock{now: time.Unix(1_800_000_000, 0)}
	l, err := New(Options{Algorithm: AIMD, InitialLimit: 2, MinLimit: 1, MaxLimit: 2, TenantShare: 1, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	a, err := l.TryAcquire(Critical, "acme")
	if err != nil {
		t.Fatal(err)
	}
	c.set(c.Now().Add(10 * time.Millisecond))
	a.Hold()
	a.Hold() // again: nothing more
	if s := l.Stats(); s.InFlight != 1 || s.Held != 1 || s.Limit != 2 {
		t.Fatalf("after Hold: %+v", s)
	}
	b, err := l.TryAcquire(Critical, "")
	if err != nil {
		t.Fatalf("the second slot: %v", err)
	}
	if _, err := l.TryAcquire(Critical, ""); !errors.Is(err, ErrShed) {
		t.Fatalf("a third request beside a held connection and a request: %v", err)
	}
	c.set(c.Now().Add(time.Hour))
	a.Done()
	if s := l.Stats(); s.InFlight != 1 || s.Held != 0 || s.Limit != 2 {
		t.Fatalf("after the held connection ended an hour later: %+v, want the limit kept", s)
	}
	b.Done() // an hour: past Timeout, the limit backs off (to 1.8)
	if s := l.Stats(); s.InFlight != 0 || s.Limit != 1 {
		t.Fatalf("after a request of an hour: %+v, want the limit backed off", s)
	}
	a.Hold() // after Done: nothing
	if s := l.Stats(); s.InFlight != 0 || s.Held != 0 {
		t.Fatalf("Hold after Done: %+v", s)
	}

	// A tenant's held connections count against its share.
	m, _ := New(Options{Algorithm: AIMD, InitialLimit: 4, MaxLimit: 4, TenantShare: 0.5, Now: c.Now})
	for range 2 {
		tok, err := m.TryAcquire(Critical, "acme")
		if err != nil {
			t.Fatal(err)
		}
		tok.Hold()
	}
	if _, err := m.TryAcquire(Critical, "acme"); !errors.Is(err, ErrShed) {
		t.Fatalf("acme past its share in held connections: %v", err)
	}
	if _, err := m.TryAcquire(Critical, "other"); err != nil {
		t.Fatalf("another tenant: %v", err)
	}

	// The gradient's first probe lets 1 request at a time through; a held
	// connection does not take it.
	g, _ := New(Options{ProbeLimit: 1, ProbeSamples: 3, Now: c.Now})
	ws, err := g.TryAcquire(Critical, "")
	if err != nil {
		t.Fatal(err)
	}
	ws.Hold()
	for i := range 2 {
		tok, err := g.TryAcquire(Default, "")
		if err != nil {
			t.Fatalf("request %d of the probe beside a held connection: %v", i, err)
		}
		tok.Done()
	}
	if s := g.Stats(); s.Limit != 20 || s.InFlight != 1 {
		t.Fatalf("after the probe's 3 samples (the handshake's and 2 requests'): %+v, want the initial limit back", s)
	}
}
