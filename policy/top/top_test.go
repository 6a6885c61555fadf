package top

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/policy"
)

// TestSketchBound feeds a skewed stream and checks the space-saving
// bounds: every identifier with more than n/Capacity hits is held, and
// each held count is within its error of the truth.
func TestSketchBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := newSketch()
	truth := map[string]int64{}
	var n int64
	for range 100_000 {
		var k string
		if rng.IntN(2) == 0 {
			k = fmt.Sprint("heavy-", rng.IntN(10)) // half the hits on ten callers
		} else {
			k = fmt.Sprint("spray-", rng.IntN(50_000))
		}
		s.add(k, 1)
		truth[k]++
		n++
	}
	held := map[string]entry{}
	for _, e := range s.entries {
		held[e.key] = e
		if tr := truth[e.key]; e.count < tr || e.count-e.error > tr {
			t.Errorf("%s: count %d, error %d; true count %d", e.key, e.count, e.error, tr)
		}
		if e.error > n/Capacity {
			t.Errorf("%s: error %d past n/m = %d", e.key, e.error, n/Capacity)
		}
	}
	for k, tr := range truth {
		if tr > n/Capacity {
			if _, ok := held[k]; !ok {
				t.Errorf("%s has %d hits (> n/m = %d) and is not held", k, tr, n/Capacity)
			}
		}
	}
	got, hits := merge([]*sketch{s}, 10)
	if hits != n || len(got) != 10 {
		t.Fatalf("merge: %d callers, %d hits", len(got), hits)
	}
	for _, c := range got {
		if len(c.Key) < 6 || c.Key[:6] != "heavy-" {
			t.Errorf("the top ten hold %q", c.Key)
		}
	}
}

// TestMergeBounds merges two servers' sketches: counts add, and an
// identifier one sketch lacks may have had that sketch's least count.
func TestMergeBounds(t *testing.T) {
	a, b := newSketch(), newSketch()
	a.add("x", 10)
	b.add("x", 5)
	b.add("y", 7)
	got, hits := merge([]*sketch{a, b}, 10)
	if hits != 22 || len(got) != 2 || got[0].Key != "x" || got[0].Count != 15 || got[0].Error != 0 || got[1].Count != 7 {
		t.Fatalf("merge = %+v, %d", got, hits)
	}
	for i := range Capacity + 1 {
		a.add(fmt.Sprint("f", i), 3) // a is full: its least count is 3
	}
	got, _ = merge([]*sketch{a, b}, 1)
	if got[0].Key != "x" {
		t.Fatalf("top = %+v", got)
	}
	for _, c := range mergeAll(a, b) {
		if c.Key == "y" && c.Error < 3 {
			t.Errorf("y: error %d; a lacks it and its least count is 3", c.Error)
		}
	}
}

func mergeAll(s ...*sketch) []Caller {
	c, _ := merge(s, 1000)
	return c
}

func TestEncodeRoundTrip(t *testing.T) {
	r, a := newSketch(), newSketch()
	r.add("k1", 3)
	a.add("k2", 9)
	a.add("k3", 1)
	gr, ga, err := decodeMinute(encodeMinute(r, a))
	if err != nil || gr.hits != 3 || len(ga.entries) != 2 || ga.entries[0] != (entry{key: "k2", count: 9}) {
		t.Fatalf("round trip: %+v %+v %v", gr, ga, err)
	}
}

func FuzzDecodeMinute(f *testing.F) {
	s := newSketch()
	s.add("k", 2)
	f.Add(encodeMinute(s, s))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, a, err := decodeMinute(b)
		if err != nil {
			return
		}
		again, _, err := decodeMinute(encodeMinute(r, a))
		if err != nil || again.hits != r.hits {
			t.Fatalf("re-decoding failed: %v", err)
		}
	})
}

// TestObserve counts a policy's decisions, refused and admitted, by the
// identifiers of the rule's keys, over a window of minutes that a stopped
// clock moves.
func TestObserve(t *testing.T) {
	one := int64(1)
	p, err := policy.Compile(&policy.Spec{
		Global: []policy.RuleSpec{{Name: "per-ip", Scope: "ip", Algorithm: "fixed_window", Limit: &one, Window: "1h"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := New("s1", nil)
	now := time.Unix(1_800_000_000, 0)
	c.now = func() time.Time { return now }
	observe := func(ip string, allowed bool) {
		var res policy.Resolution
		if err := p.Resolve(&policy.Request{IP: ip, Cost: 1}, &res); err != nil {
			t.Fatal(err)
		}
		dec := admit.Decision{Allowed: allowed, Results: []admit.Result{{Rule: "per-ip", Allowed: allowed}}}
		c.Observe(&res, &dec, policy.Stored)
	}
	for range 5 {
		observe("192.0.2.1", false)
	}
	observe("192.0.2.2", false)
	observe("192.0.2.3", true)
	now = now.Add(3 * time.Minute)
	observe("192.0.2.2", false)
	top, err := c.Top(context.Background(), "per-ip", 5*time.Minute, 10)
	if err != nil {
		t.Fatal(err)
	}
	if top.RefusedTotal != 7 || len(top.Refused) != 2 || top.Refused[0] != (Caller{Key: "192.0.2.1", Scope: "ip", Value: "192.0.2.1", Count: 5}) ||
		top.Refused[1].Count != 2 || top.AdmittedTotal != 1 || top.Admitted[0].Value != "192.0.2.3" {
		t.Fatalf("top = %+v", top)
	}
	// Two minutes' window: the first minute's are out.
	top, _ = c.Top(context.Background(), "per-ip", 2*time.Minute, 10)
	if top.RefusedTotal != 1 || top.Refused[0].Value != "192.0.2.2" {
		t.Fatalf("2m window: %+v", top)
	}
	if top.WindowS != 120 {
		t.Fatalf("window_s %d", top.WindowS)
	}
}

func TestParseKey(t *testing.T) {
	k := admit.Key{Scope: "user", Tenant: "acme", Subject: "bob:1", Action: "x", Rule: "r"}
	got, ok := parseKey(k.String())
	if !ok || got != k {
		t.Fatalf("parseKey = %+v, %v", got, ok)
	}
	for _, bad := range []string{"", "3:ab", "x:abc", "1:a1:b1:c1:d1:e+"} {
		if _, ok := parseKey(bad); ok {
			t.Errorf("parseKey(%q) ok", bad)
		}
	}
}

// BenchmarkObserve is the cost a decision pays for being counted.
func BenchmarkObserve(b *testing.B) {
	one := int64(1000)
	p, err := policy.Compile(&policy.Spec{
		Global: []policy.RuleSpec{{Name: "per-ip", Scope: "ip", Algorithm: "fixed_window", Limit: &one, Window: "1h"}},
	})
	if err != nil {
		b.Fatal(err)
	}
	c := New("s1", nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var res policy.Resolution
		if err := p.Resolve(&policy.Request{IP: "192.0.2.1", Cost: 1}, &res); err != nil {
			b.Fatal(err)
		}
		dec := admit.Decision{Allowed: true, Results: []admit.Result{{Rule: "per-ip", Allowed: true}}}
		for pb.Next() {
			c.Observe(&res, &dec, policy.Stored)
		}
	})
}

// TestMergeHoldsTheTruth: a caller one server's sketch evicted (a flood
// of one-off callers after it) and another's holds is merged to a range
// that holds its true count, and one surely heavy caller is listed before
// the one-off callers that took counters over.
func TestMergeHoldsTheTruth(t *testing.T) {
	s1, s2 := newSketch(), newSketch()
	s1.add("ey", 60)
	for i := range 5000 {
		s1.add(fmt.Sprint("one-", i), 1)
	}
	s1.add("fx", 160)
	s2.add("ey", 300)
	got, _ := merge([]*sketch{s1, s2}, Capacity)
	var ey *Caller
	for i := range got {
		if got[i].Key == "ey" {
			ey = &got[i]
		}
	}
	if ey == nil || ey.Count < 360 || ey.Count-ey.Error > 360 {
		t.Fatalf("ey: %+v; its true count 360 must be within [count-error, count]", ey)
	}
	if got[0].Key != "ey" || got[1].Key != "fx" {
		t.Fatalf("listed first: %+v, %+v; want ey, then fx", got[0], got[1])
	}
}
