package tracing_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/tracing"
	"github.com/admitdev/admit/policy"
)

const (
	traceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentSpan  = "00f067aa0ba902b7"
	traceparent = "00-" + traceID + "-" + parentSpan + "-01"
)

func recorder() (*tracetest.SpanRecorder, trace.TracerProvider) {
	sr := tracetest.NewSpanRecorder()
	return sr, sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// resolution is a refusal of tenant acme's two rules by the second.
func resolution() (*policy.Resolution, *admit.Decision) {
	rule := func(name string) *policy.Rule { return &policy.Rule{Rule: admit.Rule{Name: name}} }
	res := &policy.Resolution{Tenant: &policy.Tenant{ID: "acme"}, Rules: []*policy.Rule{rule("per-user"), rule("per-tenant")}}
	dec := &admit.Decision{Allowed: false, DeniedBy: "per-tenant", RetryAfter: 1500 * time.Millisecond}
	return res, dec
}

func TestSpanContinuesTheCallersTrace(t *testing.T) {
	sr, tp := recorder()
	tr := tracing.New(tp, "api")
	h := http.Header{}
	h.Set("Traceparent", traceparent)
	h.Set("Tracestate", "vendor=1")
	ctx, span := tr.Start(context.Background(), propagation.HeaderCarrier(h))
	if !trace.SpanFromContext(ctx).IsRecording() {
		t.Fatal("the context holds no recording span")
	}
	res, dec := resolution()
	span.Decided(res, dec, policy.FailedLocal)
	span.End(nil)

	ended := sr.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans", len(ended))
	}
	s := ended[0]
	if s.Name() != tracing.SpanName || s.SpanKind() != trace.SpanKindServer {
		t.Errorf("span %q of kind %v", s.Name(), s.SpanKind())
	}
	if got := s.SpanContext().TraceID().String(); got != traceID {
		t.Errorf("trace id %s, want the traceparent's", got)
	}
	if p := s.Parent(); p.SpanID().String() != parentSpan || !p.IsRemote() || p.TraceState().Get("vendor") != "1" {
		t.Errorf("parent %v, want the traceparent's span with its tracestate", p)
	}
	a := attrs(s)
	for k, want := range map[attribute.Key]string{
		tracing.FrontEnd: "api", tracing.Tenant: "acme", tracing.DeniedBy: "per-tenant", tracing.Outcome: "failed_local",
	} {
		if got := a[k].AsString(); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if got := a[tracing.Rules].AsStringSlice(); len(got) != 2 || got[0] != "per-user" || got[1] != "per-tenant" {
		t.Errorf("rules %v", got)
	}
	if a[tracing.Allowed].AsBool() || a[tracing.RetryAfter].AsFloat64() != 1.5 {
		t.Errorf("allowed %v, retry after %v", a[tracing.Allowed].AsBool(), a[tracing.RetryAfter].AsFloat64())
	}
}

func TestSpanInsideTheProgramsOwn(t *testing.T) {
	sr, tp := recorder()
	ctx, outer := tp.Tracer("app").Start(context.Background(), "handler")
	h := http.Header{}
	h.Set("Traceparent", traceparent) // not the parent: the program's span is
	_, span := tracing.New(tp, "http").Start(ctx, propagation.HeaderCarrier(h))
	span.End(admit.Errorf(admit.CodeUnavailable, "the store is down"))
	outer.End()
	s := sr.Ended()[0]
	if s.Parent().SpanID() != outer.SpanContext().SpanID() || s.SpanKind() != trace.SpanKindInternal {
		t.Errorf("parent %v kind %v, want the program's span, internal", s.Parent().SpanID(), s.SpanKind())
	}
	if s.Status().Code != codes.Error || attrs(s)[tracing.ErrorType].AsString() != "unavailable" {
		t.Errorf("status %v, error.type %q", s.Status(), attrs(s)[tracing.ErrorType].AsString())
	}
}

func TestSpanWithoutTraceContextIsARoot(t *testing.T) {
	sr, tp := recorder()
	_, span := tracing.New(tp, "gateway").Start(context.Background(), propagation.HeaderCarrier(http.Header{}))
	span.End(nil)
	if s := sr.Ended()[0]; s.Parent().IsValid() || !s.SpanContext().IsValid() {
		t.Errorf("parent %v, span %v: want a root span", s.Parent(), s.SpanContext())
	}
}

// TestOffCostsNothing: a nil Tracer's spans allocate nothing and leave
// the context as it is.
func TestOffCostsNothing(t *testing.T) {
	tr := tracing.New(nil, "api")
	if tr != nil || tr.Enabled() {
		t.Fatal("a nil provider made a tracer")
	}
	h := http.Header{"Traceparent": {traceparent}}
	ctx := context.Background()
	res, dec := resolution()
	failed := errors.New("failed")
	n := testing.AllocsPerRun(100, func() {
		c, span := tr.Start(ctx, propagation.HeaderCarrier(h))
		if c != ctx || span.Recording() {
			t.Fatal("a nil tracer started a span")
		}
		span.Decided(res, dec, policy.Stored)
		span.SetAttributes()
		span.End(failed)
	})
	if n != 0 {
		t.Errorf("%v allocations a decision with traces off", n)
	}
}
