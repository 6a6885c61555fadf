package envoyrls

import (
	"context"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/storetest"
)

const testConfig = `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: a
    rate_limit: {name: a-limit, unit: minute, requests_per_unit: 2}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: ldap
    rate_limit: {unlimited: true}
  - key: banned
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: soft
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    value: /files*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: /api*
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: token_bucket}
  - key: half_minute
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 3}
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces: [{name: specific_limit}]
          requests_per_unit: 10
          unit: second
`

type env struct {
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
	clock  *storetest.Clock
	svc    *Service
	srv    *Server
}

// start serves a Service over real gRPC on a loopback port, with a memory
// store on a manual clock (one hour into storetest.Epoch, a day boundary).
// setup runs on the server before it serves.
func start(t *testing.T, opts Options, store admit.Store, setup ...func(*Server)) *env {
	t.Helper()
	clock := storetest.NewClock()
	clock.Set(time.Hour)
	if store == nil {
		m := memstore.New(&memstore.Options{Clock: clock.Now, SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		store = m
	}
	if opts.Config == nil {
		c, err := Parse(File{Name: "test.yaml", Data: []byte(testConfig)})
		if err != nil {
			t.Fatal(err)
		}
		opts.Config = c
	}
	opts.Decider = policy.NewDecider(store, 1)
	opts.Now = clock.Now
	svc, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(svc, nil)
	for _, f := range setup {
		f(srv)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Stop(ctx)
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &env{client: rlsv3.NewRateLimitServiceClient(conn), conn: conn, clock: clock, svc: svc, srv: srv}
}

func desc(kv ...string) *rlext.RateLimitDescriptor {
	d := &rlext.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlext.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (e *env) ask(t *testing.T, domain string, hits uint32, ds ...*rlext.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := e.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// codes returns the overall code, then every status's code.
func codesOf(r *rlsv3.RateLimitResponse) []rlsv3.RateLimitResponse_Code {
	out := []rlsv3.RateLimitResponse_Code{r.OverallCode}
	for _, s := range r.Statuses {
		out = append(out, s.Code)
	}
	return out
}

func same[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestFixedWindowPerValue(t *testing.T) {
	e := start(t, Options{}, nil)
	d := func(n string) *rlext.RateLimitDescriptor { return desc("message_type", "marketing", "to_number", n) }
	for i := 4; i >= 0; i-- {
		r := e.ask(t, "messaging", 0, d("2061111111"))
		st := r.Statuses[0]
		if r.OverallCode != ok || st.LimitRemaining != uint32(i) {
			t.Fatalf("request %d: %v remaining %d", 5-i, r.OverallCode, st.LimitRemaining)
		}
		if l := st.CurrentLimit; l.RequestsPerUnit != 5 || l.Unit != rlsv3.RateLimitResponse_RateLimit_DAY {
			t.Fatalf("current limit %v", l)
		}
		if got := st.DurationUntilReset.AsDuration(); got != 23*time.Hour {
			t.Fatalf("duration until reset %v, want 23h (the day's end)", got)
		}
	}
	r := e.ask(t, "messaging", 0, d("2061111111"))
	if !same(codesOf(r), []rlsv3.RateLimitResponse_Code{over, over}) || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("sixth: %v", r)
	}
	// Another number has its own counter; the next day starts afresh.
	if r := e.ask(t, "messaging", 0, d("2062222222")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("another number: %v", r)
	}
	e.clock.Set(24 * time.Hour)
	if r := e.ask(t, "messaging", 0, d("2061111111")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("next day: %v", r)
	}
}

// TestAllOrNothing: a request one descriptor refuses charges no other.
func TestAllOrNothing(t *testing.T) {
	e := start(t, Options{}, nil)
	r := e.ask(t, "messaging", 0, desc("a", "x"), desc("b", "x"))
	if !same(codesOf(r), []rlsv3.RateLimitResponse_Code{ok, ok, ok}) || r.Statuses[0].LimitRemaining != 1 || r.Statuses[1].LimitRemaining != 0 {
		t.Fatalf("first: %v", r)
	}
	r = e.ask(t, "messaging", 0, desc("a", "x"), desc("b", "x"))
	if !same(codesOf(r), []rlsv3.RateLimitResponse_Code{over, ok, over}) {
		t.Fatalf("second: %v", codesOf(r))
	}
	if r.Statuses[0].LimitRemaining != 0 && r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("a's status %v", r.Statuses[0])
	}
	if got := r.Statuses[1].DurationUntilReset.AsDuration(); got != time.Minute {
		t.Fatalf("b's reset %v, want the minute's end", got)
	}
	// a was not charged by the refused request: one left.
	if r := e.ask(t, "messaging", 0, desc("a", "x")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("a after the refused request: %v", r)
	}
	if r := e.ask(t, "messaging", 0, desc("a", "x")); r.OverallCode != over {
		t.Fatalf("a's third: %v", r)
	}
}

func TestHitsAddend(t *testing.T) {
	e := start(t, Options{}, nil)
	// The request's hits_addend is every descriptor's cost.
	if r := e.ask(t, "messaging", 3, desc("to_number", "1")); r.Statuses[0].LimitRemaining != 97 {
		t.Fatalf("hits 3: %v", r.Statuses[0])
	}
	// A descriptor's own hits_addend overrides it; 0 asks without counting.
	d := desc("to_number", "1")
	d.HitsAddend = wrapperspb.UInt64(0)
	if r := e.ask(t, "messaging", 7, d); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 97 {
		t.Fatalf("peek: %v", r.Statuses[0])
	}
	d.HitsAddend = wrapperspb.UInt64(10)
	if r := e.ask(t, "messaging", 7, d); r.Statuses[0].LimitRemaining != 87 {
		t.Fatalf("own hits 10: %v", r.Statuses[0])
	}
	// More than the limit: over the limit, not an error, nothing counted.
	d.HitsAddend = wrapperspb.UInt64(101)
	if r := e.ask(t, "messaging", 0, d, desc("a", "1")); !same(codesOf(r), []rlsv3.RateLimitResponse_Code{over, over, ok}) {
		t.Fatalf("hits over the limit: %v", codesOf(r))
	}
	d.HitsAddend = wrapperspb.UInt64(math.MaxUint64)
	if r := e.ask(t, "messaging", 0, d); r.OverallCode != over {
		t.Fatalf("hits 2^64-1: %v", r)
	}
	if r := e.ask(t, "messaging", 0, desc("to_number", "1"), desc("a", "1")); r.Statuses[0].LimitRemaining != 86 || r.Statuses[1].LimitRemaining != 1 {
		t.Fatalf("after refusals: %v", r.Statuses)
	}
}

func TestSpecialLimits(t *testing.T) {
	e := start(t, Options{}, nil)
	for i := 0; i < 3; i++ {
		r := e.ask(t, "messaging", 0, desc("ldap", "x"), desc("banned", "x"), desc("soft", "x"), desc("nothing", "x"))
		if !same(codesOf(r), []rlsv3.RateLimitResponse_Code{over, ok, over, ok, ok}) {
			t.Fatalf("request %d: %v", i, codesOf(r))
		}
		if s := r.Statuses[0]; s.LimitRemaining != math.MaxUint32 || s.CurrentLimit != nil {
			t.Fatalf("unlimited: %v", s)
		}
		if s := r.Statuses[1]; s.CurrentLimit.GetRequestsPerUnit() != 0 || s.DurationUntilReset.AsDuration() != time.Second {
			t.Fatalf("banned: %v", s)
		}
		if s := r.Statuses[3]; s.CurrentLimit != nil {
			t.Fatalf("no limit: %v", s)
		}
	}
	// shadow_mode: over its limit, the status stays OK.
	for i := 0; i < 3; i++ {
		r := e.ask(t, "messaging", 0, desc("soft", "x"))
		if r.OverallCode != ok || r.Statuses[0].Code != ok {
			t.Fatalf("shadow request %d: %v", i, r)
		}
	}
}

func TestWildcardsAndShareThreshold(t *testing.T) {
	e := start(t, Options{}, nil)
	// /api* values each have their own counter of 2.
	for _, p := range []string{"/api/a", "/api/b"} {
		for i := 0; i < 2; i++ {
			if r := e.ask(t, "messaging", 0, desc("path", p)); r.OverallCode != ok {
				t.Fatalf("%s %d: %v", p, i, r)
			}
		}
	}
	// /files* values share one counter of 2.
	e.ask(t, "messaging", 0, desc("path", "/files/a"))
	e.ask(t, "messaging", 0, desc("path", "/files/b"))
	if r := e.ask(t, "messaging", 0, desc("path", "/files/c")); r.OverallCode != over {
		t.Fatalf("shared wildcard counter: %v", r)
	}
}

func TestReplaces(t *testing.T) {
	e := start(t, Options{}, nil)
	both := func() *rlsv3.RateLimitResponse {
		return e.ask(t, "messaging", 0, desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps"))
	}
	r := both()
	if r.Statuses[0].CurrentLimit != nil || r.Statuses[1].CurrentLimit.GetRequestsPerUnit() != 10 {
		t.Fatalf("the replaced limit still applies: %v", r.Statuses)
	}
	for i := 0; i < 9; i++ {
		both()
	}
	if r := both(); !same(codesOf(r), []rlsv3.RateLimitResponse_Code{over, ok, over}) {
		t.Fatalf("eleventh: %v", codesOf(r))
	}
	// The replaced limit was never counted: alone, it has all 5.
	if r := e.ask(t, "messaging", 0, desc("key_1", "value_1", "user", "bkthomps")); r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("specific_limit alone: %v", r.Statuses[0])
	}
}

func TestAlgorithmAndMultiplier(t *testing.T) {
	e := start(t, Options{}, nil)
	for i := 0; i < 2; i++ {
		if r := e.ask(t, "messaging", 0, desc("bucket", "x")); r.OverallCode != ok {
			t.Fatalf("bucket %d: %v", i, r)
		}
	}
	r := e.ask(t, "messaging", 0, desc("bucket", "x"))
	// 500ms to the next token, sent in whole seconds as upstream sends it.
	if r.OverallCode != over || r.Statuses[0].DurationUntilReset.AsDuration() != time.Second {
		t.Fatalf("empty bucket: %v", r.Statuses[0])
	}
	e.clock.Set(time.Hour + 500*time.Millisecond) // a token bucket refills continuously
	if r := e.ask(t, "messaging", 0, desc("bucket", "x")); r.OverallCode != ok {
		t.Fatalf("after 500ms: %v", r)
	}

	e.clock.Set(time.Hour + 10*time.Second)
	r = e.ask(t, "messaging", 0, desc("half_minute", "x"))
	l := r.Statuses[0].CurrentLimit
	if l.Unit != rlsv3.RateLimitResponse_RateLimit_SECOND || l.UnitMultiplier.GetValue() != 30 || l.RequestsPerUnit != 3 {
		t.Fatalf("current limit %v", l)
	}
	if got := r.Statuses[0].DurationUntilReset.AsDuration(); got != 20*time.Second {
		t.Fatalf("reset %v, want 20s (windows of 30s from the epoch)", got)
	}
}

func TestLimitOverride(t *testing.T) {
	e := start(t, Options{}, nil)
	d := desc("to_number", "1")
	d.Limit = &rlext.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
	for _, want := range []rlsv3.RateLimitResponse_Code{ok, ok, over} {
		r := e.ask(t, "messaging", 0, d)
		if r.OverallCode != want || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 2 {
			t.Fatalf("override: %v, want %v", r, want)
		}
	}
	// The configured limit of the same descriptor was not counted.
	if r := e.ask(t, "messaging", 0, desc("to_number", "1")); r.Statuses[0].LimitRemaining != 99 {
		t.Fatalf("configured limit: %v", r.Statuses[0])
	}
	// An unknown domain ignores overrides, as the original does.
	for i := 0; i < 3; i++ {
		if r := e.ask(t, "nowhere", 0, d); r.OverallCode != ok || r.Statuses[0].CurrentLimit != nil {
			t.Fatalf("unknown domain: %v", r)
		}
	}
	d.Limit.UnitMultiplier = wrapperspb.UInt32(0)
	if _, err := e.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: []*rlext.RateLimitDescriptor{d}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("multiplier 0: %v", err)
	}
}

func TestBadRequests(t *testing.T) {
	e := start(t, Options{}, nil)
	long := string(make([]byte, MaxEntryLen+1))
	many := make([]*rlext.RateLimitDescriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = desc("a", "x")
	}
	// envoyproxy/ratelimit answers an empty domain or descriptor list with
	// UNKNOWN (its service errors); Admit says what they are,
	// INVALID_ARGUMENT, as for its own bounds.
	for name, tc := range map[string]struct {
		req  *rlsv3.RateLimitRequest
		want codes.Code
	}{
		"no domain":      {&rlsv3.RateLimitRequest{Descriptors: []*rlext.RateLimitDescriptor{desc("a", "x")}}, codes.InvalidArgument},
		"no descriptors": {&rlsv3.RateLimitRequest{Domain: "messaging"}, codes.InvalidArgument},
		"too many":       {&rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: many}, codes.InvalidArgument},
		"long value":     {&rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: []*rlext.RateLimitDescriptor{desc("a", long)}}, codes.InvalidArgument},
		"no entries":     {&rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: []*rlext.RateLimitDescriptor{{}}}, codes.InvalidArgument},
		"empty key":      {&rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: []*rlext.RateLimitDescriptor{desc("", "x")}}, codes.InvalidArgument},
	} {
		_, err := e.client.ShouldRateLimit(context.Background(), tc.req)
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	// A descriptor value that is not UTF-8, sent as raw protobuf (a
	// client library refuses to encode it): INVALID_ARGUMENT, not the
	// gRPC library's INTERNAL.
	var entry, d, msg []byte
	entry = protowire.AppendTag(entry, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, "a")
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendBytes(entry, []byte{'x', 0xff})
	d = protowire.AppendTag(d, 1, protowire.BytesType)
	d = protowire.AppendBytes(d, entry)
	msg = protowire.AppendTag(msg, 1, protowire.BytesType)
	msg = protowire.AppendString(msg, "messaging")
	msg = protowire.AppendTag(msg, 2, protowire.BytesType)
	msg = protowire.AppendBytes(msg, d)
	var out rlsv3.RateLimitResponse
	err := e.conn.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", rawMessage(msg), &out, grpc.ForceCodecV2(rawCodec{}))
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("a descriptor value that is not UTF-8: %v, want INVALID_ARGUMENT", err)
	}
	// The server still answers.
	e.ask(t, "messaging", 0, desc("a", "x"))
}

func TestResponseHeaders(t *testing.T) {
	e := start(t, Options{ResponseHeaders: true}, nil)
	r := e.ask(t, "messaging", 0, desc("a", "x"), desc("to_number", "1"), desc("nothing", "x"))
	h := map[string]string{}
	for _, hv := range r.ResponseHeadersToAdd {
		h[hv.Key] = hv.Value
	}
	want := map[string]string{
		"x-ratelimit-limit":     `2, 2;w=60;name="a-limit", 100;w=86400`,
		"x-ratelimit-remaining": "1",
		"x-ratelimit-reset":     "60",
	}
	if len(h) != len(want) {
		t.Fatalf("headers %v", h)
	}
	for k, v := range want {
		if h[k] != v {
			t.Errorf("%s: %q, want %q", k, h[k], v)
		}
	}
	e2 := start(t, Options{}, nil)
	if r := e2.ask(t, "messaging", 0, desc("a", "x")); len(r.ResponseHeadersToAdd) != 0 {
		t.Fatalf("headers without ResponseHeaders: %v", r.ResponseHeadersToAdd)
	}
}

func TestReloadKeepsCounters(t *testing.T) {
	e := start(t, Options{}, nil)
	e.ask(t, "messaging", 0, desc("a", "x"))
	c, err := Parse(File{Name: "new.yaml", Data: []byte("domain: messaging\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")})
	if err != nil {
		t.Fatal(err)
	}
	e.svc.SetConfig(c)
	if r := e.ask(t, "messaging", 0, desc("a", "x")); r.Statuses[0].LimitRemaining != 1 || r.Statuses[0].CurrentLimit.RequestsPerUnit != 3 {
		t.Fatalf("after reload: %v", r.Statuses[0])
	}
	if r := e.ask(t, "messaging", 0, desc("b", "x")); r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("a limit removed by the reload still applies: %v", r.Statuses[0])
	}
}

// TestConcurrentExactBound hammers one descriptor from many goroutines
// over gRPC: exactly the limit is admitted.
func TestConcurrentExactBound(t *testing.T) {
	c, err := Parse(File{Name: "c.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 37}\n")})
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, Options{Config: c}, nil)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				resp, err := e.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlext.RateLimitDescriptor{desc("k", "v")}})
				if err != nil {
					t.Error(err)
					return
				}
				if resp.OverallCode == ok {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := admitted.Load(); n != 37 {
		t.Fatalf("admitted %d of 320, want exactly 37", n)
	}
}

func TestHealthAndReflection(t *testing.T) {
	// Reflection is off unless asked for: it tells anyone who reaches
	// the port what the server offers.
	closed := start(t, Options{}, nil)
	stream, err := reflectionpb.NewServerReflectionClient(closed.conn).ServerReflectionInfo(context.Background())
	if err == nil {
		// A stream the server ended says why on Recv; Send may only see
		// io.EOF.
		_ = stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("reflection without EnableReflection: %v, want Unimplemented", err)
	}

	e := start(t, Options{}, nil, (*Server).EnableReflection)
	h := healthpb.NewHealthClient(e.conn)
	for _, svc := range []string{"", ServiceName} {
		resp, err := h.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v", svc, resp, err)
		}
	}
	stream, err = reflectionpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	if !slices.Contains(names, ServiceName) || !slices.Contains(names, "grpc.health.v1.Health") {
		t.Fatalf("reflection lists %v", names)
	}
	_ = stream.CloseSend()

	// Stop: NOT_SERVING first, then no more calls.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e.srv.Stop(ctx)
	if _, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: []*rlext.RateLimitDescriptor{desc("a", "x")}}); err == nil {
		t.Fatal("answered after Stop")
	}
}

func catalogPolicy(t *testing.T) *policy.Policy {
	t.Helper()
	two, three := int64(2), int64(3)
	p, err := policy.Compile(&policy.Spec{
		Tiers: map[string]policy.TierSpec{"free": {Rules: []policy.RuleSpec{
			{Name: "user-requests", Scope: "user", Actions: []string{"*"}, Algorithm: "token_bucket", Rate: "1/s", Burst: &two},
			{Name: "tenant-requests", Scope: "tenant", Actions: []string{"*"}, Algorithm: "token_bucket", Rate: "1/min", Burst: &three},
			{Name: "exports", Scope: "tenant", Actions: []string{"export"}, Algorithm: "fixed_window", Limit: &two, Window: "1h"},
		}}},
		Tenants: map[string]policy.TenantSpec{
			"acme": {Tier: "free", APIKeysSHA256: []string{policy.HashKey("acme-key")}},
			"t2":   {Tier: "free"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCatalogDomain decides the "admit" domain against Admit's tenants,
// tiers and rules: descriptor entries name the tenant, user and action.
func TestCatalogDomain(t *testing.T) {
	p := catalogPolicy(t)
	e := start(t, Options{Policy: func() *policy.Policy { return p }}, nil)
	u := func(user string) *rlext.RateLimitDescriptor {
		return desc("tenant", "acme", "api_key", "acme-key", "user", user)
	}
	r := e.ask(t, "admit", 0, u("u1"))
	l := r.Statuses[0].CurrentLimit
	if r.OverallCode != ok || l.Name != "user-requests" || l.RequestsPerUnit != 2 || l.Unit != rlsv3.RateLimitResponse_RateLimit_SECOND || l.UnitMultiplier.GetValue() != 2 {
		t.Fatalf("first: %v", r.Statuses[0])
	}
	if r := e.ask(t, "admit", 0, u("u1")); r.OverallCode != ok {
		t.Fatalf("second: %v", r)
	}
	r = e.ask(t, "admit", 0, u("u1"))
	if r.OverallCode != over || r.Statuses[0].CurrentLimit.Name != "user-requests" || r.Statuses[0].DurationUntilReset.AsDuration() != time.Second {
		t.Fatalf("u1's third: %v", r.Statuses[0])
	}
	// The tenant's bucket (3) is shared by its users: u2 gets one.
	if r := e.ask(t, "admit", 0, u("u2")); r.OverallCode != ok || r.Statuses[0].CurrentLimit.Name != "tenant-requests" || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("u2: %v", r.Statuses[0])
	}
	if r := e.ask(t, "admit", 0, u("u3")); r.OverallCode != over || r.Statuses[0].CurrentLimit.Name != "tenant-requests" {
		t.Fatalf("u3: %v", r.Statuses[0])
	}

	// Two descriptors of one tenant charge its bucket once, with both costs.
	r = e.ask(t, "admit", 0, desc("tenant", "t2", "user", "a"), desc("tenant", "t2", "user", "b"))
	if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 1 || r.Statuses[1].LimitRemaining != 1 {
		t.Fatalf("two users of t2: %v", r.Statuses)
	}
	// generic_key names the action when no action entry is sent.
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, over} {
		e.clock.Set(time.Hour + time.Duration(i+1)*20*time.Minute) // buckets refilled, same hour window
		r := e.ask(t, "admit", 2, desc("tenant", "t2", "generic_key", "export"))
		if r.OverallCode != want {
			t.Fatalf("export %d: %v", i, r.Statuses[0])
		}
	}

	// The API key names the tenant; a key of another tenant is refused.
	e.clock.Set(3 * time.Hour)
	if r := e.ask(t, "admit", 0, desc("api_key", "acme-key", "user", "k")); r.OverallCode != ok || r.Statuses[0].CurrentLimit == nil {
		t.Fatalf("by API key: %v", r)
	}
	for name, tc := range map[string]struct {
		d    *rlext.RateLimitDescriptor
		want codes.Code
	}{
		"tenant twice":       {desc("tenant", "acme", "api_key", "acme-key", "tenant", "t2"), codes.InvalidArgument},
		"user twice":         {desc("tenant", "t2", "user", "a", "user", "b"), codes.InvalidArgument},
		"an address twice":   {desc("tenant", "t2", "remote_address", "192.0.2.1", "ip", "192.0.2.2"), codes.InvalidArgument},
		"an attribute twice": {desc("tenant", "t2", "region", "eu", "region", "us"), codes.InvalidArgument},
		"unknown tenant":     {desc("tenant", "nobody", "user", "x"), codes.PermissionDenied},
		"unknown key":        {desc("api_key", "wrong", "user", "x"), codes.Unauthenticated},
		"another's key":      {desc("tenant", "t2", "api_key", "acme-key"), codes.PermissionDenied},
		"keyed without key":  {desc("tenant", "acme", "user", "x"), codes.Unauthenticated},
	} {
		_, err := e.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "admit", Descriptors: []*rlext.RateLimitDescriptor{tc.d}})
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	_, err := e.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "admit",
		Descriptors: []*rlext.RateLimitDescriptor{desc("tenant", "t2", "user", string(make([]byte, 300)))}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("long user: %v, want InvalidArgument", err)
	}
	// A YAML domain named like the catalog domain takes precedence.
	c, err := Parse(File{Name: "a.yaml", Data: []byte("domain: admit\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 9}\n")})
	if err != nil {
		t.Fatal(err)
	}
	e.svc.SetConfig(c)
	if r := e.ask(t, "admit", 0, desc("tenant", "acme")); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 9 {
		t.Fatalf("YAML domain admit: %v", r.Statuses[0])
	}
}

// failingStore is a store that is down.
type failingStore struct{ admit.Store }

func (failingStore) Decide(context.Context, []admit.Charge, *admit.Decision) error {
	return admit.Errorf(admit.CodeUnavailable, "store down")
}

func TestStoreDown(t *testing.T) {
	for _, tc := range []struct {
		onError string
		want    codes.Code
	}{{"open", codes.OK}, {"closed", codes.Unavailable}, {"local", codes.OK}} {
		t.Run(tc.onError, func(t *testing.T) {
			p, err := policy.Compile(&policy.Spec{OnError: tc.onError})
			if err != nil {
				t.Fatal(err)
			}
			var events []Event
			var mu sync.Mutex
			stats := NewUpstreamStats(0.8)
			e := start(t, Options{Policy: func() *policy.Policy { return p }, Stats: stats, Observe: func(ev Event) {
				mu.Lock()
				events = append(events, ev)
				mu.Unlock()
			}}, failingStore{})
			var last *rlsv3.RateLimitResponse
			for i := 0; i < 3; i++ {
				resp, err := e.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: []*rlext.RateLimitDescriptor{desc("b", "x")}})
				if status.Code(err) != tc.want {
					t.Fatalf("request %d: %v, want %v", i, err, tc.want)
				}
				last = resp
			}
			mu.Lock()
			defer mu.Unlock()
			if len(events) != 3 {
				t.Fatalf("%d events", len(events))
			}
			// envoyproxy/ratelimit's statistics count each failure of Redis.
			if errs := slices.IndexFunc(stats.Counters(), func(c UpstreamCounter) bool {
				return c.Name == "ratelimit.service.call.should_rate_limit.redis_error" && c.Value == 3
			}); errs < 0 {
				t.Errorf("statistics %v: want 3 redis_error", stats.Counters())
			}
			switch tc.onError {
			case "open":
				if last.OverallCode != ok || events[2].Outcome != policy.FailedOpen {
					t.Fatalf("fail open: %v %+v", last, events[2])
				}
			case "local":
				// The local limiter decides: b's limit of 1 per minute holds.
				if last.OverallCode != over || events[2].Outcome != policy.FailedLocal || events[2].Allowed {
					t.Fatalf("fail local: %v %+v", last, events[2])
				}
			case "closed":
				if events[2].Err == nil {
					t.Fatal("no error observed")
				}
			}
		})
	}
}

// TestShortDecision: a store that answers fewer results than charges is
// an internal error, never a read past the results; the same store made
// whole answers again.
func TestShortDecision(t *testing.T) {
	m := memstore.New(nil)
	t.Cleanup(func() { m.Close() })
	f := &storetest.Faulty{Store: m}
	f.Short.Store(true)
	p := catalogPolicy(t)
	e := start(t, Options{Policy: func() *policy.Policy { return p }}, f)
	two := []*rlext.RateLimitDescriptor{desc("tenant", "t2", "user", "a"), desc("tenant", "t2", "user", "b")}
	if _, err := e.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "admit", Descriptors: two}); status.Code(err) != codes.Internal {
		t.Fatalf("short decision: %v, want Internal", err)
	}
	f.Short.Store(false)
	// The short decision was charged (tenant-requests has 3, 2 are gone).
	if r := e.ask(t, "admit", 0, desc("tenant", "t2", "user", "c")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("whole again: %v", r)
	}
}

func TestHealthFollowsTheStore(t *testing.T) {
	svc, err := New(Options{Decider: policy.NewDecider(failingStore{}, 1)})
	if err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	srv := NewServer(svc, func(context.Context) error {
		if down.Load() {
			return admit.Errorf(admit.CodeUnavailable, "store down")
		}
		return nil
	})
	srv.pollEvery = 10 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop(context.Background())
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h := healthpb.NewHealthClient(conn)
	wait := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			resp, err := h.Check(context.Background(), &healthpb.HealthCheckRequest{Service: ServiceName})
			if err == nil && resp.Status == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("health: %v %v, want %v", resp, err, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	wait(healthpb.HealthCheckResponse_SERVING)
	down.Store(true)
	wait(healthpb.HealthCheckResponse_NOT_SERVING)
	down.Store(false)
	wait(healthpb.HealthCheckResponse_SERVING)
}

// TestCatalogSharedLimitInventedTenants: on a global rule tenants share,
// the tenants a default tier lets descriptors invent are one anonymous
// class (by the client's address), not a class each: a flood of invented
// tenants from one address cannot shrink a catalog tenant's part.
func TestCatalogSharedLimitInventedTenants(t *testing.T) {
	hundred := int64(100)
	p, err := policy.Compile(&policy.Spec{
		UnknownTenant: "free",
		Global:        []policy.RuleSpec{{Name: "global", Scope: "global", Algorithm: "token_bucket", Rate: "1/h", Burst: &hundred}},
		Tiers:         map[string]policy.TierSpec{"free": {}},
		Tenants:       map[string]policy.TenantSpec{"victim": {Tier: "free"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, Options{Policy: func() *policy.Policy { return p }}, nil)
	e.ask(t, "admit", 0, desc("tenant", "victim", "remote_address", "198.51.100.7"))
	for i := range 200 {
		e.ask(t, "admit", 0, desc("tenant", "invented-"+strconv.Itoa(i), "remote_address", "203.0.113.9"))
	}
	// The victim's part of the stock, beside one anonymous class: half.
	got := 1
	for e.ask(t, "admit", 0, desc("tenant", "victim", "remote_address", "198.51.100.7")).OverallCode == ok {
		got++
	}
	if got < 45 {
		t.Errorf("the victim got %d of the global bucket's 100 beside 200 invented tenants, want its half (the invented ones are one class)", got)
	}
}

// TestAnonymousAddressesFromTrustedPeersOnly: the anonymous callers'
// part of a shared limit is divided among their addresses, as a
// remote_address entry names them only when the peer is trusted to
// (Options.TrustedPeers). From another peer every address it names is
// the peer itself: a client that reaches the port cannot split the
// anonymous part into as many addresses as it likes (once, 250 invented
// addresses left a real anonymous client 7 of 300).
func TestAnonymousAddressesFromTrustedPeersOnly(t *testing.T) {
	hundred := int64(100)
	p, err := policy.Compile(&policy.Spec{
		Global: []policy.RuleSpec{{Name: "global", Scope: "global", Algorithm: "token_bucket", Rate: "1/h", Burst: &hundred}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, trusted := range []bool{false, true} {
		opts := Options{Policy: func() *policy.Policy { return p }}
		if trusted {
			opts.TrustedPeers = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		}
		e := start(t, opts, nil)
		b := desc("remote_address", "198.51.100.2")
		e.ask(t, "admit", 0, b) // b wants the limit too
		for n := 0; n < 200 && e.ask(t, "admit", 0, desc("remote_address", "203.0.113.9")).OverallCode == ok; n++ {
		}
		got := 0
		for e.ask(t, "admit", 0, b).OverallCode == ok {
			got++
		}
		switch {
		case trusted && got < 20:
			t.Errorf("from a trusted peer, an address beside another's flood got %d more, want its own part (about 24)", got)
		case !trusted && got != 0:
			t.Errorf("from an untrusted peer, the addresses it named got parts of their own: %d more for one after the others' flood", got)
		}
	}
}

// TestCallerGaveUp: a request whose caller has given up (its deadline
// passed) while the store was being asked is answered with the caller's
// error, not let through by on_error open: a client could otherwise choose
// its deadline to pass a spent limit. Red team, 2026-11-26: OK answers
// past a spent limit for deadlines of 200–500 µs.
func TestCallerGaveUp(t *testing.T) {
	m := memstore.New(nil)
	t.Cleanup(func() { m.Close() })
	f := &storetest.Faulty{Store: m}
	svc, err := New(Options{Decider: policy.NewDecider(f, 1), Config: parse(t, "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 1}}\n")})
	if err != nil {
		t.Fatal(err)
	}
	f.Down.Store(true)
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlext.RateLimitDescriptor{desc("k", "v")}}
	if r, err := svc.ShouldRateLimit(context.Background(), req); err != nil || r.OverallCode != ok {
		t.Fatalf("store down, on_error open: %v %v", r, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r, err := svc.ShouldRateLimit(ctx, req); status.Code(err) != codes.Canceled {
		t.Fatalf("caller gone, store down: %v %v, want Canceled", r, err)
	}
}

// rawMessage is a request already encoded; rawCodec sends it as it is and
// decodes answers as protobuf.
type rawMessage []byte

type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(rawMessage))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (rawCodec) Name() string { return "proto" }
