package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	rlqsfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/admitdev/admit/e2e/rlqsenvoy"
)

// rlqsFilter decodes deploy/envoy/envoy-rlqs.yaml and returns its rate
// limit quota filter's configuration, its bucket settings, and the
// filter's block of the file.
func rlqsFilter(t *testing.T) (*rlqsfilter.RateLimitQuotaFilterConfig, *rlqsfilter.RateLimitQuotaBucketSettings, string) {
	t.Helper()
	const file = "../deploy/envoy/envoy-rlqs.yaml"
	b := bootstrapOf(t, file)
	var hcm hcmv3.HttpConnectionManager
	if err := b.StaticResources.Listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	filters, order := httpFilters(t, &hcm)
	if want := "envoy.filters.http.jwt_authn envoy.filters.http.rate_limit_quota envoy.filters.http.router"; strings.Join(order, " ") != want {
		t.Fatalf("HTTP filters %v, want %s", order, want)
	}
	var cfg rlqsfilter.RateLimitQuotaFilterConfig
	if err := filters["envoy.filters.http.rate_limit_quota"].GetTypedConfig().UnmarshalTo(&cfg); err != nil {
		t.Fatal(err)
	}
	var settings rlqsfilter.RateLimitQuotaBucketSettings
	if err := cfg.GetBucketMatchers().GetOnNoMatch().GetAction().GetTypedConfig().UnmarshalTo(&settings); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	_, block, _ := strings.Cut(string(data), "# rlqs-filter:begin\n")
	block, _, _ = strings.Cut(block, "                  # rlqs-filter:end")
	return &cfg, &settings, block
}

// bucketID builds the bucket id Envoy builds from settings for a request
// with headers: string values as they are, request headers' values.
func bucketID(t *testing.T, settings *rlqsfilter.RateLimitQuotaBucketSettings, headers map[string]string) map[string]string {
	t.Helper()
	id := map[string]string{}
	for k, v := range settings.GetBucketIdBuilder().GetBucketIdBuilder() {
		if s, ok := v.GetValueSpecifier().(*rlqsfilter.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder_StringValue); ok {
			id[k] = s.StringValue
			continue
		}
		var h matcherv3.HttpRequestHeaderMatchInput
		if err := v.GetCustomValue().GetTypedConfig().UnmarshalTo(&h); err != nil {
			t.Fatalf("bucket id entry %s: %v", k, err)
		}
		id[k] = headers[h.GetHeaderName()]
	}
	return id
}

// TestQuotaEnvoyWiring: deploy/envoy/envoy-rlqs.yaml is an Envoy
// configuration Envoy's own types accept; docs/envoy.md shows its filter as
// it is; the bucket it builds for a request of tenant acme names the
// tenant's rule to `admit serve`, which assigns that Envoy a share of it.
func TestQuotaEnvoyWiring(t *testing.T) {
	cfg, settings, block := rlqsFilter(t)
	if cfg.GetRlqsServer().GetEnvoyGrpc().GetClusterName() != "admit_rlqs" || cfg.GetDomain() == "" {
		t.Fatalf("the filter asks %q of %v", cfg.GetDomain(), cfg.GetRlqsServer())
	}
	if settings.GetNoAssignmentBehavior().GetFallbackRateLimit() == nil || settings.GetExpiredAssignmentBehavior().GetFallbackRateLimit() == nil {
		t.Fatalf("bucket settings %v: want both fallbacks stated", settings)
	}
	docs, err := os.ReadFile("../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	// The docs show the block unindented.
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		lines = append(lines, strings.TrimPrefix(l, strings.Repeat(" ", 18)))
	}
	if !strings.Contains(string(docs), strings.Join(lines, "\n")) {
		t.Fatalf("docs/envoy.md does not show the filter of deploy/envoy/envoy-rlqs.yaml:\n%s", strings.Join(lines, "\n"))
	}

	id := bucketID(t, settings, map[string]string{"x-tenant-id": "acme", "x-user-id": "u1"})
	if id["tenant"] != "acme" || id["action"] != "read" || len(id) != 2 {
		t.Fatalf("bucket id %v", id)
	}
	a := startAdmit(t, "--config", rlqsConfig(t, false))
	conn, err := grpc.NewClient(a.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f := rlqsenvoy.New(conn, rlqsenvoy.Config{Domain: cfg.GetDomain(), ReportInterval: settings.GetReportingInterval().AsDuration()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.Start(ctx)
	defer f.Close()
	f.Allow(id)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := f.WaitFor(wctx, func(s rlqsenvoy.Stats) bool { return s.Buckets[rlqsenvoy.Key(id)].Assignments > 0 }); err != nil {
		t.Fatalf("no assignment: %v (%+v)", err, f.Stats())
	}
	st, _ := f.Bucket(id)
	tb := st.Strategy.GetTokenBucket()
	if tb == nil || float64(tb.GetTokensPerFill().GetValue())/float64(tb.GetFillInterval().GetSeconds()) > 200 {
		t.Fatalf("bucket %v: want a token bucket of tenant-reads (200/s) at most", st.Strategy)
	}
}
