package attack

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/admitdev/admit/redistest"
)

// TestInventedTenantsLeaveLittle: with a default tier holding a monthly
// quota, each request naming a tenant nobody created leaves its quota's
// key, which ends with the period, and no usage records of its own: the
// default tier's tenants are recorded as one (each once left a quota key
// and two record keys, ~650 B, for 402 days).
func TestInventedTenantsLeaveLittle(t *testing.T) {
	srv := redistest.Start(t)
	s := serve(t, `version: 1
defaults:
  unknown_tenant: free
tiers:
  free:
    rules:
      - {name: monthly, scope: tenant, algorithm: quota, limit: 100, period: month, time_zone: UTC}
`, false, "--store", "redis://"+srv.Addr)
	keys := func() int {
		t.Helper()
		v, err := redistest.Command(srv.Addr, "DBSIZE")
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(v))
		return n
	}
	// Let the records of the first check land, then count from there.
	if a := s.do("POST", "/v1/check", `{"tenant":"invented-0"}`); a.status != 200 {
		t.Fatalf("an invented tenant: %d %s", a.status, a.raw)
	}
	time.Sleep(1500 * time.Millisecond)
	before := keys()
	const n = 500
	for i := 1; i <= n; i++ {
		if a := s.do("POST", "/v1/check", `{"tenant":"invented-`+strconv.Itoa(i)+`"}`); a.status != 200 {
			t.Fatalf("invented tenant %d: %d %s", i, a.status, a.raw)
		}
	}
	time.Sleep(1500 * time.Millisecond) // the records' write, every second
	added := keys() - before
	report(t, "Redis keys per invented tenant", float64(added)/n)
	t.Logf("%d invented tenants: %d keys more", n, added)
	if added > n+2 {
		t.Errorf("%d invented tenants left %d keys, more than their quotas' %d", n, added, n)
	}
	a := s.do("GET", "/v1/admin/usage?tenant=_default_tier", "", admin...)
	if a.status != 200 || !strings.Contains(a.raw, `"admitted":501`) {
		t.Errorf("the default tier's record: %d %s, want the 501 admitted together", a.status, a.raw)
	}
	// The keys end with the period, not a year after: all but the
	// default tier's record (its hash and its index).
	now := time.Now().UTC()
	periodEnd := time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC)
	list, err := redistest.Command(srv.Addr, "KEYS", "*")
	if err != nil {
		t.Fatal(err)
	}
	longer := 0
	for _, k := range strings.Fields(list) {
		ttl, err := redistest.Command(srv.Addr, "PTTL", k)
		if err != nil {
			t.Fatal(err)
		}
		if ms, _ := strconv.ParseInt(strings.TrimSpace(ttl), 10, 64); ms < 0 || time.Duration(ms)*time.Millisecond > time.Until(periodEnd)+48*time.Hour {
			longer++
		}
	}
	if longer > 2 {
		t.Errorf("%d keys live past the quota's period's end (%v from now); want the default tier's record alone (2)", longer, time.Until(periodEnd).Round(time.Hour))
	}
}
