package limitador

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/storetest"
	"github.com/admitdev/admit/yamlconf"
)

// clock is a stopped clock the tests move forward, from noon of
// storetest.Epoch.
type clock struct {
	*storetest.Clock
	at time.Duration
}

func (c *clock) add(d time.Duration) {
	c.at += d
	c.Set(c.at)
}

func newLimiter(t *testing.T, file string) (*Limiter, *clock) {
	t.Helper()
	c := &clock{Clock: storetest.NewClock()}
	c.add(12 * time.Hour)
	st := memstore.New(&memstore.Options{Clock: c.Now})
	t.Cleanup(func() { st.Close() })
	ls, err := Parse("limits.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(Options{Decider: policy.NewDecider(st, 1), Limits: ls, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	return l, c
}

// desc is one descriptor of the given key, value pairs.
func desc(kv ...string) []map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return []map[string]string{m}
}

func decide(t *testing.T, l *Limiter, mode Mode, ns string, ds []map[string]string, delta uint64) Result {
	t.Helper()
	r, err := l.Decide(context.Background(), mode, ns, ds, delta, true)
	if err != nil {
		t.Fatalf("%v %s: %v", mode, ns, err)
	}
	return r
}

// admitted counts how many of n check-and-reports of delta are admitted.
func admitted(t *testing.T, l *Limiter, ns string, ds []map[string]string, n int, delta uint64) int {
	t.Helper()
	k := 0
	for range n {
		if !decide(t, l, CheckAndReport, ns, ds, delta).Limited {
			k++
		}
	}
	return k
}

const perUser = `
- namespace: app
  max_value: 2
  seconds: 60
  name: per-user
  conditions: ["descriptors[0]['req.method'] == 'GET'"]
  variables: ["descriptors[0].user"]
`

func TestCountersPerVariable(t *testing.T) {
	l, _ := newLimiter(t, perUser)
	if n := admitted(t, l, "app", desc("req.method", "GET", "user", "alice"), 5, 1); n != 2 {
		t.Fatalf("alice: %d admitted, want 2", n)
	}
	if n := admitted(t, l, "app", desc("req.method", "GET", "user", "bob"), 5, 1); n != 2 {
		t.Fatalf("bob has a counter of his own: %d admitted, want 2", n)
	}
	// A condition not met, or a variable's entry missing: the limit does
	// not apply.
	if n := admitted(t, l, "app", desc("req.method", "POST", "user", "alice"), 5, 1); n != 5 {
		t.Fatalf("POST: %d admitted, want 5", n)
	}
	if n := admitted(t, l, "app", desc("req.method", "GET"), 5, 1); n != 5 {
		t.Fatalf("no user entry: %d admitted, want 5", n)
	}
	if n := admitted(t, l, "app", nil, 3, 1); n != 3 {
		t.Fatalf("no descriptor: %d admitted, want 3", n)
	}
	if n := admitted(t, l, "other", desc("req.method", "GET", "user", "alice"), 5, 1); n != 5 {
		t.Fatalf("another namespace: %d admitted, want 5", n)
	}
	r := decide(t, l, CheckAndReport, "app", desc("req.method", "GET", "user", "alice"), 1)
	if !r.Limited || r.LimitName != "per-user" {
		t.Fatalf("refusal = %+v, want limited by per-user", r)
	}
}

func TestWindowStartsAtFirstHit(t *testing.T) {
	l, c := newLimiter(t, perUser)
	alice := desc("req.method", "GET", "user", "alice")
	c.add(40 * time.Second) // 12:00:40, not a minute's boundary
	if n := admitted(t, l, "app", alice, 3, 1); n != 2 {
		t.Fatalf("%d admitted, want 2", n)
	}
	c.add(59 * time.Second) // 12:01:39: the window of 12:00:40 still runs
	if r := decide(t, l, CheckAndReport, "app", alice, 1); !r.Limited {
		t.Fatal("admitted 59 s after the first hit")
	}
	if got := r(l, alice).Counters[0].ExpiresIn; got != time.Second {
		t.Fatalf("expires in %v, want 1s", got)
	}
	c.add(time.Second) // 12:01:40: a window after the first hit
	res := decide(t, l, CheckAndReport, "app", alice, 1)
	if res.Limited || res.Counters[0].Remaining != 1 || res.Counters[0].ExpiresIn != time.Minute {
		t.Fatalf("new window: %+v, want admitted with 1 left for a minute", res)
	}
}

// r reads a counter's state with a check of nothing.
func r(l *Limiter, ds []map[string]string) Result {
	res, _ := l.Decide(context.Background(), Check, "app", ds, 0, true)
	return res
}

func TestSeveralLimitsAllOrNothing(t *testing.T) {
	l, _ := newLimiter(t, `
- {namespace: api, max_value: 5, seconds: 60, conditions: [], variables: []}
- {namespace: api, max_value: 2, seconds: 1, name: burst, conditions: [], variables: ["descriptors[0].user"]}
`)
	ds := desc("user", "u")
	if n := admitted(t, l, "api", ds, 4, 1); n != 2 {
		t.Fatalf("%d admitted, want 2 (the burst)", n)
	}
	res := decide(t, l, Check, "api", nil, 1)
	if res.Limited {
		t.Fatal("the namespace limit alone is not over")
	}
	// The refused requests counted on no limit: 3 of 5 are left.
	for _, u := range []string{"v", "w"} {
		if res := decide(t, l, CheckAndReport, "api", desc("user", u), map[string]uint64{"v": 2, "w": 1}[u]); res.Limited {
			t.Fatalf("%s fits what is left: %+v", u, res)
		}
	}
	if res = decide(t, l, CheckAndReport, "api", desc("user", "x"), 1); !res.Limited || res.LimitName != "" {
		t.Fatalf("the namespace limit (unnamed) refuses: %+v", res)
	}
	// The most restrictive counter comes first in the headers.
	if res.Counters[0].Remaining > res.Counters[1].Remaining {
		t.Fatalf("counters %+v", res.Counters)
	}
}

func TestDeltas(t *testing.T) {
	l, _ := newLimiter(t, `
- {namespace: n, max_value: 10, seconds: 60, conditions: [], variables: []}
`)
	if res := decide(t, l, CheckAndReport, "n", nil, 11); !res.Limited || res.Counters[0].Remaining != 0 {
		t.Fatalf("a delta past max_value is refused: %+v", res)
	}
	if n := admitted(t, l, "n", nil, 4, 3); n != 3 {
		t.Fatalf("deltas of 3: %d admitted, want 3", n)
	}
	if res := decide(t, l, CheckAndReport, "n", nil, 1); res.Limited || res.Counters[0].Remaining != 0 {
		t.Fatalf("the last one fits: %+v", res)
	}
	// A delta of 0 is admitted at the limit, and counts nothing.
	if res := decide(t, l, CheckAndReport, "n", nil, 0); res.Limited {
		t.Fatalf("delta 0: %+v", res)
	}
}

func TestCheckAndReport(t *testing.T) {
	l, _ := newLimiter(t, `
- {namespace: n, max_value: 3, seconds: 60, conditions: [], variables: ["descriptors[0].k"]}
`)
	ds := desc("k", "a")
	for range 5 {
		if decide(t, l, Check, "n", ds, 1).Limited {
			t.Fatal("a check counts nothing")
		}
	}
	decide(t, l, Report, "n", ds, 5) // past the limit: a report is never refused
	if res := decide(t, l, Check, "n", ds, 0); !res.Limited {
		t.Fatalf("5 reported of 3: even a check of nothing is over, as Limitador's: %+v", res)
	}
	if res := decide(t, l, Check, "n", desc("k", "b"), 3); res.Limited {
		t.Fatal("b's counter is its own")
	}
	cs, _, err := l.Counters(context.Background(), "n")
	if err != nil || len(cs) != 1 || cs[0].Variables["descriptors[0].k"] != "a" || cs[0].Remaining != 0 {
		t.Fatalf("counters %+v %v", cs, err)
	}
}

func TestUnconditionalAndSpecialLimits(t *testing.T) {
	l, _ := newLimiter(t, `
- {namespace: zero, max_value: 0, seconds: 60, conditions: [], variables: []}
- {namespace: instant, max_value: 2, seconds: 0, conditions: [], variables: []}
`)
	if res := decide(t, l, CheckAndReport, "zero", nil, 1); !res.Limited {
		t.Fatal("max_value 0 admits nothing")
	}
	if res := decide(t, l, CheckAndReport, "zero", nil, 0); res.Limited {
		t.Fatal("max_value 0 admits a delta of 0, as 0 ≥ 0 + 0")
	}
	if n := admitted(t, l, "instant", nil, 10, 2); n != 10 {
		t.Fatalf("seconds 0 forgets every hit: %d of 10", n)
	}
	if res := decide(t, l, CheckAndReport, "instant", nil, 3); !res.Limited {
		t.Fatal("seconds 0 still refuses more than max_value at once")
	}
}

func TestReloadKeepsCounters(t *testing.T) {
	l, _ := newLimiter(t, perUser)
	alice := desc("req.method", "GET", "user", "alice")
	admitted(t, l, "app", alice, 2, 1)
	ls, err := Parse("limits.yaml", []byte(strings.Replace(perUser, "max_value: 2", "max_value: 3", 1)))
	if err != nil {
		t.Fatal(err)
	}
	l.SetLimits(ls)
	if n := admitted(t, l, "app", alice, 3, 1); n != 1 {
		t.Fatalf("after max_value 2 → 3: %d admitted, want 1 (the count kept)", n)
	}
	// Another condition is another limit, with counters of its own.
	ls, err = Parse("limits.yaml", []byte(strings.Replace(perUser, "'GET'", "'GET' && true", 1)))
	if err != nil {
		t.Fatal(err)
	}
	l.SetLimits(ls)
	if n := admitted(t, l, "app", alice, 3, 1); n != 2 {
		t.Fatalf("a changed condition: %d admitted, want 2", n)
	}
	if st := l.Status(); st.ConfigVersion != 2 {
		t.Fatalf("status %+v", st)
	}
}

func TestCELSemantics(t *testing.T) {
	l, _ := newLimiter(t, `
- namespace: n
  max_value: 1
  seconds: 60
  name: mine
  conditions:
    - "limit.name == 'mine'"
    - "descriptors.exists(d, d.tier == 'free')"
  variables: ["int(descriptors[0].n) * 2", "descriptors[0].tier"]
- {namespace: n, max_value: 1, seconds: 60, conditions: ["unknown == 'x'"], variables: []}
- {namespace: n, max_value: 1, seconds: 60, conditions: [], variables: ["limit.name"]}
- {namespace: bad, max_value: 1, seconds: 60, conditions: ["descriptors[0].a"], variables: []}
`)
	ds := desc("tier", "free", "n", "21")
	res := decide(t, l, CheckAndReport, "n", ds, 1)
	// Only the first applies: an unknown identifier makes a condition
	// false, and a variable reading limit does not resolve.
	if res.Applied != 1 || res.Counters[0].Variables["int(descriptors[0].n) * 2"] != "42" {
		t.Fatalf("%+v", res)
	}
	if !decide(t, l, CheckAndReport, "n", ds, 1).Limited {
		t.Fatal("the counter of n=21, tier=free is over")
	}
	if decide(t, l, CheckAndReport, "n", desc("tier", "free", "n", "20"), 1).Limited {
		t.Fatal("n=20 is another counter")
	}
	// A condition that is not a bool is an error naming the limit.
	_, err := l.Decide(context.Background(), CheckAndReport, "bad", desc("a", "x"), 1, false)
	if admit.ErrorCode(err) != admit.CodeInvalid || !strings.Contains(err.Error(), "descriptors[0].a") {
		t.Fatalf("err = %v", err)
	}
	// So is a variable that fails on the request's value.
	_, err = l.Decide(context.Background(), CheckAndReport, "n", desc("tier", "free", "n", "abc"), 1, false)
	if admit.ErrorCode(err) != admit.CodeInvalid {
		t.Fatalf("int('abc'): err = %v", err)
	}
}

func TestFormatFloat(t *testing.T) {
	for f, want := range map[float64]string{2: "2", 0.5: "0.5", 1e21: "1000000000000000000000", -3.25: "-3.25", 0.1: "0.1"} {
		if got := formatFloat(f); got != want {
			t.Errorf("formatFloat(%v) = %q, want %q", f, got, want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"", "the file is empty"},
		{"{a: 1}", "1:1: a limits file is a list of limits"},
		{"- {namespace: n, max_value: 1, seconds: 1, conditions: []}", "1:3: [0]: missing field variables"},
		{"- {namespace: n, max_value: x, seconds: 1, conditions: [], variables: []}", "1:29: [0].max_value: want a whole number"},
		{"- {namespace: n, max_value: 1, seconds: 1, conditions: ['a =='], variables: []}", "1:57: [0].conditions[0]: \"a ==\" is not CEL"},
		{"- {namespace: n, max_value: 1, seconds: 1, conditions: [], variables: [], algorithm: leaky}", "[0]: algorithm \"leaky\""},
		{"- {namespace: n, max_value: 1, seconds: 1, conditions: [], variables: [], algorithm: quota, period: fortnight}", "period \"fortnight\""},
		{"- {namespace: n, max_value: 1, seconds: 1, conditions: [], variables: [], period: day}", "a quota's"},
		{"- {namespace: n, max_value: 1, seconds: 1, conditions: [], variables: []}\n- {namespace: n, namespace: m}", "duplicate key"},
	} {
		_, err := Parse("f.yaml", []byte(tc.file))
		var ye yamlconf.Errors
		if !errors.As(err, &ye) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want %q", tc.file, err, tc.want)
		}
	}
}

func TestParseAsLimitadorReads(t *testing.T) {
	ls, err := Parse("f.yaml", []byte(`---
- namespace: test_namespace
  max_value: 1000000
  seconds: 60
  conditions:
  variables:
  "$comment": ignored
- namespace: test_namespace
  max_value: 5
  seconds: 60
  conditions: ["descriptors[0]['req.method'] == 'POST'", "descriptors[0]['req.method'] == 'POST'"]
  variables: ["descriptors[0]['user_id']"]
- namespace: test_namespace
  max_value: 50
  seconds: 60
  conditions: []
  variables: []
`))
	if err != nil {
		t.Fatal(err)
	}
	lims := ls.Namespace("test_namespace")
	// The third counts as the first (max_value aside): one is kept.
	if len(lims) != 2 || len(lims[1].Conditions) != 1 || len(ls.Warnings) != 2 {
		t.Fatalf("limits %+v, warnings %q", lims, ls.Warnings)
	}
}

func TestHeaders(t *testing.T) {
	l, _ := newLimiter(t, `
- {namespace: n, max_value: 5, seconds: 60, conditions: [], variables: []}
- {namespace: n, max_value: 2, seconds: 10, name: 'say "hi"', conditions: [], variables: []}
`)
	res := decide(t, l, CheckAndReport, "n", nil, 1)
	h := map[string][]string{}
	setHeaders(h, HeadersDraft03|HeadersIETF, res.Counters)
	want := map[string]string{
		"X-RateLimit-Limit":     `2, 2;w=10;name="say 'hi'", 5;w=60`,
		"X-RateLimit-Remaining": "1",
		"X-RateLimit-Reset":     "9",
	}
	for k, v := range want {
		if got := h[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if p := h["RateLimit-Policy"]; len(p) != 1 || !strings.HasPrefix(p[0], `"say \"hi\"";q=2;w=10;pk=:`) {
		t.Errorf("RateLimit-Policy = %q", p)
	}
	if p := h["RateLimit"]; len(p) != 1 || !strings.HasPrefix(p[0], `"say \"hi\"";r=1;t=10;pk=:`) {
		t.Errorf("RateLimit = %q", p)
	}
	for in, want := range map[string]Headers{"NONE": HeadersNone, "DRAFT_VERSION_03": HeadersDraft03, "ietf": HeadersIETF, "DRAFT_VERSION_03,IETF": HeadersDraft03 | HeadersIETF} {
		if got, err := ParseHeaders(in); err != nil || got != want {
			t.Errorf("ParseHeaders(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseHeaders("DRAFT_04"); err == nil {
		t.Error("DRAFT_04 accepted")
	}
}

func TestOtherAlgorithms(t *testing.T) {
	l, c := newLimiter(t, `
- {namespace: tb, max_value: 10, seconds: 10, algorithm: token_bucket, conditions: [], variables: []}
- {namespace: sw, max_value: 4, seconds: 10, algorithm: sliding_window, conditions: [], variables: []}
- {namespace: q, max_value: 2, seconds: 1, algorithm: quota, period: day, time_zone: Europe/Paris, conditions: [], variables: []}
`)
	if n := admitted(t, l, "tb", nil, 12, 1); n != 10 {
		t.Fatalf("token bucket: %d of its burst 10", n)
	}
	c.add(time.Second) // one token back
	if n := admitted(t, l, "tb", nil, 3, 1); n != 1 {
		t.Fatalf("token bucket after 1 s: %d, want 1", n)
	}
	if n := admitted(t, l, "sw", nil, 6, 1); n != 4 {
		t.Fatalf("sliding window: %d, want 4", n)
	}
	if n := admitted(t, l, "q", nil, 3, 1); n != 2 {
		t.Fatalf("quota: %d, want 2", n)
	}
	c.add(11 * time.Hour) // 23:00 UTC is midnight in Paris in January
	if n := admitted(t, l, "q", nil, 3, 1); n != 2 {
		t.Fatalf("quota of the next Paris day: %d, want 2", n)
	}
}

func TestConcurrentExactBound(t *testing.T) {
	l, _ := newLimiter(t, `
- {namespace: n, max_value: 100, seconds: 60, conditions: [], variables: []}
- {namespace: n, max_value: 70, seconds: 60, conditions: [], variables: ["descriptors[0].u"]}
`)
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := "a"
			if g%2 == 1 {
				u = "b"
			}
			n := 0
			for range 50 {
				res, err := l.Decide(context.Background(), CheckAndReport, "n", desc("u", u), 1, false)
				if err != nil {
					t.Error(err)
					return
				}
				if !res.Limited {
					n++
				}
			}
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	if total != 100 {
		t.Fatalf("%d admitted of 800, want exactly 100", total)
	}
}

// TestExpressionCostBounded: a variable that loops over the request's
// descriptors cubed is stopped at the cost bound, as the request's error.
func TestExpressionCostBounded(t *testing.T) {
	l, _ := newLimiter(t, `
- {namespace: n, max_value: 1, seconds: 60, conditions: [], variables: ["size(descriptors.map(a, descriptors.map(b, descriptors.map(c, 1))))"]}
`)
	ds := make([]map[string]string, MaxDescriptors)
	for i := range ds {
		ds[i] = map[string]string{"k": "v"}
	}
	start := time.Now()
	_, err := l.Decide(context.Background(), CheckAndReport, "n", ds, 1, false)
	if admit.ErrorCode(err) != admit.CodeInvalid || !strings.Contains(err.Error(), "cost") {
		t.Fatalf("err = %v", err)
	}
	t.Logf("stopped after %v", time.Since(start))
}

// TestCounterKeyIsAKey: the counters' keys are admit.Key's encoding, which
// is injective, so no two counters share one.
func TestCounterKeyIsAKey(t *testing.T) {
	lim := &Limit{identity: "abc"}
	for _, values := range [][]string{nil, {""}, {"a"}, {"a", "bc"}, {strings.Repeat("x", 1234), "y:z"}} {
		sub := ""
		for _, v := range values {
			sub += strconv.Itoa(len(v)) + ":" + v
		}
		want := admit.Key{Scope: "limitador", Tenant: "ns/1", Subject: sub, Rule: "abc"}.String()
		if got := counterKey("ns/1", lim, values); got != want {
			t.Errorf("counterKey(%q) = %q, want %q", values, got, want)
		}
	}
}

// TestLimitadorFunctions: the functions Limitador's CEL has beyond the
// standard ones read as it reads them.
func TestLimitadorFunctions(t *testing.T) {
	req := &request{}
	req.reset([]map[string]string{{"method": "GET", "n": "7"}})
	for src, want := range map[string]bool{
		"['GET', 'HEAD'].contains(descriptors[0].method)":                                  true,
		"['PUT'].contains(descriptors[0].method)":                                          false,
		"descriptors[0].contains('method')":                                                true,
		"descriptors[0].method.contains('E')":                                              true,
		"b'abc'.contains(b'bc')":                                                           true,
		"max(1, 2) == 2 && min(1, 2) == 1":                                                 true,
		"max([3, 9, 4]) == 9 && min(5) == 5":                                               true,
		"max(int(descriptors[0].n), 3, 5) == 7":                                            true,
		"max(1.5, 2.5, 0.5) == 2.5":                                                        true,
		"max(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20) == 20": true,
		"max() == null && min([]) == null":                                                 true,
	} {
		e, err := compile(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		got, err := e.test(req)
		if err != nil || got != want {
			t.Errorf("%s = %v, %v; want %v", src, got, err, want)
		}
	}
}

// TestRedTeamParse holds what a red team found the parser took: a second
// YAML document dropped, numbers for strings, one id across namespaces.
func TestRedTeamParse(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"---\n- {namespace: a, max_value: 1, seconds: 1, conditions: [], variables: []}\n---\n- {namespace: b, max_value: 1, seconds: 1, conditions: [], variables: []}\n", "3:1: the file holds more than one YAML document"},
		{"- {namespace: 123, max_value: 1, seconds: 1, conditions: [], variables: []}", "want a string, not \"123\""},
		{"- {namespace: n, max_value: 1, seconds: 1, conditions: [true], variables: []}", "want a CEL expression, a string"},
	} {
		if _, err := Parse("f.yaml", []byte(tc.file)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want %q", tc.file, err, tc.want)
		}
	}
	ls, err := Parse("f.yaml", []byte(`
- {namespace: ida, id: shared, max_value: 5, seconds: 60, conditions: [], variables: []}
- {namespace: idb, id: shared, max_value: 3, seconds: 10, conditions: [], variables: ["descriptors[0].u"]}
- {namespace: idb, id: shared, max_value: 9, seconds: 60, conditions: [], variables: ["descriptors[0].u"]}
`))
	if err != nil || len(ls.Namespace("ida")) != 1 || len(ls.Namespace("idb")) != 2 || len(ls.Warnings) != 0 {
		t.Fatalf("limits of one id, %v: %d + %d, warnings %q", err, len(ls.Namespace("ida")), len(ls.Namespace("idb")), ls.Warnings)
	}
	if a, b := ls.Namespace("idb")[0].identity, ls.Namespace("idb")[1].identity; a == b {
		t.Fatalf("two windows of one id share the counters %q", a)
	}
}

// TestCounterIndexBounded: long values make fewer counters remembered,
// within MaxIndexBytes.
func TestCounterIndexBounded(t *testing.T) {
	x := newCounterIndex(1_000_000)
	now := time.Now()
	long := strings.Repeat("v", 64<<10)
	n := 0
	for i := range 2000 {
		if x.add("n", strconv.Itoa(i), "id", []string{long}, now, now.Add(time.Minute)) {
			n++
		}
	}
	if x.bytes > MaxIndexBytes || n == 2000 || n < 900 {
		t.Fatalf("%d remembered, %d bytes", n, x.bytes)
	}
	x.sweep(now.Add(time.Hour))
	if x.bytes != 0 || x.n != 0 {
		t.Fatalf("after their windows: %d counters, %d bytes", x.n, x.bytes)
	}
}

// TestRedTeamCounters holds what round two found of the counters: a
// delta of 0 made a counter to list, and limits of one id keyed by other
// variables shared one.
func TestRedTeamCounters(t *testing.T) {
	l, _ := newLimiter(t, `
- {namespace: n, max_value: 5, seconds: 60, conditions: [], variables: ["descriptors[0].u"]}
- {namespace: ids, id: X, max_value: 3, seconds: 60, conditions: [], variables: ["descriptors[0].u"]}
- {namespace: ids, id: X, max_value: 3, seconds: 60, conditions: [], variables: ["descriptors[0].v"]}
`)
	for range 3 {
		decide(t, l, CheckAndReport, "n", desc("u", "zero"), 0)
	}
	if cs, _, err := l.Counters(context.Background(), "n"); err != nil || len(cs) != 0 {
		t.Fatalf("after deltas of 0: %+v %v", cs, err)
	}
	if n := admitted(t, l, "ids", desc("u", "a"), 4, 1); n != 3 {
		t.Fatalf("u=a: %d admitted, want 3", n)
	}
	if n := admitted(t, l, "ids", desc("v", "a"), 4, 1); n != 3 {
		t.Fatalf("v=a is another counter of id X: %d admitted, want 3", n)
	}
}
