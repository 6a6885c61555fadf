package redisstore_test

import (
	"context"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
	"github.com/admitdev/admit/storetest"
)

// admission is one admitted decision, at the time its answer was back.
type admission struct {
	sent, at time.Duration
	region   int
}

// regionWorld is a home Redis and regions, each its own Redis with its
// servers (stores), and the home reached through a link that can be cut.
type regionWorld struct {
	home    *redistest.Server
	links   []*link
	regions []*redistest.Server
	servers [][]*redisstore.Store
}

func newRegionWorld(t *testing.T, regions, perRegion int, cut redisstore.CutPolicy) *regionWorld {
	t.Helper()
	return newRegionWorldDelayed(t, regions, perRegion, cut, 0)
}

// newRegionWorldDelayed is newRegionWorld with links that delay each way.
func newRegionWorldDelayed(t *testing.T, regions, perRegion int, cut redisstore.CutPolicy, delay time.Duration) *regionWorld {
	t.Helper()
	w := &regionWorld{home: redistest.Start(t)}
	prefix := newPrefix()
	for i := 0; i < regions; i++ {
		reg := redistest.Start(t)
		w.regions = append(w.regions, reg)
		l := newLink(t, w.home.Addr, delay)
		w.links = append(w.links, l)
		var ss []*redisstore.Store
		for j := 0; j < perRegion; j++ {
			// Timeouts of seconds: these tests count admissions, and
			// the race detector on a loaded machine slows every call.
			home, err := redisstore.Open(context.Background(), "redis://"+l.addr, &redisstore.Options{Prefix: prefix, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			s, err := redisstore.Open(context.Background(), "redis://"+reg.Addr, &redisstore.Options{Prefix: prefix, Timeout: 5 * time.Second,
				Home: home, Region: string(rune('a' + i)), Cut: cut})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close(); home.Close() })
			ss = append(ss, s)
		}
		w.servers = append(w.servers, ss)
	}
	return w
}

// link is a TCP proxy to the home that can be cut: a cut closes every
// connection through it and refuses new ones until healed.
type link struct {
	addr   string
	delay  time.Duration // each way
	ln     net.Listener
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
	target string
}

func newLink(t *testing.T, target string, delay time.Duration) *link {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &link{addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]bool{}, target: target, delay: delay}
	t.Cleanup(func() { ln.Close(); l.setCut(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.mu.Lock()
			if l.cut {
				l.mu.Unlock()
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				l.mu.Unlock()
				c.Close()
				continue
			}
			l.conns[c], l.conns[u] = true, true
			l.mu.Unlock()
			go func() { delayedCopy(u, c, l.delay); u.Close() }()
			go func() { delayedCopy(c, u, l.delay); c.Close() }()
		}
	}()
	return l
}

// delayedCopy copies from src to dst, each read delivered delay after it
// was read, in order.
func delayedCopy(dst io.Writer, src io.Reader, delay time.Duration) {
	if delay == 0 {
		_, _ = io.Copy(dst, src)
		return
	}
	type chunk struct {
		at time.Time
		b  []byte
	}
	ch := make(chan chunk, 1024)
	go func() {
		defer close(ch)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				ch <- chunk{time.Now().Add(delay), b[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}

func (l *link) setCut(cut bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = cut
	if cut {
		for c := range l.conns {
			c.Close()
		}
		clear(l.conns)
	}
}

// hammer has callers goroutines per server of each region decide one
// charge of rule on key until stop, and returns every admission.
func hammer(w *regionWorld, rule *admit.Rule, callers []int, start time.Time, stop <-chan struct{}) []admission {
	var mu sync.Mutex
	var out []admission
	var wg sync.WaitGroup
	for ri, ss := range w.servers {
		for _, s := range ss {
			for g := 0; g < callers[ri]; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var d admit.Decision
					for {
						select {
						case <-stop:
							return
						default:
						}
						sent := time.Since(start)
						err := s.Decide(context.Background(), []admit.Charge{{Key: rule.Name, Rule: rule, Cost: 1}}, &d)
						at := time.Since(start)
						if err != nil {
							time.Sleep(time.Millisecond)
							continue
						}
						if d.Allowed {
							mu.Lock()
							out = append(out, admission{sent, at, ri})
							mu.Unlock()
						} else {
							time.Sleep(200 * time.Microsecond)
						}
					}
				}()
			}
		}
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].at < out[j].at })
	return out
}

// checkFromStart fails t if, by any admission's time, more were admitted
// than burst + rate × the time since start (before the key existed).
func checkFromStart(t *testing.T, adm []admission, rule *admit.Rule) {
	t.Helper()
	for i, a := range adm {
		bound := float64(rule.Burst) + float64(rule.Rate.N)*float64(a.at)/float64(rule.Rate.Per)
		if float64(i+1) > bound {
			t.Fatalf("admission %d at %v: over burst + rate·t = %.1f", i+1, a.at, bound)
		}
	}
}

// TestRegionsNeverOver: three regions of two servers each, their callers
// skewed 6:2:1, hammer one bucket: together they never admit more than
// burst + rate × t from before the key existed.
func TestRegionsNeverOver(t *testing.T) {
	w := newRegionWorld(t, 3, 2, redisstore.RefuseWhenCut)
	rule := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(400), Burst: 100}
	start := time.Now()
	stop := make(chan struct{})
	time.AfterFunc(3*time.Second, func() { close(stop) })
	adm := hammer(w, rule, []int{6, 2, 1}, start, stop)
	checkFromStart(t, adm, rule)
	logRegions(t, w, adm, rule)
}

// logRegions logs what each region admitted and holds.
func logRegions(t *testing.T, w *regionWorld, adm []admission, rule *admit.Rule) {
	t.Helper()
	per := make([]int, len(w.servers))
	for _, a := range adm {
		per[a.region]++
	}
	t.Logf("admitted %d %v", len(adm), per)
	for i, ss := range w.servers {
		for _, s := range ss {
			h, _ := s.Region()
			st := s.Health()
			t.Logf("region %d: %+v; withdrawn %d, expired %d, lost %d, given back %d", i, h, st.Withdrawn, st.Expired, st.Lost, st.Refunded)
		}
	}
}

// TestRegionsCounts: a fixed window and a quota held across three
// regions never admit more than their limit in a period.
func TestRegionsCounts(t *testing.T) {
	w := newRegionWorld(t, 3, 2, redisstore.RefuseWhenCut)
	for _, rule := range []*admit.Rule{
		{Name: "window", Algorithm: admit.FixedWindow, Limit: 300, Window: 500 * time.Millisecond},
		{Name: "quota", Algorithm: admit.Quota, Limit: 700, Period: admit.Day, Location: time.UTC},
	} {
		t.Run(rule.Name, func(t *testing.T) {
			start := time.Now()
			stop := make(chan struct{})
			time.AfterFunc(2*time.Second, func() { close(stop) })
			adm := hammer(w, rule, []int{4, 2, 1}, start, stop)
			logRegions(t, w, adm, rule)
			if rule.Algorithm == admit.Quota {
				if len(adm) > int(rule.Limit) {
					t.Fatalf("admitted %d, over the quota's %d", len(adm), rule.Limit)
				}
				return
			}
			// Decided within a window: sent after it began, answered
			// before it ended.
			wu := rule.Window
			counts := map[time.Time]int64{}
			for _, a := range adm {
				sent, done := start.Add(a.sent), start.Add(a.at)
				if end := periodOf(sent, wu); end.Equal(periodOf(done, wu)) {
					counts[end]++
				}
			}
			for end, n := range counts {
				if n > rule.Limit {
					t.Errorf("window ending %v admitted %d, over %d", end.Format(time.StampMicro), n, rule.Limit)
				}
			}
			t.Logf("per window: %v", counts)
		})
	}
}

// periodOf returns the end of the window of length w that at is in.
func periodOf(at time.Time, w time.Duration) time.Time {
	us, wu := at.UnixMicro(), w.Microseconds()
	return time.UnixMicro(us - us%wu + wu)
}

// TestRegionsCut: a region cut from its home spends what it holds, then
// refuses (or, failing when cut, errs so that on_error applies), while
// the others go on; healed, it admits again.
func TestRegionsCut(t *testing.T) {
	for _, cut := range []redisstore.CutPolicy{redisstore.RefuseWhenCut, redisstore.FailWhenCut} {
		t.Run(map[redisstore.CutPolicy]string{redisstore.RefuseWhenCut: "refuse", redisstore.FailWhenCut: "fail"}[cut], func(t *testing.T) {
			w := newRegionWorld(t, 2, 1, cut)
			rule := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(200), Burst: 50}
			decide := func(s *redisstore.Store) (bool, error) {
				var d admit.Decision
				err := s.Decide(context.Background(), []admit.Charge{{Key: "k", Rule: rule, Cost: 1}}, &d)
				return d.Allowed, err
			}
			a, b := w.servers[0][0], w.servers[1][0]
			// Both regions hold some of the bucket, once the home, just
			// started, grants it (see TestRegionsHomeRestart).
			for _, s := range []*redisstore.Store{a, b} {
				ok := false
				for end := time.Now().Add(5 * time.Second); !ok && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
					var err error
					if ok, err = decide(s); err != nil {
						t.Fatal(err)
					}
				}
				if !ok {
					t.Fatal("a region admitted nothing in 5 s")
				}
			}
			w.links[1].setCut(true)
			// b lives on what it holds, at most until it expires.
			deadline := time.Now().Add(regionSpends)
			var admitted, refused, failed int
			for time.Now().Before(deadline.Add(500 * time.Millisecond)) {
				after := time.Now().After(deadline) // decided after it
				ok, err := decide(b)
				switch {
				case err != nil:
					if cut != redisstore.FailWhenCut || admit.ErrorCode(err) != admit.CodeUnavailable {
						t.Fatalf("cut: %v", err)
					}
					failed++
				case ok && after:
					t.Fatalf("region b, cut from the home, admitted past %v", regionSpends)
				case ok:
					admitted++
				default:
					refused++
				}
				time.Sleep(2 * time.Millisecond)
			}
			t.Logf("cut: admitted %d, refused %d, failed %d", admitted, refused, failed)
			if cut == redisstore.FailWhenCut && failed == 0 {
				t.Error("a region cut from its home, failing when cut, never failed")
			}
			if cut == redisstore.RefuseWhenCut && (failed != 0 || refused == 0) {
				t.Errorf("a region cut from its home, refusing when cut: refused %d, failed %d", refused, failed)
			}
			// a goes on meanwhile.
			if ok, err := decide(a); !ok || err != nil {
				t.Errorf("region a, not cut: %v %v", ok, err)
			}
			w.links[1].setCut(false)
			healed := false
			for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && !healed; time.Sleep(10 * time.Millisecond) {
				healed, _ = decide(b)
			}
			if !healed {
				t.Error("region b admitted nothing within 10 s of its link healing")
			}
		})
	}
}

// regionSpends bounds how long a cut region lives on what it holds: its
// pool's units expire regionHold after they unlock, at most regionLookahead
// after the grant, and a server's allowance with them.
const regionSpends = 250*time.Millisecond + time.Second + 100*time.Millisecond

// TestRegionsHomeRestart: the home restarts, empty, while the regions
// spend what they hold of its bucket: it starts the key anew after every
// position the lost one could have handed out, so the from-start bound
// holds across the restart.
func TestRegionsHomeRestart(t *testing.T) {
	w := newRegionWorld(t, 3, 1, redisstore.RefuseWhenCut)
	rule := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(300), Burst: 200}
	start := time.Now()
	stop := make(chan struct{})
	time.AfterFunc(time.Second, func() { w.home.Restart(t) })
	time.AfterFunc(3*time.Second, func() { close(stop) })
	adm := hammer(w, rule, []int{3, 2, 1}, start, stop)
	checkFromStart(t, adm, rule)
	logRegions(t, w, adm, rule)
}

// TestRegionsDebits: a debit (a cost known after the work) takes what
// its region can get and owes the rest; a debit past the limit is
// reported over it, and the debt refuses later checks everywhere.
func TestRegionsDebits(t *testing.T) {
	w := newRegionWorld(t, 2, 1, redisstore.RefuseWhenCut)
	rule := &admit.Rule{Name: "tokens", Algorithm: admit.FixedWindow, Limit: 100, Window: time.Hour}
	a, b := w.servers[0][0], w.servers[1][0]
	decide := func(s *redisstore.Store, cost int64, debit bool) admit.Decision {
		t.Helper()
		var d admit.Decision
		if err := s.Decide(context.Background(), []admit.Charge{{Key: "k", Rule: rule, Cost: cost, Debit: debit}}, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := decide(a, 60, true); !d.Allowed || !d.Results[0].Allowed {
		t.Fatalf("a debit of 60 of a fresh limit of 100: %+v", d)
	}
	if d := decide(b, 60, true); !d.Allowed || d.Results[0].Allowed {
		t.Fatalf("a debit of 60 past the 40 left: %+v; want admitted and reported over", d)
	}
	for _, s := range []*redisstore.Store{a, b} {
		if d := decide(s, 1, false); d.Allowed {
			t.Errorf("a check after the limit was debited past: admitted")
		}
	}
	// An operator's reset gives the key a fresh limit.
	if err := a.Reset(context.Background(), []admit.Charge{{Key: "k", Rule: rule, Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	if d := decide(a, 1, false); !d.Allowed {
		t.Errorf("a check after a reset: refused")
	}
	// Reservations are not made across regions: said so, not made.
	if _, err := a.Reserve(context.Background(), []admit.Charge{{Key: "k", Rule: rule, Cost: 1}}, time.Second); admit.ErrorCode(err) != admit.CodeInvalid {
		t.Errorf("a reservation across regions: %v", err)
	}
}

// TestRegionsRareLargeChecks: checks of a large cost, each well within
// the limit but asked now and then, are admitted: a region whose pool is
// empty and that asks for no more than its fair rate waits for the home
// rather than refuse (red team: cost 50 of a burst of 50, once a second,
// was never admitted).
func TestRegionsRareLargeChecks(t *testing.T) {
	w := newRegionWorld(t, 2, 1, redisstore.RefuseWhenCut)
	// A home just started fences new buckets for τ + lookahead (see
	// TestRegionsHomeRestart), counted from its uptime in whole seconds:
	// 3.25 s for the slow bucket's burst of 3 at 1 a second.
	time.Sleep(4500 * time.Millisecond)
	for _, c := range []struct {
		rule *admit.Rule
		cost int64
	}{
		{&admit.Rule{Name: "bucket", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(200), Burst: 50}, 40},
		{&admit.Rule{Name: "window", Algorithm: admit.FixedWindow, Limit: 100, Window: 3 * time.Second}, 20},
		// A slow bucket, 1 a second, asked 2 every 2 s: units a server
		// held past their hold go back home, not lost, and a slow
		// bucket's are held as long as its burst takes to refill (red
		// team rounds 2 and 3: 1 of 20 admitted).
		{&admit.Rule{Name: "slow", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 3}, 2},
	} {
		s, rule, cost := w.servers[0][0], c.rule, c.cost
		// One refusal is allowed: a unit granted ahead may still be on
		// its way back home when the next check asks (seen once in
		// ten under the race detector on a loaded machine).
		every, checks, allowed := time.Second, 4, 1
		if rule.Name == "slow" {
			every, checks = 2*time.Second, 6
		}
		refused := 0
		for i := range checks {
			var d admit.Decision
			if err := s.Decide(context.Background(), []admit.Charge{{Key: rule.Name, Rule: rule, Cost: cost}}, &d); err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				refused++
				t.Logf("%s: check %d of cost %d, %v apart: refused (%+v)", rule.Name, i, cost, every, d.Results[0])
			}
			time.Sleep(every)
		}
		if refused > allowed {
			t.Errorf("%s: %d of %d checks of cost %d, %v apart, refused", rule.Name, refused, checks, cost, every)
		}
	}
}

// TestRegionsSpentStaysRefused: once the home said a quota is spent, the
// region refuses it locally until its period ends, so its Redis going
// away meanwhile does not turn the refusals into failures (which on_error
// open would admit; red team: 498 admitted of a quota of 300).
func TestRegionsSpentStaysRefused(t *testing.T) {
	home := redistest.Start(t)
	reg := redistest.Start(t)
	prefix := newPrefix()
	h, err := redisstore.Open(context.Background(), "redis://"+home.Addr, &redisstore.Options{Prefix: prefix, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	s, err := redisstore.Open(context.Background(), "redis://"+reg.Addr, &redisstore.Options{Prefix: prefix, Timeout: 2 * time.Second, Home: h, Region: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rule := &admit.Rule{Name: "quota", Algorithm: admit.Quota, Limit: 10, Period: admit.Day, Location: time.UTC}
	var d admit.Decision
	decide := func() (bool, error) {
		err := s.Decide(context.Background(), []admit.Charge{{Key: "q", Rule: rule, Cost: 1}}, &d)
		return d.Allowed, err
	}
	// Spend the quota. A region asking faster than its fair rate is
	// refused for a moment while its pool refills in the background; the
	// home's "spent" is a refusal until the period ends.
	admitted := 0
	for i := 0; ; i++ {
		ok, err := decide()
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			admitted++
			continue
		}
		if d.RetryAfter > time.Hour {
			break
		}
		if i > 500 {
			t.Fatalf("after %d decisions, %d admitted, the home never said the quota is spent (last %+v)", i, admitted, d.Results)
		}
		time.Sleep(d.RetryAfter)
	}
	if admitted != 10 {
		t.Fatalf("admitted %d of a quota of 10", admitted)
	}
	reg.Freeze()
	defer reg.Thaw()
	for i := range 20 {
		ok, err := decide()
		if ok || err != nil {
			t.Fatalf("decision %d with the region's Redis frozen: admitted %v, error %v; want refused", i, ok, err)
		}
	}
}

// TestRegionsEvictingHome: a home that may evict keys is refused, saying
// why: an evicted key would grant again what it granted (red team: a
// spent quota admitted 288 more after its key was evicted).
func TestRegionsEvictingHome(t *testing.T) {
	home := redistest.Start(t, "--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru")
	reg := redistest.Start(t)
	h, err := redisstore.Open(context.Background(), "redis://"+home.Addr, &redisstore.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	s, err := redisstore.Open(context.Background(), "redis://"+reg.Addr, &redisstore.Options{Timeout: time.Second, Home: h, Region: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rule := &admit.Rule{Name: "quota", Algorithm: admit.Quota, Limit: 10, Period: admit.Day, Location: time.UTC}
	var d admit.Decision
	if err := s.Decide(context.Background(), []admit.Charge{{Key: "q", Rule: rule, Cost: 1}}, &d); err != nil || d.Allowed {
		t.Fatalf("a decision with an evicting home: admitted %v, %v; want refused", d.Allowed, err)
	}
	if rh, _ := s.Region(); !strings.Contains(rh.LastError, "maxmemory-policy volatile-lru") || !rh.Cut {
		t.Errorf("region health %+v: want cut, the error naming the policy", rh)
	}
}

// TestRegionsNewKeysFlood: a tenant inventing a new key per request (a
// user id each time) makes each one's first decision wait for the home,
// but its refills are bounded apart: another tenant spending a key the
// region holds keeps being admitted (red team: 99 of 736 refused, with
// 400 callers flooding).
func TestRegionsNewKeysFlood(t *testing.T) {
	w := newRegionWorldDelayed(t, 1, 1, redisstore.RefuseWhenCut, 20*time.Millisecond) // the home is far: new keys wait for it
	s := w.servers[0][0]
	user := &admit.Rule{Name: "user", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10), Burst: 5}
	plan := &admit.Rule{Name: "plan", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1000), Burst: 100}
	victim := admit.Charge{Key: admit.Key{Scope: "tenant", Tenant: "victim", Rule: plan.Name}.String(), Rule: plan, Cost: 1}
	decide := func(c admit.Charge) (bool, error) {
		var d admit.Decision
		err := s.Decide(context.Background(), []admit.Charge{c}, &d)
		return d.Allowed, err
	}
	// The victim's key is held and in use: the home fenced it at first
	// (just started), so ask until it admits, then for a second more.
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ok, _ := decide(victim); ok {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the victim's key was never admitted")
		}
	}
	for range 100 {
		_, _ = decide(victim)
		time.Sleep(10 * time.Millisecond)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var n atomic.Int64
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := admit.Key{Scope: "user", Tenant: "evil", Subject: "u" + itoa(n.Add(1)), Rule: user.Name}.String()
				_, _ = decide(admit.Charge{Key: k, Rule: user, Cost: 1})
			}
		}()
	}
	refused := 0
	for range 200 { // 100 a second, a tenth of its rate
		var d admit.Decision
		err := s.Decide(context.Background(), []admit.Charge{victim}, &d)
		if err != nil || !d.Allowed {
			refused++
			rh, _ := s.Region()
			t.Logf("refused: %v %+v %+v", err, d.Results, rh)
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	t.Logf("new keys: %d; the victim refused %d of 200", n.Load(), refused)
	if refused > 0 {
		t.Errorf("the victim, at a tenth of its rate, was refused %d of 200 times while another tenant flooded new keys", refused)
	}
}

// TestRegionsDebtsGoHome: a debit a region cannot pay is owed home before
// it is answered, so the debt outlives the server that took it and every
// region pays it (red team round 2: a debt of 1,000 lost with its server,
// its pool, or its pool's expiry, and ignored by the other regions).
func TestRegionsDebtsGoHome(t *testing.T) {
	w := newRegionWorld(t, 2, 1, redisstore.RefuseWhenCut)
	time.Sleep(2500 * time.Millisecond) // past the new home's fence
	rule := &admit.Rule{Name: "debt", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(10), Burst: 10, MaxDebt: 1000}
	a, b := w.servers[0][0], w.servers[1][0]
	var d admit.Decision
	if err := a.Decide(context.Background(), []admit.Charge{{Key: "k", Rule: rule, Cost: 1000, Debit: true}}, &d); err != nil {
		t.Fatal(err)
	}
	if d.Results[0].Allowed || d.Results[0].RetryAfter < 90*time.Second {
		t.Fatalf("a debit of 1,000 of a bucket of 10: %+v; want over, with the debt's repayment (about 99 s) as its retry", d.Results[0])
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if h, _ := a.Region(); h.Owed >= 990 {
			break
		}
		if time.Now().After(end) {
			h, _ := a.Region()
			t.Fatalf("the debt did not reach home: %+v", h)
		}
	}
	// a's server is gone (it never gives anything back); b and a new
	// server of a are refused while the debt lasts.
	prefix := a.Prefix()
	home, err := redisstore.Open(context.Background(), "redis://"+w.links[0].addr, &redisstore.Options{Prefix: prefix, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	again, err := redisstore.Open(context.Background(), "redis://"+w.regions[0].Addr, &redisstore.Options{Prefix: prefix, Timeout: time.Second, Home: home, Region: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	admitted := 0
	for range 20 {
		for _, s := range []*redisstore.Store{b, again} {
			if err := s.Decide(context.Background(), []admit.Charge{{Key: "k", Rule: rule, Cost: 1}}, &d); err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	// In that second the bucket refilled 10, all owed: a region may have
	// held a few units granted before the debt landed, at most its share.
	if admitted > 2 {
		t.Errorf("admitted %d in a second after a debt of 990 on a bucket of 10 a second", admitted)
	}
}

// TestRegionsRuleChange: a bucket held across regions whose rule changes
// keeps what it holds, as one Redis's does. Drained at 1/h burst 5, its
// burst raised to 50 admits nothing (it refilled to 45 when the home
// read its timeline under the new rule), and its rate raised to 1/s
// admits within seconds (it waited hours).
func TestRegionsRuleChange(t *testing.T) {
	w := newRegionWorld(t, 2, 1, redisstore.RefuseWhenCut)
	decide := func(s *redisstore.Store, rule *admit.Rule) bool {
		t.Helper()
		var d admit.Decision
		if err := s.Decide(context.Background(), []admit.Charge{{Key: "k", Rule: rule, Cost: 1}}, &d); err != nil {
			t.Fatal(err)
		}
		return d.Allowed
	}
	rule := &admit.Rule{Name: "calls", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 1, Per: time.Hour}, Burst: 5}
	a, b := w.servers[0][0], w.servers[1][0]
	// A fresh home fences new buckets for their burst's time (hours
	// here): let the key start long after, as TestHomeGiveBacksOnce does.
	home := redisstore.HomeKey(a, admit.Charge{Key: "k", Rule: rule})
	if _, err := redistest.Command(w.home.Addr, "HSET", home, "tat", "0", "gen", "1"); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for deadline := time.Now().Add(10 * time.Second); admitted < 5 && time.Now().Before(deadline); {
		if decide(a, rule) {
			admitted++
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if admitted != 5 {
		t.Fatalf("admitted %d of a fresh burst of 5", admitted)
	}
	wider := &admit.Rule{Name: "calls", Algorithm: admit.TokenBucket, Rate: admit.Rate{N: 1, Per: time.Hour}, Burst: 50}
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		for _, s := range []*redisstore.Store{a, b} {
			if decide(s, wider) {
				t.Fatal("the burst raised from 5 to 50 under a drained key: admitted; want refused, the key holds nothing")
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	faster := &admit.Rule{Name: "calls", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(1), Burst: 5}
	for deadline := time.Now().Add(10 * time.Second); !decide(b, faster); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the rate raised from 1/h to 1/s: nothing admitted in 10s")
		}
	}

	// A fixed window spent, its limit raised: the region asks the home
	// again (it had been told the window was spent until its end), and
	// gets the difference, no more. The window is one that ends minutes
	// from now at the earliest.
	window := time.Hour
	for m := 61; time.Now().Add(2*time.Minute).UnixMicro()/window.Microseconds() != time.Now().UnixMicro()/window.Microseconds(); m++ {
		window = time.Duration(m) * time.Minute
	}
	count := func(s *redisstore.Store, limit int64, tries int) int {
		t.Helper()
		r := &admit.Rule{Name: "window", Algorithm: admit.FixedWindow, Limit: limit, Window: window}
		n := 0
		for range tries {
			var d admit.Decision
			if err := s.Decide(context.Background(), []admit.Charge{{Key: "w", Rule: r, Cost: 1}}, &d); err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				n++
			} else {
				time.Sleep(20 * time.Millisecond)
			}
		}
		return n
	}
	if n := count(a, 3, 20); n != 3 {
		t.Fatalf("admitted %d of a window of 3", n)
	}
	if n := count(a, 6, 50); n != 3 {
		t.Errorf("the limit raised from 3 to 6 of a spent window: admitted %d, want 3", n)
	}
	// A refusal of the spent window says when it ends (it said 0).
	r := &admit.Rule{Name: "window", Algorithm: admit.FixedWindow, Limit: 6, Window: window}
	var d admit.Decision
	if err := a.Decide(context.Background(), []admit.Charge{{Key: "w", Rule: r, Cost: 1}}, &d); err != nil {
		t.Fatal(err)
	}
	ends := time.UnixMicro(time.Now().UnixMicro() - time.Now().UnixMicro()%window.Microseconds() + window.Microseconds())
	if d.Allowed || d.RetryAfter < time.Until(ends)-5*time.Second || d.RetryAfter > time.Until(ends)+time.Second || d.Results[0].ResetAfter < d.RetryAfter {
		t.Errorf("a refusal of a spent window ending in %v: retry %v, reset %v; want both the window's end", time.Until(ends), d.RetryAfter, d.Results[0].ResetAfter)
	}
}

// TestRegionsReloadsKeepBuckets: a rule compiled anew with the same
// parameters, as every reload and catalog change does, is the same rule
// to a region's servers, and a rule whose burst changes keeps the units
// its region was granted: a bucket decided through a fresh copy every
// 100 ms admits as it does under one. (It once lost about a token per
// copy, 2 of 20 admitted in 10 s under no-op reloads every 150 ms: units
// not yet due went home at each change and came back later still; with
// the burst flipping, none were admitted.)
func TestRegionsReloadsKeepBuckets(t *testing.T) {
	for _, flips := range []bool{false, true} {
		name := "same rule"
		if flips {
			name = "burst flips between 1 and 2"
		}
		t.Run(name, func(t *testing.T) {
			w := newRegionWorld(t, 2, 1, redisstore.RefuseWhenCut)
			var cur atomic.Pointer[admit.Rule]
			n := int64(0)
			fresh := func() {
				n++
				burst := int64(1)
				if flips {
					burst += n % 2
				}
				cur.Store(&admit.Rule{Name: "calls", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(4), Burst: burst})
			}
			fresh()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					case <-time.After(100 * time.Millisecond):
						fresh()
					}
				}
			}()
			var admitted atomic.Int64
			start := time.Now()
			for _, ss := range w.servers {
				s := ss[0]
				wg.Add(1)
				go func() {
					defer wg.Done()
					var d admit.Decision
					for {
						select {
						case <-stop:
							return
						case <-time.After(20 * time.Millisecond):
						}
						if err := s.Decide(context.Background(), []admit.Charge{{Key: "k", Rule: cur.Load(), Cost: 1}}, &d); err == nil && d.Allowed {
							admitted.Add(1)
						}
					}
				}()
			}
			time.Sleep(5 * time.Second)
			close(stop)
			wg.Wait()
			elapsed := time.Since(start)
			got := admitted.Load()
			t.Logf("4/s through a fresh copy every 100 ms, from two regions: %d admitted in %v", got, elapsed.Round(time.Millisecond))
			// The home fences a new bucket for τ + lookahead (0.5 s or
			// 0.75 s); then 4 a second, at most the larger burst + 4/s · t;
			// at least most of it.
			if most := 2 + 4*elapsed.Seconds(); float64(got) > most {
				t.Errorf("%d admitted, more than burst + rate·t = %.1f", got, most)
			}
			if got < 12 {
				t.Errorf("%d admitted in %v of 4/s; want at least 12: the changes cost the bucket its tokens", got, elapsed)
			}
		})
	}
}

// TestRegionConformance: a store with a home, on a real home Redis and a
// region's, runs the store suite's real-clock hammers of the algorithms
// regions hold, and admits nothing past any limit. Its other promises —
// how soon it admits — are the region tests' above: units wait in the
// pool and at home, so a region refuses before a bucket would.
func TestRegionConformance(t *testing.T) {
	home, region := redistest.Start(t), redistest.Start(t)
	storetest.RunUpperBounds(t, func(t *testing.T, clock func() time.Time) admit.Store {
		if clock != nil {
			t.Fatal("a store with a home reads the real clock")
		}
		prefix := newPrefix()
		h, err := redisstore.Open(context.Background(), "redis://"+home.Addr, &redisstore.Options{Prefix: prefix, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		s, err := redisstore.Open(context.Background(), "redis://"+region.Addr, &redisstore.Options{Prefix: prefix, Timeout: 5 * time.Second, Home: h, Region: "a"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(); h.Close() })
		return s
	})
}
