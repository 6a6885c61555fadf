package server

import (
	"fmt"
	"sync"
	"testing"

	"github.com/admitdev/admit/policy"
)

// TestAcquireBookedIsAdmitted: waiters whose capacity was booked are
// answered 200 when their time comes, however far below zero the bookings
// after them keep the bucket (it once answered them 429 from a look at
// the levels, charged all the same); those it could not book are 429 and
// charged nothing.
func TestAcquireBookedIsAdmitted(t *testing.T) {
	spec := &policy.Spec{
		Tiers: map[string]policy.TierSpec{
			"t":    {Rules: []policy.RuleSpec{tb("tenant", "tenant", nil, "100/s", 1)}},
			"slow": {Rules: []policy.RuleSpec{tb("tenant", "tenant", nil, "1/h", 1)}},
		},
		Tenants: map[string]policy.TenantSpec{"acme": {Tier: "t"}, "slow": {Tier: "slow"}},
	}
	h := start(t, spec, "")
	const n = 20 // 20 tokens take 190 ms to come, well within the 1.5 s wait
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = h.do("POST", "/v1/acquire", `{"tenant":"acme","max_wait_ms":1500}`).status
		}()
	}
	wg.Wait()
	for i, c := range codes {
		if c != 200 {
			t.Errorf("waiter %d: %d, want 200 (its booking was charged)", i, c)
		}
	}
	// A waiter the bucket cannot book within its wait is refused and
	// charged nothing: on a bucket of 1 an hour, spent, the time until it
	// is full again does not grow across a refused acquire.
	h.want(h.do("POST", "/v1/acquire", `{"tenant":"slow","max_wait_ms":0}`), 200, "the slow bucket's token")
	full := func() float64 {
		a := h.do("GET", "/v1/admin/state?tenant=slow", "")
		return a.body["buckets"].([]any)[0].(map[string]any)["reset_after_ms"].(float64)
	}
	before := full()
	h.want(h.do("POST", "/v1/acquire", `{"tenant":"slow","max_wait_ms":1000}`), 429, "an acquire that cannot wait an hour")
	if after := full(); after > before {
		t.Errorf("the bucket is full again in %v ms after a refused acquire, %v before: the refusal was charged", after, before)
	}
}

// TestAcquireSharedByClass: waiters of a limit tenants share are served by
// their tenants' shares: a tenant with five waiters gets all five through
// while another keeps a hundred waiting on the same limit, which has room
// for about twenty of them in the time they wait, and no waiter is
// answered 200 beyond what the limit admits.
func TestAcquireSharedByClass(t *testing.T) {
	spec := &policy.Spec{
		Global: []policy.RuleSpec{tb("global", "global", nil, "20/s", 2)},
		Tiers:  map[string]policy.TierSpec{"t": {}},
		Tenants: map[string]policy.TenantSpec{
			"greedy": {Tier: "t"}, "light": {Tier: "t"},
		},
	}
	h := start(t, spec, "", func(o *Options) { o.ServiceTokens = []string{"backend"} })
	type got struct {
		tenant string
		status int
	}
	out := make(chan got, 105)
	var wg sync.WaitGroup
	ask := func(tenant string, n int) {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a := h.do("POST", "/v1/acquire", fmt.Sprintf(`{"tenant":%q,"max_wait_ms":1500}`, tenant), "Authorization", "Bearer backend")
				out <- got{tenant, a.status}
			}()
		}
	}
	ask("greedy", 100)
	ask("light", 5)
	wg.Wait()
	close(out)
	admitted := map[string]int{}
	for g := range out {
		if g.status == 200 {
			admitted[g.tenant]++
		} else if g.status != 429 {
			t.Errorf("%s's waiter: %d", g.tenant, g.status)
		}
	}
	if admitted["light"] != 5 {
		t.Errorf("the light tenant got %d of its 5 waiters through (greedy: %d), want all: its share is half of 20/s", admitted["light"], admitted["greedy"])
	}
	// At most the burst and the refill of the waits (1.5 s at most, and
	// the time the requests took to arrive, well under a second).
	if total := admitted["light"] + admitted["greedy"]; total > 2+20*3 {
		t.Errorf("%d waiters admitted on a limit of 2 + 20/s within 3 s", total)
	}
}

// TestSharedRemainingToThePlatformOnly: what a limit tenants share holds
// tells how busy the other tenants are; an untrusted caller's answer says
// only what its own class may take.
func TestSharedRemainingToThePlatformOnly(t *testing.T) {
	spec := &policy.Spec{
		Global:  []policy.RuleSpec{tb("global", "global", nil, "100/s", 10)},
		Tiers:   map[string]policy.TierSpec{"t": {}},
		Tenants: map[string]policy.TenantSpec{"acme": {Tier: "t"}},
	}
	h := start(t, spec, "", func(o *Options) { o.ServiceTokens = []string{"backend"} })
	for _, tc := range []struct {
		who     string
		headers []string
		want    bool
	}{
		{"anonymous", nil, false},
		{"acme without a key", nil, false},
		{"the backend", []string{"Authorization", "Bearer backend"}, true},
	} {
		body := `{"cost":0}`
		if tc.who != "anonymous" {
			body = `{"tenant":"acme","cost":0}`
		}
		a := h.do("POST", "/v1/check", body, tc.headers...)
		rule := a.body["rules"].([]any)[0].(map[string]any)
		if _, ok := rule["shared_remaining"]; ok != tc.want {
			t.Errorf("%s: shared_remaining shown %v, want %v: %s", tc.who, ok, tc.want, a.raw)
		}
		if _, ok := rule["remaining"]; !ok {
			t.Errorf("%s: no remaining: %s", tc.who, a.raw)
		}
	}
}
