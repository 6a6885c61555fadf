// Package bench compares Admit's in-process decisions with peer Go rate
// limiters, side by side in one run. It is its own module so that the peer
// libraries never enter Admit's go.mod.
//
//	cd bench && go test -run='^$' -bench=. -benchmem -count=3
package bench

import (
	"context"
	"errors"
	"hash/maphash"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/memstore"
	golimiter "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	ulule "github.com/ulule/limiter/v3"
	ululemem "github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/time/rate"
)

// The limits of seed 002's hierarchy: user 100/s burst 50, tenant 1000/s
// burst 200, global 10000/s burst 1000. Single-scope cases use the user's.
type scope struct {
	perSecond int64
	burst     int64
}

var scopes = [3]scope{{100, 50}, {1000, 200}, {10000, 1000}}

const tenants = 1000

// limiter is what one implementation offers a benchmark: decisions for a
// user (a key index), with one scope or the three-scope hierarchy, and for
// a key given by name. A worker is used by one goroutine at a time.
type limiter interface {
	worker() worker
}

type worker interface {
	allow(user int) bool
	allow3(user int) bool
	allowKey(key string) bool
}

// keys holds the precomputed names every implementation is given, so no
// benchmark pays for formatting keys.
type keys struct {
	users   []string
	tenants []string
}

func makeKeys(n int) *keys {
	k := &keys{users: make([]string, n), tenants: make([]string, tenants)}
	for i := range k.users {
		k.users[i] = "user:" + strconv.Itoa(i)
	}
	for i := range k.tenants {
		k.tenants[i] = "tenant:" + strconv.Itoa(i)
	}
	return k
}

// --- Admit ---

type admitLimiter struct {
	s    *memstore.Store
	rule *admit.Rule
	// Each user's charges, prepared once, as policy.Resolve prepares the
	// charges it makes (see docs/benchmarks.md): one array of a charge
	// per user and one of the three charges of each user, as x/time/rate's
	// harness keeps one array of the users' keys.
	one   []admit.Charge
	three []admit.Charge
}

// admitWorker owns the Decision it reuses, as a request handler would.
type admitWorker struct {
	*admitLimiter
	d admit.Decision
}

func newAdmit(k *keys) limiter {
	rules := [3]*admit.Rule{}
	for i, sc := range scopes {
		rules[i] = &admit.Rule{Name: strconv.Itoa(i), Algorithm: admit.TokenBucket, Rate: admit.PerSecond(sc.perSecond), Burst: sc.burst}
	}
	// The peers' stores below sweep hourly; so does this one, so that no
	// store gives memory back while a benchmark measures it.
	a := &admitLimiter{s: memstore.New(&memstore.Options{SweepInterval: time.Hour}), rule: rules[0], one: make([]admit.Charge, len(k.users)), three: make([]admit.Charge, 3*len(k.users))}
	for u, name := range k.users {
		a.one[u] = admit.Charge{Key: name, Rule: rules[0], Cost: 1}
		engine.PrepareCharge(&a.one[u])
		c := a.three[3*u : 3*u+3]
		c[0] = a.one[u]
		c[1] = admit.Charge{Key: k.tenants[u%tenants], Rule: rules[1], Cost: 1}
		c[2] = admit.Charge{Key: "global", Rule: rules[2], Cost: 1}
		engine.PrepareCharge(&c[1])
		engine.PrepareCharge(&c[2])
	}
	return a
}

func (a *admitLimiter) worker() worker { return &admitWorker{admitLimiter: a} }

func (a *admitLimiter) liveKeys() int64 { return a.s.Stats().Keys }

func (a *admitLimiter) close() { a.s.Close() }

func (w *admitWorker) decide(c []admit.Charge) bool {
	_ = w.s.Decide(context.Background(), c, &w.d)
	return w.d.Allowed
}

func (w *admitWorker) allow(u int) bool  { return w.decide(w.one[u : u+1]) }
func (w *admitWorker) allow3(u int) bool { return w.decide(w.three[3*u : 3*u+3]) }
func (w *admitWorker) allowKey(key string) bool {
	c := [1]admit.Charge{{Key: key, Rule: w.rule, Cost: 1}}
	return w.decide(c[:])
}

// --- Admit's front door: admit.Limiter, a Who per decision ---

// limiterHarness decides through admit.Limiter as a program would: the
// user's (and tenant's) name in a Who on every decision, one Decision per
// worker reused.
type limiterHarness struct {
	k          *keys
	s          *memstore.Store
	one, three *admit.Limiter
}

type limiterWorker struct {
	*limiterHarness
	d admit.Decision
}

func newAdmitLimiter(k *keys) limiter {
	s := memstore.New(&memstore.Options{SweepInterval: time.Hour})
	limit := func(i int) admit.Limit {
		return admit.Bucket(strconv.Itoa(i), admit.PerSecond(scopes[i].perSecond), scopes[i].burst)
	}
	one, err1 := admit.NewLimiter(s, limit(0).Per(admit.PerUser))
	three, err2 := admit.NewNamedLimiter(s, "three", limit(0).Per(admit.PerUser), limit(1).Per(admit.PerTenant), limit(2))
	if err := errors.Join(err1, err2); err != nil {
		panic(err)
	}
	return &limiterHarness{k: k, s: s, one: one, three: three}
}

func (h *limiterHarness) worker() worker  { return &limiterWorker{limiterHarness: h} }
func (h *limiterHarness) liveKeys() int64 { return h.s.Stats().Keys }
func (h *limiterHarness) close() {
	h.one.Close()
	h.three.Close()
	h.s.Close()
}

func (w *limiterWorker) allow(u int) bool { return w.allowKey(w.k.users[u]) }

func (w *limiterWorker) allow3(u int) bool {
	_ = w.three.Decide(context.Background(), admit.Who{Tenant: w.k.tenants[u%tenants], User: w.k.users[u]}, 1, &w.d)
	return w.d.Allowed
}

func (w *limiterWorker) allowKey(key string) bool {
	_ = w.one.Decide(context.Background(), admit.Who{User: key}, 1, &w.d)
	return w.d.Allowed
}

// allowHarness decides through admit.Limiter.Allow, the call the README
// shows: a Who per decision, the Decision returned by value.
type allowHarness struct{ *limiterHarness }

func newAdmitAllow(k *keys) limiter { return allowHarness{newAdmitLimiter(k).(*limiterHarness)} }

func (h allowHarness) worker() worker { return h }

func (h allowHarness) allow(u int) bool { return h.allowKey(h.k.users[u]) }

func (h allowHarness) allow3(u int) bool {
	d, _ := h.three.Allow(context.Background(), admit.Who{Tenant: h.k.tenants[u%tenants], User: h.k.users[u]})
	return d.Allowed
}

func (h allowHarness) allowKey(key string) bool {
	d, _ := h.one.Allow(context.Background(), admit.Who{User: key})
	return d.Allowed
}

// --- golang.org/x/time/rate in a 256-shard map ---

type xrateShard struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
	_  [40]byte
}

type xrateMap struct {
	seed   maphash.Seed
	sc     scope
	shards [256]xrateShard
}

func newXrateMap(sc scope) *xrateMap {
	x := &xrateMap{seed: maphash.MakeSeed(), sc: sc}
	for i := range x.shards {
		x.shards[i].m = map[string]*rate.Limiter{}
	}
	return x
}

func (x *xrateMap) get(key string) *rate.Limiter {
	sh := &x.shards[maphash.String(x.seed, key)>>56]
	sh.mu.Lock()
	l := sh.m[key]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(x.sc.perSecond), int(x.sc.burst))
		sh.m[key] = l
	}
	sh.mu.Unlock()
	return l
}

type xrateLimiter struct {
	k     *keys
	level [3]*xrateMap
}

func newXrate(k *keys) limiter {
	x := &xrateLimiter{k: k}
	for i, sc := range scopes {
		x.level[i] = newXrateMap(sc)
	}
	return x
}

func (x *xrateLimiter) worker() worker           { return x }
func (x *xrateLimiter) allow(u int) bool         { return x.level[0].get(x.k.users[u]).Allow() }
func (x *xrateLimiter) allowKey(key string) bool { return x.level[0].get(key).Allow() }

// allow3 checks the three scopes one after another, as users of x/time/rate
// do: not atomic, so a refusal by a later scope has already charged the
// earlier ones.
func (x *xrateLimiter) allow3(u int) bool {
	return x.level[0].get(x.k.users[u]).Allow() &&
		x.level[1].get(x.k.tenants[u%tenants]).Allow() &&
		x.level[2].get("global").Allow()
}

// --- sethvargo/go-limiter memorystore ---

type goLimiter struct {
	k     *keys
	level [3]golimiter.Store
}

func newGoLimiter(k *keys) limiter {
	g := &goLimiter{k: k}
	for i, sc := range scopes {
		s, err := memorystore.New(&memorystore.Config{Tokens: uint64(sc.perSecond), Interval: time.Second, SweepInterval: time.Hour})
		if err != nil {
			panic(err)
		}
		g.level[i] = s
	}
	return g
}

func (g *goLimiter) take(level int, key string) bool {
	_, _, _, ok, _ := g.level[level].Take(context.Background(), key)
	return ok
}

func (g *goLimiter) worker() worker { return g }

func (g *goLimiter) close() {
	for _, s := range g.level {
		_ = s.Close(context.Background())
	}
}
func (g *goLimiter) allowKey(key string) bool { return g.take(0, key) }
func (g *goLimiter) allow(u int) bool         { return g.take(0, g.k.users[u]) }
func (g *goLimiter) allow3(u int) bool {
	return g.take(0, g.k.users[u]) && g.take(1, g.k.tenants[u%tenants]) && g.take(2, "global")
}

// --- ulule/limiter memory store ---

type ululeLimiter struct {
	k     *keys
	level [3]*ulule.Limiter
}

func newUlule(k *keys) limiter {
	l := &ululeLimiter{k: k}
	for i, sc := range scopes {
		l.level[i] = ulule.New(ululemem.NewStoreWithOptions(ulule.StoreOptions{CleanUpInterval: time.Hour}), ulule.Rate{Period: time.Second, Limit: sc.perSecond})
	}
	return l
}

func (l *ululeLimiter) get(level int, key string) bool {
	c, _ := l.level[level].Get(context.Background(), key)
	return !c.Reached
}

func (l *ululeLimiter) worker() worker           { return l }
func (l *ululeLimiter) allowKey(key string) bool { return l.get(0, key) }
func (l *ululeLimiter) allow(u int) bool         { return l.get(0, l.k.users[u]) }
func (l *ululeLimiter) allow3(u int) bool {
	return l.get(0, l.k.users[u]) && l.get(1, l.k.tenants[u%tenants]) && l.get(2, "global")
}

var impls = []struct {
	name string
	make func(*keys) limiter
}{
	{"admit", newAdmit},
	{"admit-limiter", newAdmitLimiter},
	{"admit-allow", newAdmitAllow},
	{"xrate", newXrate},
	{"golimiter", newGoLimiter},
	{"ulule", newUlule},
}

var keyCache sync.Map // n → *keys

func cachedKeys(n int) *keys {
	if k, ok := keyCache.Load(n); ok {
		return k.(*keys)
	}
	k, _ := keyCache.LoadOrStore(n, makeKeys(n))
	return k.(*keys)
}

// next steps through key indexes in a scattered order: a multiplicative
// stride modulo n visits every key, and parallel goroutines start apart.
func next(i, n int) int { return (i + 7_919_993) % n }

func BenchmarkCompare(b *testing.B) {
	// The -names case gives every implementation the user's key name on
	// each decision, as a request would, so Admit's charge is made (and
	// its key hashed) every time rather than prepared once.
	cases := []struct {
		name  string
		users int
		how   how
	}{
		{"hot-1K", 1_000, oneScope},
		{"keyed-1M", 1_000_000, oneScope},
		{"keyed-1M-names", 1_000_000, byName},
		{"hier3-1M", 1_000_000, threeScopes},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			k := cachedKeys(c.users)
			for _, impl := range impls {
				// Made and warmed inside its own benchmark, an
				// implementation that -bench leaves out costs nothing.
				b.Run(impl.name, func(b *testing.B) { compare(b, impl.make(k), k, c.users, c.how) })
			}
		})
	}
}

// how a benchmark asks for a decision on a user's behalf.
type how int

const (
	oneScope    how = iota // worker.allow
	threeScopes            // worker.allow3
	byName                 // worker.allowKey with the user's key name
)

// compare times l's decisions, serially and from parallel goroutines, over
// users keys that all exist before timing starts.
func compare(b *testing.B, l limiter, k *keys, users int, h how) {
	decider := func(w worker) func(int) bool {
		switch h {
		case threeScopes:
			return w.allow3
		case byName:
			return func(u int) bool { return w.allowKey(k.users[u]) }
		}
		return w.allow
	}
	warm := decider(l.worker())
	for u := range users {
		warm(u)
	}
	runtime.GC() // the warm-up's garbage is not collected while timing
	b.Run("serial", func(b *testing.B) {
		decide := decider(l.worker())
		b.ReportAllocs()
		i := 0
		for range b.N {
			i = next(i, users)
			decide(i)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		var start atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			decide := decider(l.worker())
			i := int(start.Add(int64(users/7+1))) % users
			for pb.Next() {
				i = next(i, users)
				decide(i)
			}
		})
	})
}

// BenchmarkMemory reports the heap each implementation holds per live key
// (B/key), key storage included, with 1M keys created by one decision each.
func BenchmarkMemory(b *testing.B) {
	const n = 1_000_000
	for _, impl := range impls {
		b.Run(impl.name, func(b *testing.B) {
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				l := impl.make(&keys{tenants: cachedKeys(1).tenants})
				w := l.worker()
				for u := range n {
					// Names are made here and dropped: whatever the
					// implementation keeps of them counts.
					w.allowKey("user:" + strconv.Itoa(u))
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				// A store that dropped keys meanwhile would measure less
				// than n live keys cost.
				if c, ok := l.(interface{ liveKeys() int64 }); ok && c.liveKeys() != n {
					b.Fatalf("%s holds %d keys after %d were made", impl.name, c.liveKeys(), n)
				}
				b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/n, "B/key")
				runtime.KeepAlive(l)
				if c, ok := l.(interface{ close() }); ok {
					c.close()
				}
			}
		})
	}
}
