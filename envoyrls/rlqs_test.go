package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/storetest"
)

func quotaPolicy(t *testing.T) *policy.Policy {
	t.Helper()
	burst, daily := int64(50), int64(30)
	p, err := policy.Compile(&policy.Spec{
		UnknownTenant: "deny",
		Tiers: map[string]policy.TierSpec{"pro": {Rules: []policy.RuleSpec{
			{Name: "tenant-rps", Scope: "tenant", Actions: []string{"read"}, Algorithm: "token_bucket", Rate: "100/s", Burst: &burst},
			{Name: "daily", Scope: "tenant", Actions: []string{"export"}, Algorithm: "fixed_window", Limit: &daily, Window: "1h"},
		}}},
		Tenants: map[string]policy.TenantSpec{
			"acme": {Tier: "pro", APIKeysSHA256: []string{policy.HashKey("acme-key")}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type quotaEnv struct {
	*env
	q *QuotaService
}

// startQuota serves the quota service beside the RLS of start, on the
// same manual clock; ticks between reports are left to the test.
func startQuota(t *testing.T, p *policy.Policy) *quotaEnv {
	t.Helper()
	// The quota service is registered before the server serves, and
	// given the RLS it resolves buckets with once start has made it.
	q, err := NewQuotaService(QuotaOptions{Service: &Service{}, Tick: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, Options{Policy: func() *policy.Policy { return p }}, nil, func(s *Server) { s.ServeQuota(q) })
	q.opts.Service, q.opts.Now = e.svc, e.clock.Now
	q.opts.Ledger = NewMemoryLedger(e.clock.Now)
	return &quotaEnv{env: e, q: q}
}

// advance moves the clock d on.
func (e *quotaEnv) advance(d time.Duration) { e.clock.Set(e.clock.Now().Add(d).Sub(storetest.Epoch)) }

type quotaClient struct {
	t      *testing.T
	stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	cancel context.CancelFunc
}

func (e *quotaEnv) open(t *testing.T) *quotaClient {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := rlqsv3.NewRateLimitQuotaServiceClient(e.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	return &quotaClient{t: t, stream: s, cancel: cancel}
}

func usage(allowed, denied uint64, elapsed time.Duration, kv ...string) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	id := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		id[kv[i]] = kv[i+1]
	}
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: id},
		TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

// report sends one message and returns the answer.
func (c *quotaClient) report(domain string, us ...*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) *rlqsv3.RateLimitQuotaResponse {
	c.t.Helper()
	if err := c.stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us}); err != nil {
		c.t.Fatal(err)
	}
	type answer struct {
		r   *rlqsv3.RateLimitQuotaResponse
		err error
	}
	got := make(chan answer, 1)
	go func() {
		r, err := c.stream.Recv()
		got <- answer{r, err}
	}()
	select {
	case a := <-got:
		if a.err != nil {
			c.t.Fatal(a.err)
		}
		return a.r
	case <-time.After(10 * time.Second):
		c.t.Fatal("no answer to a report")
		return nil
	}
}

func strategyOf(a *rlqsv3.RateLimitQuotaResponse_BucketAction) *typev3.RateLimitStrategy {
	return a.GetQuotaAssignmentAction().GetRateLimitStrategy()
}

func perSecond(tb *typev3.TokenBucket) float64 {
	return float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
}

// TestQuotaSharesByDemand: two Envoys of one tenant's limit (100/s, burst
// 50) share it by demand, never over, and every assignment is a token
// bucket Envoy can run (whole seconds, a TTL of two report intervals).
func TestQuotaSharesByDemand(t *testing.T) {
	e := startQuota(t, quotaPolicy(t))
	a, b := e.open(t), e.open(t)
	bucket := []string{"tenant", "acme", "api_key", "acme-key", "action", "read"}

	// A subscribes with its first request, then reports 80/s.
	r := a.report("web", usage(1, 0, 0, bucket...))
	tb := strategyOf(r.BucketAction[0]).GetTokenBucket()
	if tb == nil || r.BucketAction[0].GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() < 10*time.Second {
		t.Fatalf("first assignment %v", r)
	}
	e.advance(5 * time.Second)
	r = a.report("", usage(350, 50, 5*time.Second, bucket...))
	tb = strategyOf(r.BucketAction[0]).GetTokenBucket()
	if got := perSecond(tb); got < 85 || got > 90 {
		t.Fatalf("a at 80/s: %.1f/s (%v); want its demand and a tenth", got, tb)
	}
	if tb.GetFillInterval().GetNanos() != 0 || tb.GetFillInterval().GetSeconds() < 1 {
		t.Fatalf("fill interval %v: want whole seconds", tb.GetFillInterval())
	}
	// B subscribes, then reports 20/s: it gets what A leaves.
	b.report("web", usage(1, 0, 0, bucket...))
	e.advance(5 * time.Second)
	r = b.report("web", usage(100, 0, 5*time.Second, bucket...))
	if len(r.BucketAction) != 1 {
		t.Fatalf("b: %v", r)
	}
	tbB := strategyOf(r.BucketAction[0]).GetTokenBucket()
	if sum := perSecond(tb) + perSecond(tbB); sum > 100 {
		t.Fatalf("a %.1f/s + b %.1f/s > 100/s", perSecond(tb), perSecond(tbB))
	}
	if tb.GetMaxTokens()+tbB.GetMaxTokens() > 50 {
		t.Fatalf("max tokens %d + %d > the burst 50", tb.GetMaxTokens(), tbB.GetMaxTokens())
	}
	st := e.q.RuleStats()
	if len(st) != 1 || st[0].Rule != "tenant-rps" || st[0].Streams != 2 || st[0].Buckets != 2 || st[0].Allowed != 452 || st[0].Denied != 50 {
		t.Fatalf("rule stats %+v", st)
	}
}

// TestQuotaBlanketRules: a request no rule limits is ALLOW_ALL; an unknown
// tenant and a wrong key DENY_ALL.
func TestQuotaBlanketRules(t *testing.T) {
	e := startQuota(t, quotaPolicy(t))
	c := e.open(t)
	r := c.report("web",
		usage(1, 0, 0, "tenant", "acme", "api_key", "acme-key", "action", "list"),
		usage(1, 0, 0, "tenant", "nobody", "action", "read"),
		usage(1, 0, 0, "tenant", "acme", "api_key", "wrong", "action", "read"))
	want := []typev3.RateLimitStrategy_BlanketRule{typev3.RateLimitStrategy_ALLOW_ALL, typev3.RateLimitStrategy_DENY_ALL, typev3.RateLimitStrategy_DENY_ALL}
	if len(r.BucketAction) != len(want) {
		t.Fatalf("actions %v", r)
	}
	for i, a := range r.BucketAction {
		if s := strategyOf(a); s.GetTokenBucket() != nil || s.GetBlanketRule() != want[i] {
			t.Errorf("bucket %d: %v; want %v", i, s, want[i])
		}
	}
}

// TestQuotaWindowAllowance: a fixed window's allowances are charged to the
// store before they are sent, each expires before the window ends, and a
// window with nothing left is DENY_ALL until it ends.
func TestQuotaWindowAllowance(t *testing.T) {
	e := startQuota(t, quotaPolicy(t))
	c := e.open(t)
	bucket := []string{"tenant", "acme", "api_key", "acme-key", "action", "export"}
	r := c.report("web", usage(1, 0, 0, bucket...))
	a := r.BucketAction[0].GetQuotaAssignmentAction()
	tb := a.GetRateLimitStrategy().GetTokenBucket()
	if tb == nil {
		t.Fatalf("first: %v", r)
	}
	// The per-request service sees what the allowance took.
	resp := e.ask(t, "admit", 0, desc("tenant", "acme", "api_key", "acme-key", "action", "export"))
	left := resp.Statuses[0].LimitRemaining
	if left >= 30 {
		t.Fatalf("%d of 30 left after an allowance; want it charged", left)
	}
	// Spend the window through the RLS, then the next report is denied
	// all until the hour ends.
	for range left {
		e.ask(t, "admit", 1, desc("tenant", "acme", "api_key", "acme-key", "action", "export"))
	}
	e.advance(5 * time.Second)
	r = c.report("web", usage(1, 0, 5*time.Second, bucket...))
	a = r.BucketAction[0].GetQuotaAssignmentAction()
	if a.GetRateLimitStrategy().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Fatalf("a spent window: %v", a)
	}
	if ttl := a.GetAssignmentTimeToLive().AsDuration(); ttl < 50*time.Minute {
		t.Fatalf("DENY_ALL for %v; want until the window ends", ttl)
	}
}

// TestQuotaStreamBounds: the domain is the first message's; buckets past
// the bounds are abandoned.
func TestQuotaStreamBounds(t *testing.T) {
	e := startQuota(t, quotaPolicy(t))
	c := e.open(t)
	r := c.report("web", usage(1, 0, 0), usage(1, 0, 0, strings.Repeat("k", MaxEntryLen+1), "v"))
	if len(r.BucketAction) != 2 || r.BucketAction[0].GetAbandonAction() == nil || r.BucketAction[1].GetAbandonAction() == nil {
		t.Fatalf("invalid buckets: %v", r)
	}
	var many []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
	for i := range MaxBucketsPerStream + 1 {
		many = append(many, usage(1, 0, 0, "tenant", "acme", "api_key", "acme-key", "action", "list", "n", fmt.Sprint(i)))
	}
	r = c.report("web", many...)
	var abandoned []string
	for _, a := range r.BucketAction {
		if a.GetAbandonAction() != nil {
			abandoned = append(abandoned, a.GetBucketId().GetBucket()["n"])
		}
	}
	if len(r.BucketAction) != MaxBucketsPerStream+1 || len(abandoned) != 1 || abandoned[0] != fmt.Sprint(MaxBucketsPerStream) {
		t.Fatalf("%d actions, abandoned %v; want the bucket past %d alone", len(r.BucketAction), abandoned, MaxBucketsPerStream)
	}
	if err := c.stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "other"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.stream.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("another domain: %v; want INVALID_ARGUMENT", err)
	}
	c2 := e.open(t)
	if err := c2.stream.Send(&rlqsv3.RateLimitQuotaUsageReports{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.stream.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no domain: %v; want INVALID_ARGUMENT", err)
	}
}

// TestQuotaConfiguredDomain: a domain of an envoyproxy/ratelimit file is
// matched down its descriptors, whatever order a bucket's entries come in.
func TestQuotaConfiguredDomain(t *testing.T) {
	e := startQuota(t, quotaPolicy(t))
	c := e.open(t)
	r := c.report("messaging", usage(1, 0, 0, "bucket", "x", "unrelated", "y"))
	tb := strategyOf(r.BucketAction[0]).GetTokenBucket()
	if tb == nil || perSecond(tb) > 2 {
		t.Fatalf("the bucket limit (2/s): %v", r)
	}
	r = c.report("messaging", usage(1, 0, 0, "banned", "x"))
	if strategyOf(r.BucketAction[0]).GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Fatalf("a limit of 0: %v", r)
	}
	r = c.report("messaging", usage(1, 0, 0, "ldap", "x"))
	if strategyOf(r.BucketAction[0]).GetBlanketRule() != typev3.RateLimitStrategy_ALLOW_ALL {
		t.Fatalf("unlimited: %v", r)
	}
}

// downLedger fails every update, as a ledger whose Redis is down.
type downLedger struct{}

func (downLedger) Update(context.Context, string, time.Duration, func(time.Time, []byte) ([]byte, bool, error)) error {
	return errors.New("connection refused")
}

// TestQuotaLedgerDown: while the ledger cannot be reached, a bucket is
// assigned what its rules' on_error says: closed DENY_ALL, open
// ALLOW_ALL, local the limit divided among the stream's buckets.
func TestQuotaLedgerDown(t *testing.T) {
	for _, c := range []struct {
		onError string
		check   func(*typev3.RateLimitStrategy) bool
	}{
		{"closed", func(s *typev3.RateLimitStrategy) bool { return s.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL }},
		{"open", func(s *typev3.RateLimitStrategy) bool {
			return s.GetTokenBucket() == nil && s.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL
		}},
		{"local", func(s *typev3.RateLimitStrategy) bool {
			tb := s.GetTokenBucket()
			return tb != nil && perSecond(tb) <= 100 && tb.GetMaxTokens() <= 50
		}},
	} {
		t.Run(c.onError, func(t *testing.T) {
			burst := int64(50)
			p, err := policy.Compile(&policy.Spec{OnError: c.onError,
				Tiers: map[string]policy.TierSpec{"pro": {Rules: []policy.RuleSpec{
					{Name: "tenant-rps", Scope: "tenant", Actions: []string{"read"}, Algorithm: "token_bucket", Rate: "100/s", Burst: &burst},
				}}},
				Tenants: map[string]policy.TenantSpec{"acme": {Tier: "pro"}},
			})
			if err != nil {
				t.Fatal(err)
			}
			e := startQuota(t, p)
			e.q.opts.Ledger = downLedger{}
			q := e.open(t)
			// A new bucket asks until its asks have failed for a TTL
			// before on_error decides it: its first report is not
			// answered.
			if err := q.stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "web",
				BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(1, 0, 0, "tenant", "acme", "action", "read")}}); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); e.q.stats.failed.Load() == 0; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the first report never reached the ledger")
				}
			}
			e.advance(MinQuotaTTL + time.Second)
			r := q.report("web", usage(1, 0, time.Second, "tenant", "acme", "action", "read"))
			if s := strategyOf(r.BucketAction[0]); !c.check(s) {
				t.Fatalf("on_error %s: %v", c.onError, s)
			}
		})
	}
}

// countingLedger counts the updates a ledger is asked for.
type countingLedger struct {
	QuotaLedger
	n atomic.Int64
}

func (c *countingLedger) Update(ctx context.Context, key string, ttl time.Duration, fn func(time.Time, []byte) ([]byte, bool, error)) error {
	c.n.Add(1)
	return c.QuotaLedger.Update(ctx, key, ttl, fn)
}

// TestQuotaRapidReports: a client that reports a bucket as fast as it can
// costs the ledger one update a second; its counts are not lost.
func TestQuotaRapidReports(t *testing.T) {
	e := startQuota(t, quotaPolicy(t))
	counted := &countingLedger{QuotaLedger: e.q.opts.Ledger}
	e.q.opts.Ledger = counted
	c := e.open(t)
	bucket := []string{"tenant", "acme", "api_key", "acme-key", "action", "read"}
	c.report("web", usage(1, 0, 0, bucket...))
	for range 200 {
		if err := c.stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "web",
			BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(1000, 1000, 5*time.Second, bucket...)}}); err != nil {
			t.Fatal(err)
		}
	}
	// The server has read them all once their counts are in its
	// statistics (none is answered).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		st := e.q.RuleStats()
		if len(st) == 1 && st[0].Allowed == 200*1000+1 && st[0].Denied == 200*1000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rule stats %+v: the rapid reports' counts are lost", st)
		}
	}
	if n := counted.n.Load(); n != 1 {
		t.Fatalf("%d ledger updates for 201 reports in the same second; want 1", n)
	}
	e.advance(time.Second)
	r := c.report("web", usage(0, 0, time.Second, bucket...))
	if len(r.BucketAction) != 1 {
		t.Fatalf("after a second: %v", r)
	}
	if n := counted.n.Load(); n != 2 {
		t.Fatalf("%d ledger updates after the next second; want 2", n)
	}
}

// TestQuotaBucketsPerConnection: the streams of one connection hold
// MaxBucketsPerConnection buckets together; past it a bucket is
// abandoned, and one stream's end gives its room back.
func TestQuotaBucketsPerConnection(t *testing.T) {
	e := startQuota(t, quotaPolicy(t))
	many := func(s int) []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
		var us []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
		for i := range MaxBucketsPerStream {
			us = append(us, usage(1, 0, 0, "tenant", "acme", "api_key", "acme-key", "action", "list", "n", fmt.Sprint(s, "/", i)))
		}
		return us
	}
	abandoned := func(r *rlqsv3.RateLimitQuotaResponse) int {
		n := 0
		for _, a := range r.BucketAction {
			if a.GetAbandonAction() != nil {
				n++
			}
		}
		return n
	}
	var cs []*quotaClient
	for s := range MaxBucketsPerConnection / MaxBucketsPerStream {
		c := e.open(t)
		if n := abandoned(c.report("web", many(s)...)); n != 0 {
			t.Fatalf("stream %d: %d abandoned", s, n)
		}
		cs = append(cs, c)
	}
	extra := e.open(t)
	if n := abandoned(extra.report("web", many(99)[:10]...)); n != 10 {
		t.Fatalf("past the connection's buckets: %d of 10 abandoned", n)
	}
	cs[0].cancel()
	for deadline := time.Now().Add(10 * time.Second); e.q.stats.buckets.Load() > int64(MaxBucketsPerConnection-MaxBucketsPerStream); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the ended stream's buckets are still counted")
		}
	}
	if n := abandoned(extra.report("web", many(98)[:10]...)); n != 0 {
		t.Fatalf("after a stream ended: %d of 10 abandoned", n)
	}
}

// TestQuotaLedgerSlowOnce: a bucket with an assignment keeps it through a
// failed share (no on_error answer, which would be ALLOW_ALL here), and is
// shared again once the ledger answers.
func TestQuotaLedgerSlowOnce(t *testing.T) {
	e := startQuota(t, quotaPolicy(t))
	good := e.q.opts.Ledger
	c := e.open(t)
	bucket := []string{"tenant", "acme", "api_key", "acme-key", "action", "read"}
	if tb := strategyOf(c.report("web", usage(1, 0, 0, bucket...)).BucketAction[0]).GetTokenBucket(); tb == nil {
		t.Fatal("no share")
	}
	e.q.opts.Ledger = downLedger{}
	e.advance(5 * time.Second)
	if err := c.stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "web",
		BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(10, 0, 5*time.Second, bucket...)}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); e.q.stats.failed.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the report never reached the ledger")
		}
	}
	if n := e.q.stats.failovers.Load(); n != 0 {
		t.Fatalf("%d on_error answers for a bucket whose assignment had 6 s to live", n)
	}
	e.q.opts.Ledger = good
	e.advance(5 * time.Second)
	if tb := strategyOf(c.report("web", usage(10, 0, 5*time.Second, bucket...)).BucketAction[0]).GetTokenBucket(); tb == nil {
		t.Fatal("no share after the ledger came back")
	}
}

// TestQuotaStreamsPerConnection: a connection holds
// MaxQuotaStreamsPerConnection quota streams; the next is refused.
func TestQuotaStreamsPerConnection(t *testing.T) {
	e := startQuota(t, quotaPolicy(t))
	for i := range MaxQuotaStreamsPerConnection {
		e.open(t).report("web", usage(1, 0, 0, "tenant", "acme", "api_key", "acme-key", "action", "list", "n", fmt.Sprint(i)))
	}
	c := e.open(t)
	if err := c.stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "web"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.stream.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("stream %d of a connection: %v; want RESOURCE_EXHAUSTED", MaxQuotaStreamsPerConnection+1, err)
	}
}

// TestQuotaBannedBucket: a bucket whose tenant a ban names is DENY_ALL for
// as long as the ban lasts, with no share asked, and shares again once the
// ban is lifted; the RLS refuses it too, naming the ban.
func TestQuotaBannedBucket(t *testing.T) {
	e := startQuota(t, quotaPolicy(t))
	bans := policy.NewBans(&policy.MemoryBans{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := bans.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	e.svc.opts.Decider.EnforceBans(bans)
	c := e.open(t)
	bucket := []string{"tenant", "acme", "api_key", "acme-key", "action", "read"}
	if r := c.report("web", usage(1, 0, 0, bucket...)); strategyOf(r.BucketAction[0]).GetTokenBucket() == nil {
		t.Fatalf("before the ban: %v", r)
	}
	ban, err := bans.Add(ctx, policy.Ban{Scope: policy.BanTenant, Value: "acme"}, 20*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.advance(time.Second)
	r := c.report("web", usage(1, 0, time.Second, bucket...))
	a := r.BucketAction[0].GetQuotaAssignmentAction()
	if a.GetRateLimitStrategy().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Fatalf("under the ban: %v", r)
	}
	if ttl := a.GetAssignmentTimeToLive().AsDuration(); ttl < 19*time.Minute || ttl > 21*time.Minute {
		t.Fatalf("DENY_ALL for %v; want the ban's 20m", ttl)
	}
	resp := e.ask(t, "admit", 1, desc(bucket...))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].CurrentLimit.GetName() != "ban:"+ban.ID {
		t.Fatalf("RLS under the ban: %v", resp)
	}
	if _, err := bans.Remove(ctx, ban.ID); err != nil {
		t.Fatal(err)
	}
	e.advance(time.Second)
	if r := c.report("web", usage(1, 0, time.Second, bucket...)); strategyOf(r.BucketAction[0]).GetTokenBucket() == nil {
		t.Fatalf("after the ban: %v", r)
	}
}

// TestBannedAddressInAConfiguredDomain: an envoyproxy/ratelimit domain's
// descriptors are refused, OVER_LIMIT and naming the ban, when their
// remote_address is banned, whatever the peer (not trusted to name its
// clients here) is.
func TestBannedAddressInAConfiguredDomain(t *testing.T) {
	e := start(t, Options{}, nil)
	bans := policy.NewBans(&policy.MemoryBans{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := bans.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	e.svc.opts.Decider.EnforceBans(bans)
	ban, err := bans.Add(ctx, policy.Ban{Scope: policy.BanIP, Value: "203.0.113.0/24"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	resp := e.ask(t, "messaging", 1, desc("to_number", "555", "remote_address", "203.0.113.7"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].CurrentLimit.GetName() != "ban:"+ban.ID {
		t.Fatalf("a banned remote_address: %v", resp)
	}
	if resp := e.ask(t, "messaging", 1, desc("to_number", "555", "remote_address", "203.0.114.7")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("another address: %v", resp)
	}
}

// tenantSeen records the tenants of the decisions it is told of.
type tenantSeen struct {
	mu      sync.Mutex
	tenants []string
}

func (o *tenantSeen) Observe(res *policy.Resolution, _ *admit.Decision, _ policy.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if res.Tenant != nil {
		o.tenants = append(o.tenants, res.Tenant.ID)
	} else {
		o.tenants = append(o.tenants, "")
	}
}

// TestDecisionsAreTheTenants: a catalog request of one tenant is decided
// as that tenant's, so that its quotas' usage is metered to it, through
// the RLS and through the quota service's window allowances alike.
func TestDecisionsAreTheTenants(t *testing.T) {
	e := startQuota(t, quotaPolicy(t))
	seen := &tenantSeen{}
	e.svc.opts.Decider.Observe(seen)
	e.ask(t, "admit", 1, desc("tenant", "acme", "api_key", "acme-key", "action", "export"))
	c := e.open(t)
	c.report("web", usage(1, 0, 0, "tenant", "acme", "api_key", "acme-key", "action", "export"))
	seen.mu.Lock()
	defer seen.mu.Unlock()
	if len(seen.tenants) < 2 || slices.Contains(seen.tenants, "") {
		t.Fatalf("decisions of tenants %q; want acme's", seen.tenants)
	}
}
