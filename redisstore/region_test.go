package redisstore_test

import (
	"context"
	"io"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/redistest"
)

// admission is one admitted decision, at the time its answer was back.
type admission struct {
	at     time.Duration
	region int
}

// regionWorld is a home Redis and regions, each its own Redis with its
// servers (stores), and the home reached through a link that can be cut.
type regionWorld struct {
	home    *redistest.Server
	links   []*link
	servers [][]*redisstore.Store
}

func newRegionWorld(t *testing.T, regions, perRegion int, cut redisstore.CutPolicy) *regionWorld {
	t.Helper()
	w := &regionWorld{home: redistest.Start(t)}
	prefix := newPrefix()
	for i := 0; i < regions; i++ {
		reg := redistest.Start(t)
		l := newLink(t, w.home.Addr)
		w.links = append(w.links, l)
		var ss []*redisstore.Store
		for j := 0; j < perRegion; j++ {
			home, err := redisstore.Open(context.Background(), "redis://"+l.addr, &redisstore.Options{Prefix: prefix, Timeout: time.Second})
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
	ln     net.Listener
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
	target string
}

func newLink(t *testing.T, target string) *link {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &link{addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]bool{}, target: target}
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
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	return l
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
						err := s.Decide(context.Background(), []admit.Charge{{Key: "k", Rule: rule, Cost: 1}}, &d)
						at := time.Since(start)
						if err != nil {
							time.Sleep(time.Millisecond)
							continue
						}
						if d.Allowed {
							mu.Lock()
							out = append(out, admission{at, ri})
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

func TestRegionsNeverOver(t *testing.T) {
	w := newRegionWorld(t, 3, 2, redisstore.RefuseWhenCut)
	rule := &admit.Rule{Name: "global", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(400), Burst: 100}
	start := time.Now()
	stop := make(chan struct{})
	time.AfterFunc(6*time.Second, func() { close(stop) })
	adm := hammer(w, rule, []int{6, 2, 1}, start, stop)
	checkFromStart(t, adm, rule)
	var per [3]int
	for _, a := range adm {
		per[a.region]++
	}
	end := adm[len(adm)-1].at
	late := 0
	for _, a := range adm {
		if a.at >= 2*time.Second && a.at < 6*time.Second {
			late++
		}
	}
	t.Logf("from 2s to 6s: %d of %d", late, 1600)
	t.Logf("admitted %d (%v) by %v; exact bucket: %.0f", len(adm), per, end, 100+400*end.Seconds())
	for i, ss := range w.servers {
		for _, s := range ss {
			h, _ := s.Region()
			st := s.Health()
			t.Logf("region %d: %+v withdrawn %d expired %d lost %d refunded %d", i, h, st.Withdrawn, st.Expired, st.Lost, st.Refunded)
		}
	}
	_ = atomic.Int64{}
}
