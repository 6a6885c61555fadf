package leased

import (
	"cmp"
	"context"
	_ "embed"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/redisstore/internal/exact"
)

// Refills: a region's agent takes units from the home for its pool, gives
// back what the pool holds beyond its target, and sweeps the pools.

// refillElsewhere is what refill returns when another refill of the pool
// is in flight.
const refillElsewhere = -2

// awaitRefill waits for the refill of p's pool in flight: this server's,
// until it lands; another server's, about a round trip to the home.
func (s *Room) awaitRefill(p *allowance) {
	rg := s.region
	rg.mu.Lock()
	done := rg.inflight[s.poolKey(p)]
	rg.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-time.After(agentLock):
		}
		return
	}
	rtt := time.Duration(rg.rtt.Load())
	if rtt == 0 {
		rtt = 100 * time.Millisecond // none measured yet
	}
	time.Sleep(min(rtt*5/4+2*time.Millisecond, agentLock))
}

// goRefill refills p's pool in the background, unless the store is
// closing.
func (s *Room) goRefill(p *allowance) {
	a := &s.allowances
	a.fetchMu.Lock()
	defer a.fetchMu.Unlock()
	if a.closing {
		return
	}
	a.fetches.Add(1)
	go func() {
		defer a.fetches.Done()
		s.refill(p, 0)
	}()
}

// unlockScript deletes a lock if it is still the caller's.
var unlockScript = rueidis.NewLuaScript(unlockSource)

//go:embed lua/region_unlock.lua
var unlockSource string

// refill is a region's agent for p's key: it gives back home what the
// pool no longer needs and asks for what it lacks, if no other server of
// the region is doing so.
//
// It returns what the home granted, refillElsewhere when another server
// of the region is refilling the pool, or -1 when it did not ask: too
// many refills are in flight, the pool holds enough, or a call failed.
func (s *Room) refill(p *allowance, need int64) (granted int64) {
	granted = -1
	rg := s.region
	// Refills in flight are bounded per store, apart for keys the store
	// never had units of, and per tenant: so that a flood of new keys,
	// or one tenant's many keys, cannot take the refills of the keys
	// others are spending.
	p.mu.Lock()
	slots := rg.refills
	if p.hgen == 0 {
		slots = rg.coldRefills
	}
	p.mu.Unlock()
	select {
	case slots <- struct{}{}:
		defer func() { <-slots }()
	default:
		return
	}
	pk := s.poolKey(p)
	now := s.link.Now()
	rg.mu.Lock()
	if rg.agents == nil {
		rg.agents = make(map[string]time.Time)
		rg.tenants = make(map[string]int)
		rg.inflight = make(map[string]chan struct{})
	}
	if last, ok := rg.agents[pk]; ok && rg.cutSince.Load() != 0 && now.Sub(last) < cutRetry {
		// The home does not answer: ask it again for this key once in
		// a while, not at every take.
		rg.mu.Unlock()
		return granted
	}
	if rg.tenants[p.tag] >= maxTenantRefills && p.tag != "g" {
		rg.mu.Unlock()
		return granted
	}
	if rg.inflight[pk] != nil {
		rg.mu.Unlock()
		return refillElsewhere
	}
	done := make(chan struct{})
	rg.inflight[pk] = done
	rg.tenants[p.tag]++
	rg.agents[pk] = now
	rg.mu.Unlock()
	defer func() {
		rg.mu.Lock()
		if rg.tenants[p.tag]--; rg.tenants[p.tag] <= 0 {
			delete(rg.tenants, p.tag)
		}
		delete(rg.inflight, pk)
		rg.mu.Unlock()
		close(done)
	}()

	token := exact.NewID()
	var locked bool
	if err := s.link.Do(context.Background(), func(ctx context.Context, client rueidis.Client) error {
		err := client.Do(ctx, client.B().Set().Key(s.agentKey(p)).Value(token).Nx().Px(agentLock).Build()).Error()
		if rueidis.IsRedisNil(err) {
			return nil
		}
		locked = err == nil
		return err
	}); err != nil {
		return
	}
	if !locked {
		return refillElsewhere
	}
	defer s.link.Do(context.Background(), func(ctx context.Context, client rueidis.Client) error {
		return unlockScript.Exec(ctx, client, []string{s.agentKey(p)}, []string{token}).Error()
	})

	// The preparation reads the pool's clock too: it ran between
	// prepSent and prepRecv by this one's, which bounds the difference
	// of the two clocks, for the times the grant is added with.
	var prep []int64
	var demand string
	var poolNow int64
	prepSent := s.link.Now()
	if err := s.link.Do(context.Background(), func(ctx context.Context, client rueidis.Client) error {
		v, err := poolScript.Exec(ctx, client, []string{pk}, []string{"a", itoa(rg.period().Microseconds()), itoa(leastHeld(p.rule))}).ToArray()
		if err != nil {
			return err
		}
		if len(v) < 4 || (len(v)-4)%3 != 0 {
			return admit.Errorf(admit.CodeInternal, "redisstore: a pool replied %d values", len(v))
		}
		demand, _ = v[2].ToString()
		now, _ := v[3].ToString()
		if poolNow, err = strconv.ParseInt(now, 10, 64); err != nil {
			return err
		}
		prep = make([]int64, 0, len(v)-2)
		for i, x := range v {
			if i == 2 || i == 3 {
				continue
			}
			n, err := x.AsInt64()
			if err != nil {
				return err
			}
			prep = append(prep, n)
		}
		return nil
	}); err != nil {
		return
	}
	prepRecv := s.link.Now()
	deltaMin, deltaMax := poolNow-prepRecv.UnixMicro(), poolNow-prepSent.UnixMicro()
	held, target, back := prep[0], prep[1], prep[2:]
	rg.held.Store(held)
	want := max(target-held, need, 0)
	if len(back) == 0 && held >= (target+1)/2 && need <= 0 {
		return
	}
	args := append([]string{rg.name}, s.homeArgs(p.rule, want, demand)...)
	var units, owed int64
	for i := 0; i+2 < len(back); i += 3 {
		args = append(args, itoa(back[i]), itoa(back[i+1]), itoa(back[i+2]))
		if back[i+1] > 0 {
			units += back[i+1]
		} else {
			owed -= back[i+1]
		}
	}
	sent := s.link.Now()
	var g, first, last, gen, share, spentFor int64
	var T, pos, fair string
	err := rg.home.Do(context.Background(), func(ctx context.Context, client rueidis.Client) error {
		v, err := homeScript.Exec(ctx, client, []string{homeKey(rg.home, p)}, args).ToArray()
		if err != nil {
			return err
		}
		if len(v) != 9 {
			return admit.Errorf(admit.CodeInternal, "redisstore: the home replied %d values, want 9", len(v))
		}
		var x [5]int64
		if err := replyInts(v, x[:]); err != nil {
			return err
		}
		g, first, last, gen, share = x[0], x[1], x[2], x[3], x[4]
		if spentFor, err = v[7].AsInt64(); err != nil {
			return err
		}
		T, _ = v[5].ToString()
		pos, _ = v[6].ToString()
		fair, _ = v[8].ToString()
		return nil
	})
	recv := s.link.Now()
	rg.homeCalls.Add(1)
	if err != nil {
		rg.homeFailures.Add(1) // what was to go home stays in the pool, sent again next time
		rg.cutSince.CompareAndSwap(0, recv.UnixNano())
		rg.setErr(err)
		return
	}
	rg.cutSince.Store(0)
	rg.setErr(nil)
	rg.givenBack.Add(units)
	rg.owed.Add(owed)
	if len(back) > 0 {
		// The home has them: the pool may forget them. Should this
		// fail, the next refill sends them again, and the home, which
		// applies each number once, ignores them.
		acked := back[len(back)-1]
		for i := 2; i < len(back); i += 3 {
			acked = max(acked, back[i])
		}
		if err := s.link.Do(context.Background(), func(ctx context.Context, client rueidis.Client) error {
			return poolScript.Exec(ctx, client, []string{pk}, []string{"k", itoa(acked)}).Error()
		}); err == nil {
			p.mu.Lock()
			p.owing = false
			p.mu.Unlock()
		}
	}
	rg.share.Store(share)
	rtt := int64(recv.Sub(sent))
	if old := rg.rtt.Load(); old == 0 {
		rg.rtt.Store(rtt)
	} else {
		rg.rtt.Store(old + (rtt-old)/8)
	}
	granted = g
	// In the pool's clock: an unlock late (from the reply's arrival, and
	// the most the clocks may differ), an expiry early (from the call's
	// sending, and the least), however late the deposit itself runs.
	spent := "0"
	if spentFor > 0 {
		spent = itoa(sent.UnixMicro() + spentFor + deltaMin)
	}
	ops := []string{"z", spent, fair, poolShape(p.rule)}
	if g > 0 {
		rg.granted.Add(g)
		hold := holdOf(p.rule)
		if T == "0" {
			hold = 0 // a count's units are worth nothing once its period ends
		}
		unlock := recv.UnixMicro() + first + deltaMax
		expiry := sent.Add(time.Duration(max(last, 0))*time.Microsecond+hold).UnixMicro() + deltaMin
		ops = []string{"d", itoa(gen), itoa(unlock), itoa(g), T, itoa(expiry), pos, spent, fair, poolShape(p.rule)}
	}
	if err := s.link.Do(context.Background(), func(ctx context.Context, client rueidis.Client) error {
		return poolScript.Exec(ctx, client, []string{pk}, ops).Error()
	}); err != nil {
		s.Lost.Add(g)
	}
	return granted
}

// homeArgs returns the home's arguments (homeScript) for rule r after the
// region's name: what it is, and what the region wants of it.
func (s *Room) homeArgs(r *admit.Rule, want int64, demand string) []string {
	w := strconv.FormatInt(want, 10)
	switch r.Algorithm {
	case admit.FixedWindow:
		return []string{"c", w, demand, itoa(r.Limit), itoa(r.Window.Microseconds()), "0", "0", "0"}
	case admit.Quota:
		now := s.link.Now()
		start, end := engine.PeriodAt(r, now)
		_, next := engine.PeriodAt(r, end)
		return []string{"c", w, demand, itoa(r.Limit), "0", itoa(start.UnixMicro()), itoa(end.UnixMicro()), itoa(next.UnixMicro())}
	}
	initial := r.Burst
	if r.Initial != nil {
		initial = *r.Initial
	}
	debt := r.MaxDebt
	if debt == 0 {
		debt = r.Burst
	}
	return []string{"b", w, demand, itoa(r.Rate.N), itoa(r.Rate.Per.Microseconds()), itoa(r.Burst), itoa(initial),
		itoa(regionLookahead.Microseconds()), itoa(debt)}
}

// poolShape names what of r the home's answers about its key depend on
// (how long it has nothing to grant, the region's fair rate), so that a
// pool forgets them when the rule changes.
func poolShape(r *admit.Rule) string {
	if isBucket(r) {
		return itoa(r.Rate.N) + "/" + itoa(r.Rate.Per.Microseconds()) + "/" + itoa(r.Burst)
	}
	return itoa(r.Limit) + "/" + itoa(r.Window.Microseconds())
}

// returnToPool gives back the units p holds to its pool, or through it
// home.
func (s *Room) returnToPool(p *allowance) {
	now := s.link.Now()
	p.mu.Lock()
	p.release(now)
	n, booked, until, gen, delta := p.avail, p.future, p.until, p.hgen, p.delta
	p.avail, p.future = 0, 0
	p.gen++
	p.mu.Unlock()
	if n+booked <= 0 {
		return
	}
	// Units due go back to the pool until they expire (home, if they
	// have); units booked, not due, go home: no other server may spend
	// them before they are due, and giving them back is always safe.
	expiry := until.UnixMicro() + delta // early: see addTake
	if err := s.link.Do(context.Background(), func(ctx context.Context, client rueidis.Client) error {
		return poolScript.Exec(ctx, client, []string{s.poolKey(p)}, []string{"r", itoa(gen), itoa(n), itoa(expiry), itoa(booked)}).Error()
	}); err != nil {
		s.Lost.Add(n + booked)
		return
	}
	s.Refunded.Add(n + booked)
}

// sweepRegion looks at the pools of keys this server used lately and not
// refilled for agentEvery, so that a pool whose demand went away gives
// back what it holds.
func (s *Room) sweepRegion(ps []*allowance, now time.Time) {
	rg := s.region
	held := make([]int64, len(ps))
	idx := make([]int, 0, len(ps))
	for i, p := range ps {
		p.mu.Lock()
		held[i] = p.shared
		if p.owing {
			held[i] = math.MaxInt64 // a debt not home yet goes first
		}
		p.mu.Unlock()
		if held[i] > 0 {
			idx = append(idx, i)
		}
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(held[b], held[a]) })
	for _, i := range idx[:min(len(idx), maxSweptPools)] {
		p := ps[i]
		rg.mu.Lock()
		last, ok := rg.agents[s.poolKey(p)]
		rg.mu.Unlock()
		if ok && now.Sub(last) < agentEvery {
			continue
		}
		s.goRefill(p)
	}
	rg.mu.Lock()
	for k, at := range rg.agents {
		if now.Sub(at) > leaseForget {
			delete(rg.agents, k)
		}
	}
	rg.mu.Unlock()
}
