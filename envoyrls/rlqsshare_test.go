package envoyrls

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/admitdev/admit"
)

func TestShareLimitOf(t *testing.T) {
	for _, c := range []struct {
		rate  admit.Rate
		burst int64
		want  shareLimit
	}{
		{admit.PerSecond(100), 100, shareLimit{Fill: 656, Units: 65600, Burst: 100}},
		{admit.PerSecond(1_000_000), 10, shareLimit{Fill: 1, Units: 1_000_000, Burst: 10}},
		{admit.Rate{N: 10, Per: time.Minute}, 10, shareLimit{Fill: 393216, Units: 65536, Burst: 10}},
		// Not whole seconds: the units round down (3 per 1.5 s is 2 per s).
		{admit.Rate{N: 3, Per: 1500 * time.Millisecond}, 3, shareLimit{Fill: 32768, Units: 65536, Burst: 3}},
	} {
		got, ok := shareLimitOf(&admit.Rule{Algorithm: admit.TokenBucket, Rate: c.rate, Burst: c.burst})
		if !ok || got != c.want {
			t.Errorf("%v burst %d: got %+v, %v; want %+v", c.rate, c.burst, got, ok, c.want)
		}
		// The units never exceed the rate.
		if float64(got.Units)/float64(got.Fill) > float64(c.rate.N)/c.rate.Per.Seconds()+1e-9 {
			t.Errorf("%v: %d per %d s is faster", c.rate, got.Units, got.Fill)
		}
	}
	if _, ok := shareLimitOf(&admit.Rule{Algorithm: admit.FixedWindow, Limit: 10, Window: time.Second}); ok {
		t.Error("a fixed window has shares")
	}
}

// checkLedger fails t if st counts more than its limit: the rates that may
// be in force past the capacity, or the tokens Envoys may hold and the pool
// past the burst.
func checkLedger(t *testing.T, st *shareState, now int64, when string) {
	t.Helper()
	var rates, maxes, buckets int64
	for i := range st.Holders {
		rates += st.Holders[i].rate(now)
		maxes += st.Holders[i].max(now)
		if st.Holders[i].Expires > now {
			buckets++
		}
	}
	if rates > st.Limit.capacity() {
		t.Fatalf("%s: rates %d > capacity %d", when, rates, st.Limit.capacity())
	}
	if tokens := max(st.Limit.Burst, buckets+1); maxes*1e6+st.Pool > tokens*1e6 {
		t.Fatalf("%s: maxima %d + pool %d µtokens > %d tokens (burst %d, %d buckets)", when, maxes, st.Pool, tokens, st.Limit.Burst, buckets)
	}
}

func TestShareTimeline(t *testing.T) {
	l, _ := shareLimitOf(&admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(100), Burst: 100})
	st := &shareState{}
	st.setLimit(l)
	const s = int64(time.Second / time.Microsecond)
	ttl := 12 * time.Second
	now := int64(1_700_000_000) * s

	// A alone takes the whole capacity it wants, and a burst's share
	// from the pool.
	a := st.share(now, shareAsk{ID: "a", Demand: 1000, Reported: true, Measured: true, TTL: ttl})
	if a.Wait || a.Rate != l.capacity() || a.Max != l.shareable() {
		t.Fatalf("a: %+v; want rate %d max %d", a, l.capacity(), l.shareable())
	}
	checkLedger(t, st, now, "a")
	// B comes: nothing is free, so it waits, and stays in the ledger.
	now += s
	b := st.share(now, shareAsk{ID: "b", Demand: 10, Reported: true, Measured: true, TTL: ttl})
	if !b.Wait {
		t.Fatalf("b: %+v; want a wait", b)
	}
	checkLedger(t, st, now, "b waits")
	// A reports again: it is lowered to make room for B's demand
	// (with a tenth of headroom) ...
	now += 4 * s
	a = st.share(now, shareAsk{ID: "a", Demand: 1000, Reported: true, Measured: true, TTL: ttl})
	wantB := unitsOf(10, l.Fill)
	wantB += wantB/10 + 1
	if a.Rate != l.capacity()-wantB {
		t.Fatalf("a lowered: %+v; want rate %d", a, l.capacity()-wantB)
	}
	checkLedger(t, st, now, "a lowered")
	// ... but its old rate stays counted until its last assignment
	// expires, 12 s after it was sent.
	now += s
	if b = st.share(now, shareAsk{ID: "b", Demand: 10, Reported: true, Measured: true, TTL: ttl}); !b.Wait {
		t.Fatalf("b before a's old assignment expires: %+v; want a wait", b)
	}
	now += 7 * s // 12 s after a's first assignment
	b = st.share(now, shareAsk{ID: "b", Demand: 10, Reported: true, Measured: true, TTL: ttl})
	if b.Wait || b.Rate != wantB {
		t.Fatalf("b after a's old assignment expired: %+v; want rate %d", b, wantB)
	}
	checkLedger(t, st, now, "b given")
	// B's bucket starts full: its tokens came from the pool.
	if b.Max < 1 {
		t.Fatalf("b: max %d", b.Max)
	}
	// Within the hysteresis, the same grant.
	now += 5 * s
	b2 := st.share(now, shareAsk{ID: "b", Demand: 10.1, Reported: true, Measured: true, TTL: ttl})
	if !b2.Same || b2.Rate != b.Rate || b2.Max != b.Max {
		t.Fatalf("b within the hysteresis: %+v; want %+v again", b2, b)
	}
	// A leaves: what it was sent counts until it expires, then B can
	// take more.
	st.share(now, shareAsk{ID: "a", Leave: true})
	checkLedger(t, st, now, "a left")
	now += 13 * s
	b = st.share(now, shareAsk{ID: "b", Demand: 1000, Reported: true, Measured: true, TTL: ttl})
	if b.Rate != l.capacity() {
		t.Fatalf("b alone: %+v; want the capacity %d", b, l.capacity())
	}
	if len(st.Holders) != 1 {
		t.Fatalf("holders %+v; want b alone", st.Holders)
	}
	checkLedger(t, st, now, "b alone")
}

func TestShareWeighted(t *testing.T) {
	l, _ := shareLimitOf(&admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(100), Burst: 100})
	st := &shareState{Limit: l, Holders: []holder{
		{ID: "a1", Class: "gold", Weight: 3, Demand: 1 << 30, Measured: true},
		{ID: "a2", Class: "gold", Weight: 3, Demand: 1 << 30, Measured: true},
		{ID: "b", Class: "free", Weight: 1, Demand: 1 << 30, Measured: true},
		{ID: "c", Class: "small", Weight: 1, Demand: 1000, Measured: true},
	}}
	got := []int64{st.targets(0, 0), st.targets(0, 1), st.targets(0, 2), st.targets(0, 3)}
	// c wants 1,101; the rest is split 3:1 between gold's two holders and
	// free.
	rest := l.capacity() - 1101
	if got[3] != 1101 || got[0]+got[1]+got[2]+got[3] != l.capacity() {
		t.Fatalf("targets %v; want c 1101, all %d", got, l.capacity())
	}
	if d := float64(got[0]+got[1]) - 0.75*float64(rest); math.Abs(d) > 2 || got[0]-got[1] > 1 || got[1]-got[0] > 1 {
		t.Fatalf("targets %v: gold's holders %d of %d, want 3/4", got, got[0]+got[1], rest)
	}
}

// TestShareBoundWithEnvoys runs Envoys' buckets as Envoy fills them (new
// ones full, replaced ones at their fill ratio, each until its TTL from
// when it arrived) under the grants of a ledger, with demands that change,
// holders that come and go and assignments that arrive late, and checks
// that in every window they admit at most the limit's burst + rate × the
// window.
func TestShareBoundWithEnvoys(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { shareBoundRun(t, seed) })
	}
}

type simBucket struct {
	tokens, max, rate float64
	expires           int64
	pending           []simAssign // sent, not yet arrived
}

type simAssign struct {
	at        int64
	max, rate float64
	ttl       int64
}

func shareBoundRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	const s = int64(time.Second / time.Microsecond)
	rate, burst := int64(50+rng.IntN(500)), int64(1+rng.IntN(200))
	if seed%4 == 0 {
		burst = int64(1 + rng.IntN(4)) // fewer tokens than buckets
	}
	l, _ := shareLimitOf(&admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(rate), Burst: burst})
	st := &shareState{}
	st.setLimit(l)
	const n = 8
	ttl := 10 * time.Second
	buckets := make([]*simBucket, n)
	demand := make([]float64, n)
	nextReport := make([]int64, n)
	joined := make([]bool, n)
	gen := make([]int, n)
	for i := range buckets {
		buckets[i] = &simBucket{}
		demand[i] = rng.Float64() * 3 * float64(rate) / n
		nextReport[i] = int64(rng.IntN(5)) * s
	}
	const step = 50_000 // µs
	var admitted []float64
	start := int64(1_700_000_000) * s
	for now := start; now < start+240*s; now += step {
		for i, b := range buckets {
			// Assignments arrive up to the delivery grace late.
			for len(b.pending) > 0 && b.pending[0].at <= now {
				a := b.pending[0]
				b.pending = b.pending[1:]
				if b.max == 0 || now >= b.expires {
					b.tokens = a.max // new: full
				} else {
					b.tokens = b.tokens / b.max * a.max
				}
				b.max, b.rate, b.expires = a.max, a.rate, now+a.ttl
			}
			if b.max > 0 && now >= b.expires {
				b.max, b.tokens, b.rate = 0, 0, 0
			}
			if b.max > 0 {
				b.tokens = min(b.max, b.tokens+b.rate*float64(step)/1e6)
			}
			if now < nextReport[i] {
				continue
			}
			nextReport[i] = now + 5*s + int64(rng.IntN(3))*step
			switch r := rng.IntN(40); {
			case r == 0 && joined[i]:
				// Leaves (its stream ends), and comes back as a new holder.
				st.share(now, shareAsk{ID: fmt.Sprint(i, "/", gen[i]), Leave: true})
				gen[i]++
				continue
			case r < 6:
				demand[i] = rng.Float64() * 3 * float64(rate) / n
			}
			joined[i] = true
			g := st.share(now, shareAsk{ID: fmt.Sprint(i, "/", gen[i]), Demand: demand[i], Reported: true, Measured: true, TTL: ttl + DeliveryGrace})
			checkLedger(t, st, now, fmt.Sprintf("t=%ds holder %d", (now-start)/s, i))
			if g.Wait {
				continue
			}
			// The worst order: a lowered assignment arrives as late as
			// it may, a raised one at once.
			delay := int64(0)
			if g.perSecond() < b.rate || float64(g.Max) < b.max {
				delay = DeliveryGrace.Microseconds() - step
			}
			b.pending = append(b.pending, simAssign{at: now + delay, max: float64(g.Max), rate: g.perSecond(), ttl: int64(ttl / time.Microsecond)})
		}
		// Every Envoy takes all its whole tokens, whatever it reported:
		// the worst for the bound.
		var took float64
		for _, b := range buckets {
			use := math.Floor(b.tokens)
			b.tokens -= use
			took += use
		}
		admitted = append(admitted, took)
	}
	// Every window: at most burst + rate × its length.
	for _, w := range []int{1, 2, 10, 20, 100, 200, 1200, 4800} {
		var sum float64
		for k, a := range admitted {
			sum += a
			if k >= w {
				sum -= admitted[k-w]
			}
			// An Envoy's bucket holds a token at least: a burst smaller
			// than the buckets counts one for each, and one more.
			bound := float64(max(burst, n+1)) + float64(rate)*float64(w)*float64(step)/1e6
			if sum > bound+1e-6 {
				t.Fatalf("rate %d burst %d: %.1f admitted in the %d steps to %d; bound %.1f", rate, burst, sum, w, k, bound)
			}
		}
	}
	var total float64
	for _, a := range admitted {
		total += a
	}
	t.Logf("rate %d burst %d: %.0f admitted in 240 s (%.0f%% of the rate)", rate, burst, total, 100*total/240/float64(rate))
}

// TestShareRuleLowered: when the limit is lowered under what its holders
// were sent, nothing more is given until their assignments have expired,
// and the next grants fit the new limit.
func TestShareRuleLowered(t *testing.T) {
	const s = int64(time.Second / time.Microsecond)
	ttl := 12 * time.Second
	old, _ := shareLimitOf(&admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1000), Burst: 100})
	st := &shareState{}
	st.setLimit(old)
	now := int64(1_700_000_000) * s
	for _, id := range []string{"a", "b"} {
		if g := st.share(now, shareAsk{ID: id, Demand: 400, Reported: true, Measured: true, TTL: ttl}); g.Wait {
			t.Fatalf("%s: %+v", id, g)
		}
	}
	lower, _ := shareLimitOf(&admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(100), Burst: 10})
	now += s
	st.setLimit(lower)
	// A newcomer waits while a and b's assignments of the old limit may
	// be in force.
	if g := st.share(now, shareAsk{ID: "c", Demand: 10, Reported: true, Measured: true, TTL: ttl}); !g.Wait {
		t.Fatalf("c under the old assignments: %+v; want a wait", g)
	}
	// a and b are lowered to the new limit's shares at once ...
	for _, id := range []string{"a", "b"} {
		g := st.share(now, shareAsk{ID: id, Demand: 400, Reported: true, Measured: true, TTL: ttl})
		if g.Wait || g.perSecond() > 100 || g.Max > 10 {
			t.Fatalf("%s lowered: %+v (%.1f/s)", id, g, g.perSecond())
		}
	}
	// ... and from when their old assignments expire, the ledger holds
	// the new limit.
	now += ttl.Microseconds()
	if g := st.share(now, shareAsk{ID: "c", Demand: 10, Reported: true, Measured: true, TTL: ttl}); g.Wait {
		t.Fatalf("c after the old assignments expired: %+v", g)
	}
	checkLedger(t, st, now, "after the change")
}

// FuzzDecodeState: any bytes decode without a panic, and a state that
// decodes encodes to bytes that decode to it again.
func FuzzDecodeState(f *testing.F) {
	st := &shareState{Limit: shareLimit{Fill: 656, Units: 65600, Burst: 100}, Pool: 5e6, PoolAt: 1,
		Holders: []holder{{ID: "a/1", Class: "tenant:acme", Weight: 3, Demand: 10, Measured: true, Rate: 9, Max: 4, HeldRate: 12, HeldMax: 5, Until: 7, Expires: 9, Seen: 2, Every: 5e6}, {ID: "b", Gone: true}}}
	f.Add(appendState(nil, st))
	f.Add([]byte{stateVersion})
	f.Fuzz(func(t *testing.T, b []byte) {
		var got shareState
		if decodeState(b, &got) != nil {
			return
		}
		again := appendState(nil, &got)
		var back shareState
		if err := decodeState(again, &back); err != nil || !reflect.DeepEqual(back, got) {
			t.Fatalf("%x decodes to %+v, which encodes to %x, which decodes to %+v (%v)", b, got, again, back, err)
		}
	})
}

// TestShareManyBucketsNewcomer: a limit of burst 20 divided among 200
// buckets (one token each, the burst so counted) still takes a newcomer:
// the others make room, and it is given its share within a few TTLs.
func TestShareManyBucketsNewcomer(t *testing.T) {
	const s = int64(time.Second / time.Microsecond)
	l, _ := shareLimitOf(&admit.Rule{Algorithm: admit.TokenBucket, Rate: admit.PerSecond(40), Burst: 20})
	st := &shareState{}
	st.setLimit(l)
	now := int64(1_700_000_000) * s
	ttl := 13 * time.Second
	ask := func(id string, demand float64) shareGrant {
		return st.share(now, shareAsk{ID: id, Demand: demand, Reported: true, Measured: true, TTL: ttl, Every: 5 * time.Second})
	}
	for round := range 6 {
		for i := range 200 {
			ask(fmt.Sprint("acme/", i), 5)
		}
		checkLedger(t, st, now, fmt.Sprint("round ", round))
		now += 5 * s
	}
	var got shareGrant
	for k := 0; k < 12; k++ {
		if got = ask("beta", 30); !got.Wait {
			break
		}
		for i := range 200 {
			ask(fmt.Sprint("acme/", i), 5)
		}
		checkLedger(t, st, now, fmt.Sprint("newcomer round ", k))
		now += 5 * s
	}
	if got.Wait {
		t.Fatalf("the newcomer still waits after a minute: %+v", got)
	}
}
