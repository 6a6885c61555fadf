package attack

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/admitdev/admit/policy"
)

// The limits every tenant shares are divided among the tenants that want
// them (docs/security.md, "Shared limits"): each attack below once took a
// shared limit from everyone else.

// TestAnonymousCannotEmptyASharedLimit: a caller without a credential asks
// for the whole global bucket (burst 1,000, refilled 1 an hour) and then
// for halves of it, ten checks in all (once admitted: the bucket empty, the
// victim and the platform's backend acting for it refused for about 999
// hours). Alone, it takes at most the share ceiling of the bucket (half):
// a check above the ceiling is invalid (400), one within it over what the
// class may take is 429; the victim then finds its share.
func TestAnonymousCannotEmptyASharedLimit(t *testing.T) {
	s := serve(t, "", false)
	took := 0
	for cost := 1000; cost >= 1; cost /= 2 {
		a := s.do("POST", "/v1/check", fmt.Sprintf(`{"cost":%d}`, cost))
		switch {
		case a.status == http.StatusOK:
			took += cost
		case cost > 500 && a.status == http.StatusBadRequest && strings.Contains(a.raw, "share ceiling"):
		case cost <= 500 && a.status == http.StatusTooManyRequests:
		default:
			t.Fatalf("an anonymous check of %d: %d %s", cost, a.status, a.raw)
		}
	}
	report(t, "units of the global bucket (1,000) an anonymous caller took in 10 checks", took)
	if took > 500 {
		t.Errorf("an anonymous caller alone took %d of the global bucket's 1,000, want at most the share ceiling, 500", took)
	}
	victim := []string{"X-API-Key", "victim-key"}
	admitted := 0
	for range 20 {
		if a := s.do("POST", "/v1/check", `{"cost":5}`, victim...); a.status == http.StatusOK {
			admitted++
		}
	}
	for range 10 {
		if a := s.do("POST", "/v1/check", `{"tenant":"victim","cost":5}`, service...); a.status == http.StatusOK {
			admitted++
		}
	}
	report(t, "the victim's checks of 5 admitted after it (with its key, and through the backend)", admitted)
	if admitted != 30 {
		t.Errorf("the victim got %d of 30 checks of 5 through after an anonymous caller's, want all", admitted)
	}
}

// TestSharedLeasesHeldAndOwned: an anonymous caller asks for all 10 global
// export slots in one lease (once granted, and held for as long as it was
// renewed: every other tenant's leases 429). It holds at most the share
// ceiling (5): a lease of more is invalid (400), one more slot beside its
// 5 is 429. The victim takes its leases beside it, and no one but the
// caller that took a lease renews or releases it.
func TestSharedLeasesHeldAndOwned(t *testing.T) {
	s := serve(t, "", false)
	if a := s.do("POST", "/v1/leases", `{"resource":"export","cost":10}`); a.status != http.StatusBadRequest || !strings.Contains(a.raw, "share ceiling") {
		t.Fatalf("an anonymous lease of all 10 global slots: %d %s, want 400 naming the share ceiling", a.status, a.raw)
	}
	a := s.do("POST", "/v1/leases", `{"resource":"export","cost":5}`)
	if a.status != http.StatusCreated {
		t.Fatalf("an anonymous lease of 5 slots: %d %s", a.status, a.raw)
	}
	anon, _ := a.body["lease_id"].(string)
	if a := s.do("POST", "/v1/leases", `{"resource":"export","cost":1}`); a.status != http.StatusTooManyRequests {
		t.Fatalf("a 6th global slot for the anonymous callers alone: %d %s, want 429", a.status, a.raw)
	}
	victim := []string{"X-API-Key", "victim-key"}
	v := s.do("POST", "/v1/leases", `{"resource":"export","cost":2}`, victim...)
	report(t, "the victim's lease of 2 global export slots beside an anonymous lease of 5", v.status)
	if v.status != http.StatusCreated {
		t.Fatalf("the victim's lease beside an anonymous one: %d %s", v.status, v.raw)
	}
	mine, _ := v.body["lease_id"].(string)
	// Another caller renews and releases neither.
	for _, tc := range []struct {
		what, id string
		as       []string
	}{
		{"acme renews the anonymous lease", anon, acme},
		{"acme releases the anonymous lease", anon, acme},
		{"an anonymous caller renews the victim's lease", mine, nil},
		{"acme releases the victim's lease", mine, acme},
		{"the backend releases the victim's lease", mine, service},
	} {
		method := "PUT"
		if strings.Contains(tc.what, "releases") {
			method = "DELETE"
		}
		if a := s.do(method, "/v1/leases/"+tc.id, "", tc.as...); a.status != http.StatusNotFound {
			t.Errorf("%s: %d %s, want 404", tc.what, a.status, a.raw)
		}
	}
	if a := s.do("PUT", "/v1/leases/"+mine, "", victim...); a.status != http.StatusOK {
		t.Errorf("the victim renews its own lease: %d %s", a.status, a.raw)
	}
	if a := s.do("DELETE", "/v1/leases/"+anon, ""); a.status != http.StatusNoContent {
		t.Errorf("the anonymous caller releases its own lease: %d %s", a.status, a.raw)
	}
}

// TestDemoAcquiresDoNotStarveChecks: on the demo configuration, unchanged,
// 150 anonymous /v1/acquire a second of cost 100 (once booked the global
// bucket ahead: 160 of 160 of another tenant's checks 429) while acme
// checks 80 times a second.
func TestDemoAcquiresDoNotStarveChecks(t *testing.T) {
	demo, err := os.ReadFile("../cmd/admit/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := serve(t, string(demo), false)
	var wg sync.WaitGroup
	var anonOK, acmeOK atomic.Int64
	const rounds = 20 // 100 ms each
	for r := range rounds {
		for range 15 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if a := s.do("POST", "/v1/acquire", `{"cost":100,"max_wait_ms":1000}`); a.status == http.StatusOK {
					anonOK.Add(1)
				}
			}()
		}
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if a := s.do("POST", "/v1/check", `{"tenant":"acme"}`); a.status == http.StatusOK {
					acmeOK.Add(1)
				}
			}()
		}
		_ = r
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	report(t, "acme's checks admitted beside 300 anonymous acquires of cost 100 (demo configuration)", fmt.Sprintf("%d of 160", acmeOK.Load()))
	report(t, "the anonymous acquires admitted", fmt.Sprintf("%d of 300", anonOK.Load()))
	if acmeOK.Load() != 160 {
		t.Errorf("acme got %d of its 160 checks beside anonymous acquires, want all: its share of the global bucket is half", acmeOK.Load())
	}
}

// TestSharedWindowNotDrainedByPeeks: on a global fixed window of 6,000 a
// minute, an anonymous caller asks, again and again, for what a look (cost
// 0) says remains (once took the window: 1,136 of the victim's 1,300
// requests refused). The look tells it what it may take, and the victim's
// requests, at its share, all pass.
func TestSharedWindowNotDrainedByPeeks(t *testing.T) {
	cfg := `version: 1
global:
  - {name: global-minute, scope: global, algorithm: fixed_window, limit: 6000, window: 1m}
tiers:
  free: {}
tenants:
  victim: {tier: free}
`
	s := serve(t, cfg, false)
	stop := make(chan struct{})
	var took atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			peek := s.do("POST", "/v1/check", `{"cost":0}`)
			rem, _ := peek.body["remaining"].(float64)
			if rem >= 1 {
				if a := s.do("POST", "/v1/check", fmt.Sprintf(`{"cost":%d}`, int64(rem))); a.status == http.StatusOK {
					took.Add(int64(rem))
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	admitted := 0
	for range 100 {
		if a := s.do("POST", "/v1/check", `{"tenant":"victim"}`); a.status == http.StatusOK {
			admitted++
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	report(t, "the victim's requests admitted on a global window an anonymous caller drains by peeks", fmt.Sprintf("%d of 100 (the anonymous caller took %d)", admitted, took.Load()))
	if admitted != 100 {
		t.Errorf("the victim got %d of 100 requests at its share through, want all (the anonymous caller took %d of 6,000)", admitted, took.Load())
	}
}

// TestHeldSlotsYieldToAClassOwed: two classes each take their share
// ceiling of a global concurrency limit — half of 10 slots each, so all of
// it — and renew their leases for ever (once: the victim got 0 of 18
// leases in 40 s, every renewal succeeded). The victim, refused, is owed
// its part: the holders' renewals are refused (429), their leases end,
// and the victim gets its slots.
func TestHeldSlotsYieldToAClassOwed(t *testing.T) {
	cfg := `version: 1
global:
  - {name: global-slots, scope: global, actions: [export], algorithm: concurrency, max: 10, lease_ttl: 1s}
tiers:
  free: {}
tenants:
  acme: {tier: free, api_keys_sha256: ["` + policy.HashKey("acme-key") + `"]}
  victim: {tier: free, api_keys_sha256: ["` + policy.HashKey("victim-key") + `"]}
`
	s := serve(t, cfg, false)
	victim := []string{"X-API-Key", "victim-key"}
	type held struct {
		id string
		as []string
	}
	var leases []held
	for _, as := range [][]string{nil, acme} { // the anonymous callers, then acme
		for i := range 5 {
			a := s.do("POST", "/v1/leases", `{"resource":"export"}`, as...)
			if a.status != http.StatusCreated {
				t.Fatalf("slot %d of %v: %d %s", i, as, a.status, a.raw)
			}
			leases = append(leases, held{a.body["lease_id"].(string), as})
		}
	}
	stop := make(chan struct{})
	var refusedRenewals atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the holders renew every 300 ms, as long as they may
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
			for _, l := range leases {
				if a := s.do("PUT", "/v1/leases/"+l.id, "", l.as...); a.status == http.StatusTooManyRequests {
					refusedRenewals.Add(1)
				}
			}
		}
	}()
	start := time.Now()
	got := false
	for time.Since(start) < 10*time.Second && !got {
		got = s.do("POST", "/v1/leases", `{"resource":"export"}`, victim...).status == http.StatusCreated
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	report(t, "the victim's first slot beside two classes holding all 10 and renewing (s), renewals refused", fmt.Sprintf("%.1f s, %d", time.Since(start).Seconds(), refusedRenewals.Load()))
	if !got {
		t.Errorf("the victim got no slot in 10 s beside two classes renewing all 10 slots (%d renewals refused)", refusedRenewals.Load())
	}
}

// TestSharedWindowTwoClassesAtTheCeiling: on a global fixed window of 600
// a minute, with the victim active, an attacker's two classes (its tenant
// key and an anonymous address) each ask the share ceiling, 300, at once
// (once both were admitted at each window's start and the victim, asking
// little, got nothing for the window). With three classes active a part
// is 200: neither takes 300 as its own, and the victim gets what it asks.
func TestSharedWindowTwoClassesAtTheCeiling(t *testing.T) {
	cfg := `version: 1
global:
  - {name: global-minute, scope: global, algorithm: fixed_window, limit: 600, window: 1m}
tiers:
  free: {}
tenants:
  attacker: {tier: free, api_keys_sha256: ["` + policy.HashKey("attacker-key") + `"]}
  victim: {tier: free, api_keys_sha256: ["` + policy.HashKey("victim-key") + `"]}
`
	s := serve(t, cfg, false)
	// The window's end would give everyone a new one: start with time to spare.
	minuteWithTimeToSpare(15 * time.Second)
	victim, attacker := []string{"X-API-Key", "victim-key"}, []string{"X-API-Key", "attacker-key"}
	for _, who := range [][]string{victim, attacker, nil} { // all three want the window
		if a := s.do("POST", "/v1/check", `{"cost":1}`, who...); a.status != http.StatusOK {
			t.Fatalf("a first check of %v: %d %s", who, a.status, a.raw)
		}
	}
	took := 0
	for _, who := range [][]string{attacker, nil} {
		if a := s.do("POST", "/v1/check", `{"cost":300}`, who...); a.status == http.StatusOK {
			took += 300
		} else if a.status != http.StatusTooManyRequests {
			t.Fatalf("a check of 300: %d %s", a.status, a.raw)
		}
	}
	report(t, "units of 600 the attacker's two classes took at once, asking 300 each", took)
	if took > 0 {
		t.Errorf("the attacker's two classes took %d of the window at once, asking the ceiling each; want neither over its part of 200", took)
	}
	got := 0
	for range 20 {
		if a := s.do("POST", "/v1/check", `{"cost":5}`, victim...); a.status == http.StatusOK {
			got += 5
		}
	}
	report(t, "the victim's checks of 5 admitted after the attacker's (of 100 asked)", got)
	if got != 100 {
		t.Errorf("the victim got %d of the 100 it asked, within its part of 200", got)
	}
}

// minuteWithTimeToSpare waits, if less than spare is left of the current
// minute (a window of a minute, aligned to the Unix epoch, as Admit's are),
// for the next one to start.
func minuteWithTimeToSpare(spare time.Duration) {
	if left := time.Minute - time.Duration(time.Now().UnixNano())%time.Minute; left < spare {
		time.Sleep(left)
	}
}
