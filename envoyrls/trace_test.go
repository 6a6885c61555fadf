package envoyrls

import (
	"context"
	"testing"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/metadata"

	"github.com/admitdev/admit/internal/tracing"
)

const (
	testTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	testParent = "00-" + testTrace + "-00f067aa0ba902b7-01"
)

func spanAttrs(s sdktrace.ReadOnlySpan) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

func decisionSpans(sr *tracetest.SpanRecorder) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == tracing.SpanName {
			out = append(out, s)
		}
	}
	return out
}

// TestTracedShouldRateLimit: a decision of the rate limit service is a
// span in the trace of the call's traceparent metadata, as the answer
// says: a refusal by its limit, with the domain.
func TestTracedShouldRateLimit(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	e := start(t, Options{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))}, nil)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", testParent)
	for range 3 { // hour limit of 2 on /api*
		if _, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: []*rlext.RateLimitDescriptor{desc("path", "/api/x")}}); err != nil {
			t.Fatal(err)
		}
	}
	spans := decisionSpans(sr)
	if len(spans) != 3 {
		t.Fatalf("%d decision spans", len(spans))
	}
	last := spanAttrs(spans[2])
	if last["admit.front_end"] != "envoy_rls" || last["admit.domain"] != "messaging" || last["admit.allowed"] != "false" || last["admit.denied_by"] == "" {
		t.Errorf("the refusal: %v", last)
	}
	if s := spans[2]; s.SpanContext().TraceID().String() != testTrace || s.Parent().SpanID().String() != "00f067aa0ba902b7" || !s.Parent().IsRemote() {
		t.Errorf("span %v, parent %v: want the metadata's trace", s.SpanContext(), s.Parent())
	}
}

// TestTracedQuotaReports: each usage report of a quota stream is a span
// in the trace of the stream's traceparent metadata.
func TestTracedQuotaReports(t *testing.T) {
	e := startQuota(t, quotaPolicy(t))
	sr := tracetest.NewSpanRecorder()
	e.svc.quotaTracer = tracing.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr)), "rlqs")
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "traceparent", testParent))
	defer cancel()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(e.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &quotaClient{t: t, stream: stream, cancel: cancel}
	c.report("web", usage(1, 0, 0, "tenant", "acme", "api_key", "acme-key", "action", "read"))
	spans := decisionSpans(sr)
	if len(spans) != 1 {
		t.Fatalf("%d report spans", len(spans))
	}
	a := spanAttrs(spans[0])
	if a["admit.front_end"] != "rlqs" || a["admit.domain"] != "web" || a["admit.rlqs.reported_buckets"] != "1" || a["admit.rlqs.assignments"] != "1" || a["admit.rules"] == "" {
		t.Errorf("the report: %v", a)
	}
	if spans[0].SpanContext().TraceID().String() != testTrace {
		t.Errorf("trace %v, want the stream's", spans[0].SpanContext().TraceID())
	}
}
