package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/admitdev/admit/e2e/rlqsenvoy"
	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/redistest"
)

// rlqsConfig limits tenant acme's reads to 200/s, burst 100, across the
// fleet: the rule the quota service divides among the Envoys. With
// apiKeys, acme's requests name its key.
func rlqsConfig(t *testing.T, apiKeys bool) string {
	t.Helper()
	keys := ""
	if apiKeys {
		keys = `, api_keys_sha256: ["` + policy.HashKey("acme-key") + `"]`
	}
	cfg := `version: 1
store:
  on_error: closed
  redis:
    timeout: 2s
tiers:
  pro:
    rules:
      - {name: tenant-reads, scope: tenant, actions: [read], algorithm: token_bucket, rate: 200/s, burst: 100}
tenants:
  acme: {tier: pro` + keys + `}
`
	path := filepath.Join(t.TempDir(), "admit.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// dashboardShares reads the quota shares of a server's dashboard.
func dashboardShares(t *testing.T, url string) []envoyrls.QuotaShares {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/v1/admin/dashboard", nil)
	req.Header.Set("Authorization", "Bearer rlqs-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d struct {
		Quota []envoyrls.QuotaShares `json:"quota_shares"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		t.Fatal(err)
	}
	return d.Quota
}

// fleetConn dials the quota service at addrs, the first first: when it
// goes, the stream reopens on the next, as an Envoy's cluster of RLQS
// servers does.
func fleetConn(t *testing.T, addrs ...string) *grpc.ClientConn {
	t.Helper()
	r := manual.NewBuilderWithScheme("fleet")
	var as []resolver.Address
	for _, a := range addrs {
		as = append(as, resolver.Address{Addr: a})
	}
	r.InitialState(resolver.State{Addresses: as})
	conn, err := grpc.NewClient("fleet:///rlqs", grpc.WithResolvers(r), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestQuotaFleetAcrossReplicas drives ten Envoys (Go clients that decide
// as Envoy's rate_limit_quota filter does) through two `admit serve` on
// one Redis: eight want 60/s each, two 8/s, against 200/s. In every 10 s
// they admit at most the burst and the rate over it, the light ones get
// their demand, and the fleet uses the limit; one replica is killed
// midway, and its Envoys' streams reopen on the other, which shares the
// limit again within one assignment's TTL without going over.
func TestQuotaFleetAcrossReplicas(t *testing.T) {
	redis := redistest.Start(t)
	cfg := rlqsConfig(t, true)
	env := []string{"ADMIT_ADMIN_TOKEN=rlqs-token"}
	a := startAdmitEnv(t, env, "--config", cfg, "--store", "redis://"+redis.Addr)
	b := startAdmitEnv(t, env, "--config", cfg, "--store", "redis://"+redis.Addr)

	const (
		rate, burst = 200, 100
		heavy, each = 8, 60.0
		light, want = 2, 8.0
		interval    = 2 * time.Second
		run         = 56 * time.Second
		killAt      = 24 * time.Second
	)
	bucket := map[string]string{"tenant": "acme", "api_key": "acme-key", "action": "read"}
	type client struct {
		f         *rlqsenvoy.Filter
		demand    float64
		onB       bool
		tried, ok []atomic.Int64 // per second of the run
	}
	slots := int(run / time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var clients []*client
	for i := range heavy + light {
		c := &client{demand: each, onB: i%2 == 1, tried: make([]atomic.Int64, slots), ok: make([]atomic.Int64, slots)}
		if i >= heavy {
			c.demand = want
		}
		conn := fleetConn(t, a.grpc, b.grpc)
		if c.onB {
			conn = fleetConn(t, b.grpc, a.grpc)
		}
		c.f = rlqsenvoy.New(conn, rlqsenvoy.Config{Domain: "web", ReportInterval: interval, NoAssignment: rlqsenvoy.DenyAll,
			Expired:        &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}},
			ExpiredTimeout: time.Hour})
		c.f.Start(ctx)
		t.Cleanup(c.f.Close)
		clients = append(clients, c)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() {
			tick := time.NewTicker(time.Duration(float64(time.Second) / c.demand))
			defer tick.Stop()
			for now := range tick.C {
				k := int(now.Sub(start) / time.Second)
				if k >= slots {
					return
				}
				c.tried[k].Add(1)
				if c.f.Allow(bucket) {
					c.ok[k].Add(1)
				}
			}
		})
	}
	time.Sleep(killAt)
	// Both servers' Envoys share one ledger: a's dashboard shows all ten
	// buckets, within the limit.
	shares := dashboardShares(t, a.url)
	if len(shares) != 1 || shares[0].Rule != "tenant-reads" || shares[0].Holders != heavy+light || shares[0].Assigned > rate || shares[0].Here != (heavy+light)/2 {
		t.Errorf("a's dashboard: %+v; want one limit, its ten buckets, five here", shares)
	}
	if n := metric(t, a.url, "admit_rlqs_rule_streams"); n != (heavy+light)/2 {
		t.Errorf("admit_rlqs_rule_streams %v on a; want 5", n)
	}
	if err := b.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := int(time.Since(start) / time.Second)
	wg.Wait()

	total := make([]int64, slots)
	for _, c := range clients {
		for k := range slots {
			total[k] += c.ok[k].Load()
		}
	}
	t.Logf("admitted per second: %v (killed at %d s)", total, killed)
	// The bound: every 10 s, at most the burst and 10 s of the rate.
	for k := 0; k+10 <= slots; k++ {
		var sum int64
		for _, n := range total[k : k+10] {
			sum += n
		}
		if sum > burst+10*rate {
			t.Errorf("%d admitted in the 10 s from %d s; the bound is %d", sum, k, burst+10*rate)
		}
	}
	// Converged (from 10 s, and from one TTL after the kill): the fleet
	// uses the limit, the light clients get their demand.
	steady := func(k int) bool { return k >= 10 && (k < killed || k >= killed+14) && k < slots-1 }
	var used, offered int64
	lightTried, lightOK := map[int]int64{}, map[int]int64{}
	for k := range slots {
		if !steady(k) {
			continue
		}
		used += total[k]
		offered += rate
		for i, c := range clients[heavy:] {
			lightTried[i] += c.tried[k].Load()
			lightOK[i] += c.ok[k].Load()
		}
	}
	if float64(used) < 0.95*float64(offered) {
		t.Errorf("the fleet admitted %d of %d in its steady seconds (%.1f %%); want 95 %%", used, offered, 100*float64(used)/float64(offered))
	}
	for i := range light {
		if float64(lightOK[i]) < 0.95*float64(lightTried[i]) {
			t.Errorf("light client %d: %d of %d admitted; want 95 %%", i, lightOK[i], lightTried[i])
		}
	}
	for i, c := range clients {
		st := c.f.Stats()
		t.Logf("client %d (%.0f/s, on %s first): allowed %d denied %d, reconnects %d", i, c.demand, map[bool]string{true: "b", false: "a"}[c.onB], st.Allowed, st.Denied, st.Reconnects)
		if c.onB && st.Reconnects == 0 {
			t.Errorf("client %d never reconnected after b was killed", i)
		}
	}
}

// TestQuotaStoreDown: with its Redis gone, `admit serve` answers a
// bucket's report by the rule's on_error (closed here: DENY_ALL), and
// shares again once Redis is back.
func TestQuotaStoreDown(t *testing.T) {
	redis := redistest.Start(t)
	a := startAdmit(t, "--config", rlqsConfig(t, false), "--store", "redis://"+redis.Addr)
	conn := fleetConn(t, a.grpc)
	f := rlqsenvoy.New(conn, rlqsenvoy.Config{Domain: "web", ReportInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.Start(ctx)
	defer f.Close()
	bucket := map[string]string{"tenant": "acme", "action": "read"}
	// Reports are taken at most once a second a bucket: the client
	// reports until the answer comes.
	until := func(what string, ok func(*typev3.RateLimitStrategy) bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if st, _ := f.Bucket(bucket); ok(st.Strategy) {
				return
			}
			if time.Now().After(deadline) {
				st, _ := f.Bucket(bucket)
				t.Fatalf("no %s (bucket %+v)", what, st)
			}
			f.Tick()
		}
	}
	f.Allow(bucket)
	until("share", func(s *typev3.RateLimitStrategy) bool { return s.GetTokenBucket() != nil })
	redis.Kill()
	until("DENY_ALL while Redis is down", func(s *typev3.RateLimitStrategy) bool {
		return s.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL && s.GetTokenBucket() == nil
	})
	redis.Restart(t)
	until("share after Redis came back", func(s *typev3.RateLimitStrategy) bool { return s.GetTokenBucket() != nil })
}
