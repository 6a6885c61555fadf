package httpx

import (
	"context"
	"crypto/sha256"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/sftest"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/units"
)

// params builds Params of key, value pairs.
func params(kv ...any) sftest.Params {
	var p sftest.Params
	for i := 0; i+1 < len(kv); i += 2 {
		p = append(p, sftest.Param{Key: kv[i].(string), Value: kv[i+1]})
	}
	return p
}

func pk(key string) []byte {
	sum := sha256.Sum256([]byte(key))
	return sum[:partitionBytes]
}

// TestSetHeaders: every non-shadow charge is an item of both fields with
// its quota, unit, window and partition, and what remains and when.
func TestSetHeaders(t *testing.T) {
	tenMin := int64(10)
	rules := []*policy.Rule{
		{Rule: admit.Rule{Name: "burst", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(2), Burst: 100, Initial: &tenMin}},
		{Rule: admit.Rule{Name: "slots", Algorithm: admit.Concurrency, Max: 5}},
		{Rule: admit.Rule{Name: "llm-tokens", Algorithm: admit.FixedWindow, Limit: 100000, Window: time.Minute}, Unit: units.UnitTokens},
		{Rule: admit.Rule{Name: "llm-spend", Algorithm: admit.FixedWindow, Limit: 5_000_000, Window: time.Hour}, Unit: units.UnitMoney},
		{Rule: admit.Rule{Name: "watching", Algorithm: admit.FixedWindow, Limit: 1, Window: time.Second, Shadow: true}},
		{Rule: admit.Rule{Name: "huge", Algorithm: admit.FixedWindow, Limit: 1 << 62, Window: time.Second}},
	}
	charges := []admit.Charge{{Key: "b\x00t1"}, {Key: "s\x00t1\x00u1"}, {Key: "k\x00t1"}, {Key: "m\x00t1"}, {Key: "w"}, {}}
	results := []admit.Result{
		{Rule: "burst", Allowed: true, Limit: 100, Remaining: 42, ResetAfter: 29*time.Second + 1},
		{Rule: "slots", Allowed: true, Limit: 5, Remaining: 4},
		{Rule: "llm-tokens", Allowed: true, Limit: 100000, Remaining: 99000, ResetAfter: 30 * time.Second},
		{Rule: "llm-spend", Allowed: false, Limit: 5_000_000, Remaining: -3, ResetAfter: time.Hour},
		{Rule: "watching", Allowed: false, Shadow: true, Limit: 1},
		{Rule: "huge", Allowed: true, Limit: 1 << 62, Remaining: 1 << 62},
	}
	h := http.Header{}
	SetHeaders(h, nil, rules, charges, results)
	policies, limits := sftest.RateLimitFields(t, h)
	want := map[string]sftest.Params{
		"burst":      params("q", int64(100), "w", int64(50), "pk", pk("b\x00t1")),
		"slots":      params("q", int64(5), "qu", "concurrent-requests", "pk", pk("s\x00t1\x00u1")),
		"llm-tokens": params("q", int64(100000), "qu", "admit-tokens", "w", int64(60), "pk", pk("k\x00t1")),
		"llm-spend":  params("q", int64(5_000_000), "qu", "admit-money", "w", int64(3600), "pk", pk("m\x00t1")),
		"huge":       params("q", int64(maxInteger), "w", int64(1)),
	}
	if !reflect.DeepEqual(policies, want) {
		t.Errorf("RateLimit-Policy: %s\n got %v\nwant %v", h.Get("RateLimit-Policy"), policies, want)
	}
	want = map[string]sftest.Params{
		"burst":      params("r", int64(42), "t", int64(30), "pk", pk("b\x00t1")),
		"slots":      params("r", int64(4), "t", int64(0), "pk", pk("s\x00t1\x00u1")),
		"llm-tokens": params("r", int64(99000), "t", int64(30), "pk", pk("k\x00t1")),
		"llm-spend":  params("r", int64(0), "t", int64(3600), "pk", pk("m\x00t1")),
		"huge":       params("r", int64(maxInteger), "t", int64(0)),
	}
	if !reflect.DeepEqual(limits, want) {
		t.Errorf("RateLimit: %s\n got %v\nwant %v", h.Get("RateLimit"), limits, want)
	}
	if got := AppendPolicy(nil, rules, charges, results); string(got) != h.Get("RateLimit-Policy") {
		t.Errorf("AppendPolicy = %s, want the field %s", got, h.Get("RateLimit-Policy"))
	}
	if got := AppendLimit(nil, rules, charges, results); string(got) != h.Get("RateLimit") {
		t.Errorf("AppendLimit = %s, want the field %s", got, h.Get("RateLimit"))
	}

	// Shadow charges alone set no field.
	h = http.Header{}
	SetHeaders(h, nil, rules[4:5], charges[4:5], results[4:5])
	if len(h) != 0 {
		t.Errorf("shadow charges only: set %v", h)
	}
}

// TestSetLimiterHeaders: a Limiter's decision names its limits, as
// Strings whatever their names hold, with the partitions of the keys it
// charged: one per caller for a limit per user, one for all for a global
// limit.
func TestSetLimiterHeaders(t *testing.T) {
	st := memstore.New(nil)
	defer st.Close()
	l, err := admit.NewLimiter(st,
		admit.Bucket(`per "user" \ é`, admit.PerSecond(1), 10).Per(admit.PerUser),
		admit.Concurrent("all", 3),
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	partitions := func(user string) map[string]sftest.Params {
		t.Helper()
		var d admit.Decision
		if err := l.Decide(ctx, admit.Who{User: user}, 1, &d); err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx, &d)
		h := http.Header{}
		SetLimiterHeaders(h, nil, l.Rules(), &d)
		policies, _ := sftest.RateLimitFields(t, h)
		if d.Key(0) == "" || d.Key(1) == "" {
			t.Fatalf("Decision.Key: %q, %q", d.Key(0), d.Key(1))
		}
		return policies
	}
	alice, bob := partitions("alice"), partitions("bob")
	const name = `per "user" \ ??` // é is two bytes past ASCII
	if _, ok := alice[name]; !ok {
		t.Fatalf("no %q in %v", name, alice)
	}
	if q, _ := alice["all"].Get("qu"); q != "concurrent-requests" {
		t.Errorf("all: qu %v, want concurrent-requests", q)
	}
	a, _ := alice[name].Get("pk")
	b, _ := bob[name].Get("pk")
	if reflect.DeepEqual(a, b) {
		t.Errorf("alice's and bob's buckets of a limit per user: one partition %x", a)
	}
	a, _ = alice["all"].Get("pk")
	b, _ = bob["all"].Get("pk")
	if a == nil || !reflect.DeepEqual(a, b) {
		t.Errorf("a global limit: partitions %x and %x, want one", a, b)
	}
}

// TestAppendAllocates: the fields are appended into a buffer that is
// large enough without allocating, partitions included.
func TestAppendAllocates(t *testing.T) {
	rules := []*policy.Rule{
		{Rule: admit.Rule{Name: "burst", Algorithm: admit.TokenBucket, Rate: admit.PerSecond(2), Burst: 100}},
		{Rule: admit.Rule{Name: "slots", Algorithm: admit.Concurrency, Max: 5}},
	}
	long := string(make([]byte, 300)) // a key too long for a conversion on the stack
	charges := []admit.Charge{{Key: long}, {Key: "s"}}
	results := []admit.Result{{Limit: 100, Remaining: 1}, {Limit: 5, Remaining: 1}}
	buf := make([]byte, 0, 1024)
	if n := testing.AllocsPerRun(100, func() {
		buf = AppendPolicy(buf[:0], rules, charges, results)
		buf = AppendLimit(buf[:0], rules, charges, results)
	}); n != 0 {
		t.Errorf("%v allocations, want 0", n)
	}
}
