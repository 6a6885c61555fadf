package httplimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
)

// BenchmarkCheck is the middleware's hot path: identify by API key, user
// header and X-Forwarded-For from a trusted peer, resolve three rules,
// decide in the memory store, set the RateLimit headers.
func BenchmarkCheck(b *testing.B) { benchmarkCheck(b, nil) }

// BenchmarkCheckTraced is BenchmarkCheck with traces on, every decision
// sampled: the span of the decision and of its store call, batched to an
// exporter that drops them.
func BenchmarkCheckTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}))
	defer tp.Shutdown(context.Background())
	benchmarkCheck(b, tp)
}

// discard is a span exporter that sends nothing.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

func benchmarkCheck(b *testing.B, tp trace.TracerProvider) {
	const tenants, users = 100, 10000
	spec := &policy.Spec{
		Global: []policy.RuleSpec{tb("global", "global", nil, "100000000/s", 100000000)},
		Tiers: map[string]policy.TierSpec{"free": {Rules: []policy.RuleSpec{
			tb("user", "user", nil, "100000000/s", 100000000),
			tb("tenant", "tenant", nil, "100000000/s", 100000000),
		}}},
		Tenants: map[string]policy.TenantSpec{},
	}
	for i := range tenants {
		spec.Tenants["t"+strconv.Itoa(i)] = policy.TenantSpec{Tier: "free", APIKeysSHA256: []string{policy.HashKey("ak_" + strconv.Itoa(i))}}
	}
	p, err := policy.Compile(spec)
	if err != nil {
		b.Fatal(err)
	}
	st := memstore.New(nil)
	defer st.Close()
	lim, err := New(Options{Store: st, Policy: func() *policy.Policy { return p }, UserHeader: "X-User-Id",
		TrustedProxies: Proxies{mustProxies(b, "10.0.0.0/8")[0]}, TracerProvider: tp})
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]*http.Request, 1024)
	for i := range reqs {
		u := i * 9 % users
		r := httptest.NewRequest("GET", "/items/1", nil)
		r.RemoteAddr = "10.0.0.1:5000"
		r.Header.Set("X-API-Key", "ak_"+strconv.Itoa(u%tenants))
		r.Header.Set("X-User-Id", "user-"+strconv.Itoa(u))
		r.Header.Set("X-Forwarded-For", "198.51.100."+strconv.Itoa(u%250))
		reqs[i] = r
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := &headerWriter{h: http.Header{}}
		for pb.Next() {
			r := reqs[next.Add(1)%int64(len(reqs))]
			if !lim.Check(w, r) {
				b.Error("refused")
				return
			}
		}
	})
}

// headerWriter is a ResponseWriter that only keeps headers.
type headerWriter struct{ h http.Header }

func (w *headerWriter) Header() http.Header         { return w.h }
func (w *headerWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *headerWriter) WriteHeader(int)             {}
