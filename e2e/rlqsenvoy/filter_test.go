package rlqsenvoy

import (
	"context"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// waitLimit bounds every wait; reaching it is a failure, never a pacing
// device.
const waitLimit = 10 * time.Second

// fakeClock is a clock that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fakeServer is a scripted RLQS server: it hands each stream to the test,
// which reads the client's reports and writes responses or closes the stream.
type fakeServer struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	streams chan *fakeStream
}

type fakeStream struct {
	srv     grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	reports chan *rlqsv3.RateLimitQuotaUsageReports // closed when the client's side ends
	end     chan error
}

func (s *fakeServer) StreamRateLimitQuotas(srv grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	fs := &fakeStream{
		srv:     srv,
		reports: make(chan *rlqsv3.RateLimitQuotaUsageReports, 1024),
		end:     make(chan error, 1),
	}
	go func() {
		defer close(fs.reports)
		for {
			r, err := srv.Recv()
			if err != nil {
				return
			}
			fs.reports <- r
		}
	}()
	select {
	case s.streams <- fs:
	case <-srv.Context().Done():
		return nil
	}
	select {
	case err := <-fs.end:
		return err
	case <-srv.Context().Done():
		return nil
	}
}

// harness is one fake server and a connection to it.
type harness struct {
	t    *testing.T
	srv  *fakeServer
	conn *grpc.ClientConn
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	fs := &fakeServer{streams: make(chan *fakeStream, 16)}
	rlqsv3.RegisterRateLimitQuotaServiceServer(gs, fs)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
	})
	return &harness{t: t, srv: fs, conn: conn}
}

// filter returns a Filter on the harness's connection, closed with the test.
func (h *harness) filter(cfg Config) *Filter {
	if cfg.Domain == "" {
		cfg.Domain = "test-domain"
	}
	f := New(h.conn, cfg)
	h.t.Cleanup(f.Close)
	return f
}

func (h *harness) nextStream() *fakeStream {
	h.t.Helper()
	select {
	case fs := <-h.srv.streams:
		return fs
	case <-time.After(waitLimit):
		h.t.Fatal("no stream reached the server")
		return nil
	}
}

func (fs *fakeStream) next(t *testing.T) *rlqsv3.RateLimitQuotaUsageReports {
	t.Helper()
	select {
	case r, ok := <-fs.reports:
		if !ok {
			t.Fatal("stream ended before the expected report")
		}
		return r
	case <-time.After(waitLimit):
		t.Fatal("no report reached the server")
		return nil
	}
}

func (fs *fakeStream) send(t *testing.T, actions ...*rlqsv3.RateLimitQuotaResponse_BucketAction) {
	t.Helper()
	if err := fs.srv.Send(&rlqsv3.RateLimitQuotaResponse{BucketAction: actions}); err != nil {
		t.Fatal(err)
	}
}

// respond sends actions and waits until the filter has processed them.
func respond(t *testing.T, f *Filter, fs *fakeStream, actions ...*rlqsv3.RateLimitQuotaResponse_BucketAction) {
	t.Helper()
	n := f.Stats().Responses
	fs.send(t, actions...)
	waitFor(t, f, "response processed", func(s Stats) bool { return s.Responses > n })
}

func waitFor(t *testing.T, f *Filter, what string, cond func(Stats) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := f.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// usage finds the usage of bucket id in a report.
func usage(t *testing.T, r *rlqsv3.RateLimitQuotaUsageReports, id map[string]string) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	t.Helper()
	for _, u := range r.GetBucketQuotaUsages() {
		if Key(u.GetBucketId().GetBucket()) == Key(id) {
			return u
		}
	}
	t.Fatalf("report %v has no usage for bucket %v", r, id)
	return nil
}

func checkUsage(t *testing.T, u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, allowed, denied uint64, elapsed int64) {
	t.Helper()
	if u.GetNumRequestsAllowed() != allowed || u.GetNumRequestsDenied() != denied {
		t.Errorf("bucket %v: allowed/denied = %d/%d, want %d/%d",
			u.GetBucketId().GetBucket(), u.GetNumRequestsAllowed(), u.GetNumRequestsDenied(), allowed, denied)
	}
	if u.GetTimeElapsed() == nil {
		t.Errorf("bucket %v: time_elapsed unset", u.GetBucketId().GetBucket())
	} else if u.GetTimeElapsed().GetSeconds() != elapsed || u.GetTimeElapsed().GetNanos() != 0 {
		t.Errorf("bucket %v: time_elapsed = %v, want %ds", u.GetBucketId().GetBucket(), u.GetTimeElapsed().AsDuration(), elapsed)
	}
}

func assignAction(id map[string]string, ttl *durationpb.Duration, s *typev3.RateLimitStrategy) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: ttl,
				RateLimitStrategy:    s,
			},
		},
	}
}

func abandonAction(id map[string]string) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{},
		},
	}
}

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

func tokenBucketStrategy(maxTokens, perFill uint32, interval time.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     maxTokens,
		TokensPerFill: wrapperspb.UInt32(perFill),
		FillInterval:  durationpb.New(interval),
	}}}
}

func secs(n int64) *durationpb.Duration { return &durationpb.Duration{Seconds: n} }

// allowN makes n requests and returns how many were allowed.
func allowN(f *Filter, id map[string]string, n int) int {
	got := 0
	for range n {
		if f.Allow(id) {
			got++
		}
	}
	return got
}

// subscribe makes the first request of id and returns the stream it went out
// on, checking the subscription report.
func subscribe(t *testing.T, h *harness, f *Filter, id map[string]string) *fakeStream {
	t.Helper()
	f.Allow(id)
	fs := h.nextStream()
	r := fs.next(t)
	if len(r.GetBucketQuotaUsages()) != 1 {
		t.Fatalf("subscription report has %d usages, want 1", len(r.GetBucketQuotaUsages()))
	}
	return fs
}

var (
	idA = map[string]string{"name": "a", "tier": "free"}
	idB = map[string]string{"name": "b"}
)

func TestSubscriptionOnFirstHit(t *testing.T) {
	h := newHarness(t)
	clock := newFakeClock()
	f := h.filter(Config{Domain: "dom", Now: clock.Now})

	if !f.Allow(idA) {
		t.Fatal("first request denied under ALLOW_ALL")
	}
	fs := h.nextStream()
	r := fs.next(t)
	if r.GetDomain() != "dom" {
		t.Errorf("domain = %q, want dom", r.GetDomain())
	}
	if len(r.GetBucketQuotaUsages()) != 1 {
		t.Fatalf("subscription report has %d usages, want 1", len(r.GetBucketQuotaUsages()))
	}
	checkUsage(t, usage(t, r, idA), 1, 0, 0)

	// A second bucket subscribes with a report of its own, on the same stream.
	clock.Advance(3 * time.Second)
	f.Allow(idB)
	r = fs.next(t)
	if len(r.GetBucketQuotaUsages()) != 1 || r.GetDomain() != "dom" {
		t.Fatalf("second subscription report = %v", r)
	}
	checkUsage(t, usage(t, r, idB), 1, 0, 0)

	// Later requests of a held bucket send nothing until the next tick.
	f.Allow(idA)
	f.Allow(idB)
	if s, _ := f.Bucket(idA); s.PendingAllowed != 1 {
		t.Errorf("pending allowed = %d, want 1", s.PendingAllowed)
	}
	if got := f.Stats(); got.StreamsOpened != 1 || got.Buckets[Key(idA)].Subscriptions != 1 {
		t.Errorf("streams opened = %d, subscriptions = %d; want 1 and 1", got.StreamsOpened, got.Buckets[Key(idA)].Subscriptions)
	}
}

func TestSubscriptionDenyAll(t *testing.T) {
	h := newHarness(t)
	f := h.filter(Config{NoAssignment: DenyAll, Now: newFakeClock().Now})
	if f.Allow(idA) {
		t.Fatal("first request allowed under DENY_ALL")
	}
	r := h.nextStream().next(t)
	checkUsage(t, usage(t, r, idA), 0, 1, 0)
	if f.Allow(idA) {
		t.Error("unassigned bucket allowed a request under DENY_ALL")
	}
}

func TestPeriodicReport(t *testing.T) {
	h := newHarness(t)
	clock := newFakeClock()
	f := h.filter(Config{Now: clock.Now})

	// Ticks before the first bucket have no timer to come from.
	f.Tick()

	fs := subscribe(t, h, f, idA)
	clock.Advance(1000 * time.Millisecond)
	f.Allow(idB)
	checkUsage(t, usage(t, fs.next(t), idB), 1, 0, 0)

	allowN(f, idA, 3)
	allowN(f, idB, 2)
	clock.Advance(1700 * time.Millisecond) // A: 2.7 s since its last report, B: 1.7 s
	f.Tick()
	r := fs.next(t)
	if len(r.GetBucketQuotaUsages()) != 2 {
		t.Fatalf("tick report has %d usages, want 2: %v", len(r.GetBucketQuotaUsages()), r)
	}
	if r.GetDomain() != "test-domain" {
		t.Errorf("domain = %q", r.GetDomain())
	}
	checkUsage(t, usage(t, r, idA), 3, 0, 2)
	checkUsage(t, usage(t, r, idB), 2, 0, 1)

	// Counters restart after each report, and so does the elapsed time.
	f.Allow(idA)
	clock.Advance(1999 * time.Millisecond)
	f.Tick()
	r = fs.next(t)
	checkUsage(t, usage(t, r, idA), 1, 0, 1)
	checkUsage(t, usage(t, r, idB), 0, 0, 1)

	// Denied requests are reported as such.
	respond(t, f, fs, assignAction(idA, secs(60), blanket(typev3.RateLimitStrategy_DENY_ALL)))
	allowN(f, idA, 4)
	clock.Advance(5 * time.Second)
	f.Tick()
	r = fs.next(t)
	checkUsage(t, usage(t, r, idA), 0, 4, 5)
	if s := f.Stats(); s.Ticks != 3 {
		t.Errorf("ticks = %d, want 3 (the tick before the first bucket does nothing)", s.Ticks)
	}
}

func TestBlanketRules(t *testing.T) {
	h := newHarness(t)
	clock := newFakeClock()
	f := h.filter(Config{Now: clock.Now})
	fs := subscribe(t, h, f, idA)

	respond(t, f, fs, assignAction(idA, secs(60), blanket(typev3.RateLimitStrategy_DENY_ALL)))
	if got := allowN(f, idA, 5); got != 0 {
		t.Errorf("DENY_ALL allowed %d of 5", got)
	}
	st, _ := f.Bucket(idA)
	if st.Phase != Assigned || st.Strategy.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Errorf("state = %+v, want assigned DENY_ALL", st)
	}
	respond(t, f, fs, assignAction(idA, secs(60), blanket(typev3.RateLimitStrategy_ALLOW_ALL)))
	if got := allowN(f, idA, 5); got != 5 {
		t.Errorf("ALLOW_ALL allowed %d of 5", got)
	}
	s := f.Stats()
	if bs := s.Buckets[Key(idA)]; bs.Assignments != 2 || bs.Allowed != 6 || bs.Denied != 5 {
		t.Errorf("bucket stats = %+v", bs)
	}
}

func TestTokenBucketStartsFullAndRefills(t *testing.T) {
	h := newHarness(t)
	clock := newFakeClock()
	f := h.filter(Config{Now: clock.Now})
	fs := subscribe(t, h, f, idA)

	// 6 tokens per 2.9 s fill at 6/2 = 3 tokens a second: Envoy keeps only
	// the whole seconds of fill_interval.
	respond(t, f, fs, assignAction(idA, secs(86400), tokenBucketStrategy(10, 6, 2900*time.Millisecond)))
	st, _ := f.Bucket(idA)
	if !st.TokenBucket || st.Tokens != 10 || st.MaxTokens != 10 || st.FillRate != 3 {
		t.Fatalf("state = %+v, want a full bucket of 10 filling at 3/s", st)
	}
	if got := allowN(f, idA, 15); got != 10 {
		t.Fatalf("new bucket allowed %d of 15, want its 10 tokens", got)
	}
	// Waits stay clear of exact token boundaries, where Envoy's float
	// arithmetic may land either side.
	clock.Advance(1100 * time.Millisecond) // 3.3 tokens
	if got := allowN(f, idA, 5); got != 3 {
		t.Errorf("after 1.1 s allowed %d, want 3", got)
	}
	// Fractions carry over: 0.3 + 1.5 tokens allow one request, and the 0.8
	// left with another 0.3 allow one more.
	clock.Advance(500 * time.Millisecond)
	if got := allowN(f, idA, 3); got != 1 {
		t.Errorf("after a further 0.5 s allowed %d, want 1", got)
	}
	clock.Advance(100 * time.Millisecond)
	if got := allowN(f, idA, 3); got != 1 {
		t.Errorf("after a further 0.1 s allowed %d, want 1", got)
	}
	// The bucket never holds more than max_tokens. (Draining it at a single
	// instant may fall one short: each request moves the bucket's time
	// mark by a third of a second, and the float error adds up, as it does
	// in Envoy.)
	clock.Advance(time.Hour)
	if st, _ := f.Bucket(idA); st.Tokens != 10 {
		t.Errorf("after an hour the bucket holds %v tokens, want 10", st.Tokens)
	}
	if got := allowN(f, idA, 20); got < 9 || got > 10 {
		t.Errorf("after an hour allowed %d, want 10", got)
	}
}

func TestTokenBucketSubSecondInterval(t *testing.T) {
	h := newHarness(t)
	clock := newFakeClock()
	f := h.filter(Config{Now: clock.Now})
	fs := subscribe(t, h, f, idA)

	// A fill_interval under a second is zero whole seconds: Envoy divides by
	// zero and the bucket fills infinitely fast.
	respond(t, f, fs, assignAction(idA, secs(3600), tokenBucketStrategy(1, 1, 500*time.Millisecond)))
	if got := allowN(f, idA, 100); got != 100 {
		t.Errorf("sub-second fill_interval allowed %d of 100, want all", got)
	}
	if st, _ := f.Bucket(idA); !math.IsInf(st.FillRate, 1) {
		t.Errorf("fill rate = %v, want +Inf", st.FillRate)
	}
}

func TestTokenBucketReplacedKeepsFillRatio(t *testing.T) {
	h := newHarness(t)
	clock := newFakeClock()
	f := h.filter(Config{Now: clock.Now})
	fs := subscribe(t, h, f, idA)

	respond(t, f, fs, assignAction(idA, secs(3600), tokenBucketStrategy(10, 1, time.Second)))
	if got := allowN(f, idA, 5); got != 5 {
		t.Fatalf("allowed %d of 5", got)
	}
	// Half full; 20 × 0.5 = 10 tokens in the new bucket.
	respond(t, f, fs, assignAction(idA, secs(3600), tokenBucketStrategy(20, 2, time.Second)))
	st, _ := f.Bucket(idA)
	if st.Tokens != 10 || st.MaxTokens != 20 || st.FillRate != 2 {
		t.Fatalf("state = %+v, want 10 of 20 tokens filling at 2/s", st)
	}
	if got := allowN(f, idA, 15); got != 10 {
		t.Errorf("replaced bucket allowed %d of 15, want 10", got)
	}

	// The carried ratio counts fractional tokens and truncates the result:
	// 2.5 of 20 left is 1/8, and 1/8 of 7 is 0.875, so the new bucket starts
	// empty.
	clock.Advance(1250 * time.Millisecond)
	respond(t, f, fs, assignAction(idA, secs(3600), tokenBucketStrategy(7, 7, time.Second)))
	st, _ = f.Bucket(idA)
	if st.Tokens != 0 || st.MaxTokens != 7 {
		t.Fatalf("state = %+v, want an empty bucket of 7", st)
	}
	if f.Allow(idA) {
		t.Error("empty bucket allowed a request")
	}

	// A token bucket after a blanket rule starts full.
	respond(t, f, fs, assignAction(idA, secs(3600), blanket(typev3.RateLimitStrategy_ALLOW_ALL)))
	respond(t, f, fs, assignAction(idA, secs(3600), tokenBucketStrategy(4, 1, time.Second)))
	if got := allowN(f, idA, 6); got != 4 {
		t.Errorf("token bucket after a blanket rule allowed %d of 6, want 4", got)
	}
}

func TestIdenticalTokenBucketKeepsTokens(t *testing.T) {
	h := newHarness(t)
	clock := newFakeClock()
	f := h.filter(Config{Now: clock.Now})
	fs := subscribe(t, h, f, idA)

	respond(t, f, fs, assignAction(idA, secs(10), tokenBucketStrategy(3, 1, time.Second)))
	if got := allowN(f, idA, 5); got != 3 {
		t.Fatalf("allowed %d of 5, want 3", got)
	}
	clock.Advance(8 * time.Second) // would refill, but take the tokens again
	allowN(f, idA, 3)
	respond(t, f, fs, assignAction(idA, secs(10), tokenBucketStrategy(3, 1, time.Second)))
	if f.Allow(idA) {
		t.Error("identical assignment refilled the bucket")
	}
	// It does restart the TTL.
	st, _ := f.Bucket(idA)
	if want := clock.Now().Add(10 * time.Second); !st.Expires.Equal(want) {
		t.Errorf("expires %v, want %v", st.Expires, want)
	}
	clock.Advance(9 * time.Second)
	if st, _ := f.Bucket(idA); st.Phase != Assigned {
		t.Errorf("phase = %v after 9 s of a renewed 10 s TTL", st.Phase)
	}

	// Envoy compares only the nanos of fill_interval, so a bucket that
	// differs in its seconds is identical and the old rate stays in force.
	respond(t, f, fs, assignAction(idA, secs(10), tokenBucketStrategy(3, 1, 60*time.Second)))
	st, _ = f.Bucket(idA)
	if st.FillRate != 1 || st.Strategy.GetTokenBucket().GetFillInterval().GetSeconds() != 60 {
		t.Errorf("state = %+v, want the 60 s assignment enforced at the old 1/s", st)
	}
}

func TestRequestsPerTimeUnitIgnored(t *testing.T) {
	h := newHarness(t)
	clock := newFakeClock()
	f := h.filter(Config{Now: clock.Now})
	fs := subscribe(t, h, f, idA)

	respond(t, f, fs, assignAction(idA, secs(30), blanket(typev3.RateLimitStrategy_DENY_ALL)))
	before, _ := f.Bucket(idA)
	clock.Advance(5 * time.Second)
	rpu := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
		RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: 100, TimeUnit: typev3.RateLimitUnit_SECOND},
	}}
	respond(t, f, fs,
		assignAction(idA, secs(600), rpu),
		assignAction(idA, secs(600), &typev3.RateLimitStrategy{}))
	after, _ := f.Bucket(idA)
	if after.Strategy.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL || !after.Expires.Equal(before.Expires) {
		t.Errorf("state = %+v, want the DENY_ALL assignment with its old expiry %v", after, before.Expires)
	}
	if f.Allow(idA) {
		t.Error("request allowed after an ignored requests_per_time_unit assignment")
	}
	if bs := f.Stats().Buckets[Key(idA)]; bs.Ignored != 2 || bs.Assignments != 1 {
		t.Errorf("ignored/assignments = %d/%d, want 2/1", bs.Ignored, bs.Assignments)
	}
}

func TestTTLExpiryToFallback(t *testing.T) {
	h := newHarness(t)
	clock := newFakeClock()
	f := h.filter(Config{
		Now:            clock.Now,
		Expired:        blanket(typev3.RateLimitStrategy_DENY_ALL),
		ExpiredTimeout: 30*time.Second + 900*time.Millisecond, // 30 whole seconds
	})
	fs := subscribe(t, h, f, idA)

	// 10.9 s of TTL is 10 whole seconds.
	respond(t, f, fs, assignAction(idA, &durationpb.Duration{Seconds: 10, Nanos: 9e8}, blanket(typev3.RateLimitStrategy_ALLOW_ALL)))
	t0 := clock.Now()
	clock.Advance(9999 * time.Millisecond)
	if !f.Allow(idA) {
		t.Fatal("assignment denied before its TTL")
	}
	clock.Advance(time.Millisecond)
	if f.Allow(idA) {
		t.Fatal("request allowed after the TTL: the DENY_ALL fallback should be in force")
	}
	st, _ := f.Bucket(idA)
	if st.Phase != Fallback || !st.Expires.Equal(t0.Add(40*time.Second)) {
		t.Errorf("state = %+v, want the fallback until %v", st, t0.Add(40*time.Second))
	}
	clock.Advance(29999 * time.Millisecond)
	if f.Allow(idA) {
		t.Fatal("fallback ended early")
	}
	clock.Advance(time.Millisecond)
	if !f.Allow(idA) {
		t.Fatal("fallback outlived its timeout")
	}
	if st, _ := f.Bucket(idA); st.Phase != Unassigned || st.Strategy != nil {
		t.Errorf("state = %+v, want unassigned", st)
	}

	// A new assignment during the fallback ends it.
	respond(t, f, fs, assignAction(idA, secs(5), blanket(typev3.RateLimitStrategy_ALLOW_ALL)))
	clock.Advance(5 * time.Second)
	if f.Allow(idA) {
		t.Fatal("expected the fallback")
	}
	respond(t, f, fs, assignAction(idA, secs(5), blanket(typev3.RateLimitStrategy_ALLOW_ALL)))
	if !f.Allow(idA) {
		t.Error("a new assignment did not replace the fallback")
	}
}

func TestTTLExpiryToTokenBucketFallback(t *testing.T) {
	h := newHarness(t)
	clock := newFakeClock()
	f := h.filter(Config{
		Now:            clock.Now,
		Expired:        tokenBucketStrategy(4, 1, time.Second),
		ExpiredTimeout: time.Minute,
	})
	fs := subscribe(t, h, f, idA)

	// An expired token bucket hands its fill ratio to a token bucket
	// fallback: 5 of 10 left becomes 2 of 4.
	respond(t, f, fs, assignAction(idA, secs(10), tokenBucketStrategy(10, 1, time.Hour)))
	allowN(f, idA, 5)
	clock.Advance(10 * time.Second)
	if got := allowN(f, idA, 5); got != 2 {
		t.Errorf("fallback token bucket allowed %d of 5, want 2", got)
	}
	st, _ := f.Bucket(idA)
	if st.Phase != Fallback || st.MaxTokens != 4 {
		t.Errorf("state = %+v, want the fallback token bucket", st)
	}
}

func TestTTLExpiryToNoAssignment(t *testing.T) {
	h := newHarness(t)
	clock := newFakeClock()
	f := h.filter(Config{Now: clock.Now, NoAssignment: DenyAll})
	fs := subscribe(t, h, f, idA)

	respond(t, f, fs, assignAction(idA, secs(5), blanket(typev3.RateLimitStrategy_ALLOW_ALL)))
	clock.Advance(4 * time.Second)
	if !f.Allow(idA) {
		t.Fatal("assignment denied before its TTL")
	}
	clock.Advance(time.Second)
	if f.Allow(idA) {
		t.Fatal("expired bucket allowed a request under DENY_ALL")
	}
	if st, _ := f.Bucket(idA); st.Phase != Unassigned {
		t.Errorf("phase = %v, want unassigned", st.Phase)
	}

	// An unset TTL, or one under a second, expires at once.
	respond(t, f, fs, assignAction(idA, nil, blanket(typev3.RateLimitStrategy_ALLOW_ALL)))
	if f.Allow(idA) {
		t.Error("assignment without a TTL stayed in force")
	}
	respond(t, f, fs, assignAction(idA, &durationpb.Duration{Nanos: 9e8}, blanket(typev3.RateLimitStrategy_ALLOW_ALL)))
	if f.Allow(idA) {
		t.Error("assignment with a 0.9 s TTL stayed in force")
	}

	// Without a timeout the fallback ends as soon as it starts.
	g := h.filter(Config{Now: clock.Now, NoAssignment: AllowAll, Expired: blanket(typev3.RateLimitStrategy_DENY_ALL)})
	gs := subscribe(t, h, g, idB)
	respond(t, g, gs, assignAction(idB, secs(5), blanket(typev3.RateLimitStrategy_ALLOW_ALL)))
	clock.Advance(5 * time.Second)
	if !g.Allow(idB) {
		t.Error("a fallback without a timeout was enforced")
	}
}

func TestAbandonThenResubscribe(t *testing.T) {
	h := newHarness(t)
	clock := newFakeClock()
	f := h.filter(Config{Now: clock.Now})
	fs := subscribe(t, h, f, idA)

	respond(t, f, fs, assignAction(idA, secs(600), blanket(typev3.RateLimitStrategy_DENY_ALL)))
	allowN(f, idA, 3) // unreported, and lost with the bucket
	respond(t, f, fs, abandonAction(idA))
	if _, held := f.Bucket(idA); held {
		t.Fatal("abandoned bucket still held")
	}

	// An abandoned bucket's next request is a first request again.
	clock.Advance(7 * time.Second)
	if !f.Allow(idA) {
		t.Fatal("first request after abandon denied under ALLOW_ALL")
	}
	r := fs.next(t)
	if len(r.GetBucketQuotaUsages()) != 1 {
		t.Fatalf("resubscription report = %v", r)
	}
	checkUsage(t, usage(t, r, idA), 1, 0, 0)
	bs := f.Stats().Buckets[Key(idA)]
	if bs.Abandons != 1 || bs.Subscriptions != 2 || !bs.Held || bs.Phase != Unassigned {
		t.Errorf("bucket stats = %+v", bs)
	}

	// Actions for buckets the filter does not hold change nothing.
	respond(t, f, fs, assignAction(idB, secs(600), blanket(typev3.RateLimitStrategy_DENY_ALL)), abandonAction(idB))
	if _, held := f.Bucket(idB); held {
		t.Error("an action created a bucket")
	}
	if s := f.Stats(); s.UnknownBuckets != 2 {
		t.Errorf("unknown buckets = %d, want 2", s.UnknownBuckets)
	}

	// With every bucket abandoned, ticks still send a report.
	respond(t, f, fs, abandonAction(idA))
	f.Tick()
	if r := fs.next(t); len(r.GetBucketQuotaUsages()) != 0 || r.GetDomain() != "test-domain" {
		t.Errorf("report without buckets = %v", r)
	}
}

func TestReconnectAfterServerClose(t *testing.T) {
	h := newHarness(t)
	clock := newFakeClock()
	f := h.filter(Config{Now: clock.Now})
	fs := subscribe(t, h, f, idA)
	waitFor(t, f, "connected", func(s Stats) bool { return s.Connected })

	respond(t, f, fs, assignAction(idA, secs(100), blanket(typev3.RateLimitStrategy_DENY_ALL)))
	fs.end <- nil
	waitFor(t, f, "stream failure", func(s Stats) bool { return s.StreamFailures == 1 && !s.Connected })

	// The assignment outlives the stream.
	if f.Allow(idA) {
		t.Error("assignment lost with the stream")
	}
	// A bucket first hit while the stream is down loses its subscription
	// report, and its first request with it.
	clock.Advance(2 * time.Second)
	dropped := f.Stats().ReportsDropped
	if !f.Allow(idB) {
		t.Error("request denied while the stream is down: failures must fail open")
	}
	f.Allow(idB)
	if s := f.Stats(); s.ReportsDropped != dropped+1 {
		t.Errorf("reports dropped = %d, want %d", s.ReportsDropped, dropped+1)
	}

	// The next tick reopens the stream and reports on it.
	clock.Advance(1500 * time.Millisecond)
	f.Tick()
	fs2 := h.nextStream()
	r := fs2.next(t)
	if len(r.GetBucketQuotaUsages()) != 2 {
		t.Fatalf("first report on the new stream = %v, want the tick report of both buckets", r)
	}
	checkUsage(t, usage(t, r, idA), 0, 1, 3)
	checkUsage(t, usage(t, r, idB), 1, 0, 1)
	s := f.Stats()
	if s.StreamsOpened != 2 || s.Reconnects != 1 {
		t.Errorf("streams opened = %d, reconnects = %d; want 2 and 1", s.StreamsOpened, s.Reconnects)
	}
	// Assignments on the new stream apply as before.
	respond(t, f, fs2, assignAction(idB, secs(100), blanket(typev3.RateLimitStrategy_DENY_ALL)))
	if f.Allow(idB) {
		t.Error("assignment on the new stream not enforced")
	}
	// The assignment received on the old stream still runs out on time.
	clock.Advance(96500 * time.Millisecond)
	if !f.Allow(idA) {
		t.Error("old assignment outlived its TTL")
	}
}

func TestServerDownFailsOpen(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens here
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f := New(conn, Config{Domain: "d", Now: newFakeClock().Now})
	defer f.Close()

	if !f.Allow(idA) {
		t.Fatal("request denied with the server down")
	}
	waitFor(t, f, "stream failure", func(s Stats) bool { return s.StreamFailures >= 1 })
	if !f.Allow(idA) {
		t.Error("request denied with the server down")
	}
	f.Tick()
	waitFor(t, f, "second stream failure", func(s Stats) bool { return s.StreamFailures >= 2 })
	if s := f.Stats(); s.ReportsSent != 0 || s.ReportsDropped != 2 || s.Reconnects != 1 {
		t.Errorf("stats = %+v", s)
	}
}

func TestStartTicks(t *testing.T) {
	h := newHarness(t)
	f := h.filter(Config{ReportInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.Start(ctx)

	fs := subscribe(t, h, f, idA)
	// Periodic reports follow on their own.
	for range 2 {
		r := fs.next(t)
		if u := usage(t, r, idA); u.GetNumRequestsAllowed() != 0 || u.GetNumRequestsDenied() != 0 {
			t.Errorf("periodic report %v counts requests that were never made", r)
		}
	}

	cancel()
	f.Close()
	if s := f.Stats(); s.Connected {
		t.Error("connected after Close")
	}
}

func TestConcurrentAllow(t *testing.T) {
	h := newHarness(t)
	clock := newFakeClock()
	f := h.filter(Config{Now: clock.Now})
	fs := subscribe(t, h, f, idA)
	respond(t, f, fs, assignAction(idA, secs(3600), tokenBucketStrategy(500, 1, time.Hour)))

	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if f.Allow(idA) {
					allowed.Add(1)
				}
				_ = f.Stats()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 10 {
			f.Tick()
		}
	}()
	wg.Wait()
	f.Tick() // reports what came after the last concurrent tick
	if got := allowed.Load(); got != 500 {
		t.Errorf("allowed %d of 1600, want the bucket's 500 tokens", got)
	}
	var total uint64
	for range 11 {
		r := fs.next(t)
		for _, u := range r.GetBucketQuotaUsages() {
			total += u.GetNumRequestsAllowed() + u.GetNumRequestsDenied()
		}
	}
	if total != 1600 {
		t.Errorf("reports count %d requests, want 1600", total)
	}
}

func TestKey(t *testing.T) {
	if Key(map[string]string{"a": "b", "c": "d"}) != Key(map[string]string{"c": "d", "a": "b"}) {
		t.Error("key depends on map order")
	}
	if Key(map[string]string{"a": "b;c=d"}) == Key(map[string]string{"a": "b", "c": "d"}) {
		t.Error("distinct ids share a key")
	}
}
