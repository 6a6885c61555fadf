package envoyrls

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// egConfig is a RateLimitConfig shaped as Envoy Gateway builds one for a
// listener: a descriptor per route, then one per rule of its
// BackendTrafficPolicy (here a distinct header, x-user-id, at 3 a minute,
// and a rule without matches at 10 a minute).
func egConfig(domain string, perUser uint32) *rlsconfv3.RateLimitConfig {
	route := "httproute/default/backend/rule/0/match/0/*"
	return &rlsconfv3.RateLimitConfig{
		Name: domain, Domain: domain,
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key: route, Value: route,
			Descriptors: []*rlsconfv3.RateLimitDescriptor{
				{Key: "rule-0-match-0", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: perUser}},
				{Key: "rule-1-match--1", Value: "rule-1-match--1", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 10}},
			},
		}},
	}
}

func TestFromRateLimitConfigs(t *testing.T) {
	c, err := FromRateLimitConfigs(egConfig("default/eg/http", 3), &rlsconfv3.RateLimitConfig{
		Name: "other", Domain: "other",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "free", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true}},
			{Key: "soft", ShadowMode: true, RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_WEEK, RequestsPerUnit: 1, Name: "soft",
				Replaces: []*rlsconfv3.RateLimitReplace{{Name: "x"}}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Domains(), ","); got != "default/eg/http,other" {
		t.Fatalf("domains %s", got)
	}
	e := start(t, Options{Config: c}, nil)
	route := "httproute/default/backend/rule/0/match/0/*"
	// Envoy sends one descriptor per rule: the route entry, then the rule's.
	for i := range 4 {
		r := e.ask(t, "default/eg/http", 1, desc(route, route, "rule-0-match-0", "alice"), desc(route, route, "rule-1-match--1", "rule-1-match--1"))
		want := ok
		if i == 3 {
			want = over
		}
		if r.OverallCode != want {
			t.Fatalf("request %d: %v, want %v", i+1, r.OverallCode, want)
		}
		if i < 3 && r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 3 {
			t.Fatalf("limit %v", r.Statuses[0].CurrentLimit)
		}
	}
	if r := e.ask(t, "default/eg/http", 1, desc(route, route, "rule-0-match-0", "bob")); r.OverallCode != ok {
		t.Fatalf("another user: %v", r.OverallCode)
	}
	r := e.ask(t, "other", 1, desc("free", "x"), desc("soft", "y"), desc("soft", "y"))
	if got := codesOf(r); !same(got, []rlsv3.RateLimitResponse_Code{ok, ok, ok, ok}) {
		t.Fatalf("unlimited and shadow: %v", got)
	}
	if r.Statuses[0].LimitRemaining != 1<<32-1 || r.Statuses[1].CurrentLimit.GetUnit().String() != "WEEK" {
		t.Fatalf("statuses %v", r.Statuses)
	}
}

func TestFromRateLimitConfigsRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		cfgs []*rlsconfv3.RateLimitConfig
		want string
	}{
		"no unit": {[]*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "a", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{RequestsPerUnit: 1}}}}}, "xds:a:5:9: invalid rate limit unit"},
		"unlimited with a unit": {[]*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "a", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true, Unit: rlsconfv3.RateLimitUnit_DAY}}}}}, "should not specify rate limit unit when unlimited"},
		"empty key":                 {[]*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "a", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Value: "v"}}}}, "descriptor has empty key"},
		"no domain":                 {[]*rlsconfv3.RateLimitConfig{{Name: "a"}}, "xds:a"},
		"two resources, one domain": {[]*rlsconfv3.RateLimitConfig{egConfig("d", 1), {Name: "e", Domain: "d"}}, "duplicate domain 'd'"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := FromRateLimitConfigs(tc.cfgs...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// xdsServer is a management server built as Envoy Gateway builds its
// rate limit config server: go-control-plane's SotW server over a
// snapshot cache, on the aggregated discovery service. It records every
// request it is sent.
type xdsServer struct {
	cache cachev3.SnapshotCache
	addr  string
	reqs  chan *discoveryv3.DiscoveryRequest
	stop  func()
}

const xdsNode = "envoy-ratelimit"

func startXDS(t *testing.T, ln net.Listener) *xdsServer {
	t.Helper()
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	x := &xdsServer{cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil), addr: ln.Addr().String(), reqs: make(chan *discoveryv3.DiscoveryRequest, 100)}
	ctx, cancel := context.WithCancel(context.Background())
	g := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, x.cache, serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error { x.reqs <- r; return nil },
	}))
	done := make(chan struct{})
	go func() { g.Serve(ln); close(done) }()
	var once sync.Once
	x.stop = func() { once.Do(func() { cancel(); g.Stop(); <-done }) }
	t.Cleanup(x.stop)
	return x
}

func (x *xdsServer) set(t *testing.T, version string, cfgs ...*rlsconfv3.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.cache.SetSnapshot(context.Background(), xdsNode, snap); err != nil {
		t.Fatal(err)
	}
}

// next returns the next request the server was sent that answers a
// response (it carries a nonce), skipping the stream's first request.
func (x *xdsServer) next(t *testing.T) *discoveryv3.DiscoveryRequest {
	t.Helper()
	for {
		select {
		case r := <-x.reqs:
			if r.ResponseNonce != "" {
				return r
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the xDS client sent no answer in 10 s")
			return nil
		}
	}
}

// watch runs WatchXDS against addr; applied receives each configuration
// applied.
func watch(t *testing.T, addr string, apply func(*Config) error, refused ...func(string, error)) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		o := XDSOptions{Conn: conn, Node: &corev3.Node{Id: xdsNode}, Apply: apply, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}
		if len(refused) > 0 {
			o.Refused = refused[0]
		}
		done <- WatchXDS(ctx, o)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("WatchXDS returned %v", err)
		}
		conn.Close()
	})
}

func TestWatchXDS(t *testing.T) {
	x := startXDS(t, nil)
	x.set(t, "1", egConfig("default/eg/http", 3))
	e := start(t, Options{}, nil)
	applied := make(chan *Config, 10)
	watch(t, x.addr, func(c *Config) error {
		e.svc.SetConfig(c)
		applied <- c
		return nil
	})
	route := "httproute/default/backend/rule/0/match/0/*"
	ask := func() rlsv3.RateLimitResponse_Code {
		return e.ask(t, "default/eg/http", 1, desc(route, route, "rule-0-match-0", "alice")).OverallCode
	}

	// The first version is applied, then acknowledged.
	<-applied
	if r := x.next(t); r.VersionInfo != "1" || r.ErrorDetail != nil || r.TypeUrl != RateLimitConfigType {
		t.Fatalf("first answer %v", r)
	}
	for range 3 {
		if c := ask(); c != ok {
			t.Fatalf("under the limit: %v", c)
		}
	}
	if c := ask(); c != over {
		t.Fatalf("past 3: %v", c)
	}

	// A new version with a higher limit replaces it; counters are kept.
	x.set(t, "2", egConfig("default/eg/http", 5))
	<-applied
	if r := x.next(t); r.VersionInfo != "2" || r.ErrorDetail != nil {
		t.Fatalf("second answer %v", r)
	}
	if c := ask(); c != ok {
		t.Fatalf("4th under a limit of 5: %v", c)
	}

	// A version that cannot be read is refused (NACK, naming the error,
	// with the version still applied) and changes nothing.
	bad := &rlsconfv3.RateLimitConfig{Name: "bad", Domain: "bad", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{RequestsPerUnit: 1}}}}
	x.set(t, "3", egConfig("default/eg/http", 100), bad)
	r := x.next(t)
	if r.VersionInfo != "2" || r.ErrorDetail == nil || !strings.Contains(r.ErrorDetail.Message, "xds:bad") {
		t.Fatalf("a bad version's answer: %v", r)
	}
	if c := ask(); c != ok {
		t.Fatalf("5th under the kept limit of 5: %v", c)
	}
	if c := ask(); c != over {
		t.Fatalf("6th past the kept limit of 5: %v", c)
	}
	select {
	case <-applied:
		t.Fatal("a refused version was applied")
	default:
	}

	// The server sends the refused version again at once; it is refused
	// again, after a pause.
	if r := x.next(t); r.VersionInfo != "2" || r.ErrorDetail == nil {
		t.Fatalf("the bad version sent again: %v", r)
	}

	// An empty set of resources is the state of the world: no domains.
	x.set(t, "4")
	if c := <-applied; len(c.Domains()) != 0 {
		t.Fatalf("domains %v after an empty version", c.Domains())
	}
	for r := x.next(t); r.VersionInfo != "4"; r = x.next(t) {
		if r.ErrorDetail == nil {
			t.Fatalf("an answer that is neither a refusal of 3 nor 4's: %v", r)
		}
	}
}

func TestWatchXDSReconnects(t *testing.T) {
	x := startXDS(t, nil)
	x.set(t, "1", egConfig("d", 3))
	applied := make(chan *Config, 10)
	apply := func(c *Config) error { applied <- c; return nil }
	watch(t, x.addr, apply)
	<-applied
	x.next(t)

	// The management server restarts (Envoy Gateway's pod is replaced) on
	// the same address with a new version: the stream is opened again and
	// asks from the version it has.
	x.stop()
	ln, err := net.Listen("tcp", x.addr)
	if err != nil {
		t.Fatal(err)
	}
	y := startXDS(t, ln)
	y.set(t, "7", egConfig("e", 3))
	first := <-y.reqs
	if first.VersionInfo != "1" || first.Node.GetId() != xdsNode || first.TypeUrl != RateLimitConfigType {
		t.Fatalf("a new stream's request %v", first)
	}
	if c := <-applied; strings.Join(c.Domains(), ",") != "e" {
		t.Fatalf("after the restart: %v", c.Domains())
	}
	if r := y.next(t); r.VersionInfo != "7" {
		t.Fatalf("answer %v", r)
	}
}

func TestWatchXDSApplyRefuses(t *testing.T) {
	x := startXDS(t, nil)
	x.set(t, "1", egConfig("d", 3))
	refused := make(chan string, 100)
	watch(t, x.addr, func(*Config) error { return errTest }, func(version string, err error) {
		if err == errTest {
			refused <- version
		}
	})
	if r := x.next(t); r.VersionInfo != "" || r.ErrorDetail.GetMessage() != errTest.Error() {
		t.Fatalf("answer %v", r)
	}
	if v := <-refused; v != "1" {
		t.Fatalf("Refused told of version %q", v)
	}
}

var errTest = errors.New("the store cannot hold these rules")
