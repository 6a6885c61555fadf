// Package tracing makes the OpenTelemetry spans of the decisions Admit's
// front ends make: one span a decision, named SpanName, with the front
// end, the tenant, the rules charged and what they decided, as
// docs/traces.md lists them. The store calls beneath it are the
// policy.Decider's spans (see policy.Decider.Trace).
//
// A front end given no trace.TracerProvider holds a nil *Tracer, which
// makes no span and costs a nil check: neither the context nor anything
// else is allocated, so the decision paths stay as they are when traces
// are off. The OpenTelemetry API's no-op provider would not do: deriving
// a context for its span allocates.
//
// A span's parent is the span of the context it is started in, when that
// has one (a program's own instrumentation around the middleware), and
// otherwise the caller's W3C trace context (traceparent and tracestate),
// so that the trace of the Envoy or the client that asked continues.
package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/policy"
)

// ScopeName is the instrumentation scope of Admit's tracers.
const ScopeName = "github.com/admitdev/admit"

// SpanName names the span of every front end's decision; FrontEnd tells
// them apart.
const SpanName = "admit.decide"

// The attributes of a decision's span.
const (
	// FrontEnd is the front end that decided: "api", "forward_auth",
	// "envoy_rls", "rlqs", "gateway", "http" (the middleware) or "proxy".
	FrontEnd = attribute.Key("admit.front_end")
	// Tenant is the tenant the request was decided for (its id, never a
	// key), absent when it named none.
	Tenant = attribute.Key("admit.tenant")
	// Rules names the rules charged, in the order of the charges.
	Rules = attribute.Key("admit.rules")
	// Allowed says whether the request was admitted.
	Allowed = attribute.Key("admit.allowed")
	// DeniedBy names the rule that refused, on a refusal.
	DeniedBy = attribute.Key("admit.denied_by")
	// RetryAfter is how long a refused request should wait, in seconds.
	RetryAfter = attribute.Key("admit.retry_after")
	// Outcome says who decided: "stored" (the store), "failed_open" (the
	// store failed and the rules admitted without it) or "failed_local"
	// (the store failed and the in-process limiter decided).
	Outcome = attribute.Key("admit.outcome")
	// ErrorType is the admit.Code of a decision that failed
	// ("unavailable", "invalid"…), as OpenTelemetry's error.type.
	ErrorType = attribute.Key("error.type")
)

// MaxRules bounds the names a span's Rules lists: a domain that counts
// each hit may charge hundreds of buckets of a few rules.
const MaxRules = 64

// Tracer starts the spans of one front end's decisions. A nil *Tracer
// starts none. It is safe for concurrent use.
type Tracer struct {
	tracer   trace.Tracer
	frontEnd attribute.KeyValue
}

// New returns the Tracer of the front end named frontEnd (see FrontEnd),
// or nil when tp is nil: traces are off.
func New(tp trace.TracerProvider, frontEnd string) *Tracer {
	if tp == nil {
		return nil
	}
	return &Tracer{tracer: tp.Tracer(ScopeName), frontEnd: FrontEnd.String(frontEnd)}
}

// Enabled reports whether t starts spans.
func (t *Tracer) Enabled() bool { return t != nil }

// traceContext reads and writes W3C traceparent and tracestate.
var traceContext propagation.TraceContext

// Start starts the span of a decision in ctx, and returns the context
// that holds it, for the store calls. The span's parent is ctx's span if
// it has a valid one, else the trace context in carrier (an
// http.Header's propagation.HeaderCarrier, a gRPC call's metadata), if
// any. On a nil t it returns ctx and a Span that does nothing.
func (t *Tracer) Start(ctx context.Context, carrier propagation.TextMapCarrier) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	kind := trace.SpanKindServer
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		if !sc.IsRemote() {
			// Inside a span of the program's own: a step of its work.
			kind = trace.SpanKindInternal
		}
	} else if carrier != nil {
		ctx = traceContext.Extract(ctx, carrier)
	}
	ctx, span := t.tracer.Start(ctx, SpanName, trace.WithSpanKind(kind), trace.WithAttributes(t.frontEnd))
	return ctx, Span{span: span}
}

// Span is the span of one decision; its zero value, which a nil Tracer
// starts, does nothing. End it once.
type Span struct {
	span trace.Span
}

// Recording reports whether s records what it is told: false for a
// Tracer's nil span, and for a span the sampler dropped.
func (s Span) Recording() bool { return s.span != nil && s.span.IsRecording() }

// Decided records the decision dec of the resolution res, reached as out
// says.
func (s Span) Decided(res *policy.Resolution, dec *admit.Decision, out policy.Outcome) {
	if !s.Recording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 6)
	if res.Tenant != nil {
		attrs = append(attrs, Tenant.String(res.Tenant.ID))
	}
	if len(res.Rules) > 0 {
		names := make([]string, 0, min(len(res.Rules), MaxRules))
		for _, r := range res.Rules[:min(len(res.Rules), MaxRules)] {
			names = append(names, r.Name)
		}
		attrs = append(attrs, Rules.StringSlice(names))
	}
	attrs = append(attrs, Allowed.Bool(dec.Allowed), Outcome.String(out.String()))
	if !dec.Allowed {
		if dec.DeniedBy != "" {
			attrs = append(attrs, DeniedBy.String(dec.DeniedBy))
		}
		attrs = append(attrs, RetryAfter.Float64(dec.RetryAfter.Seconds()))
	}
	s.span.SetAttributes(attrs...)
}

// SetAttributes adds attributes of the front end's own to s.
func (s Span) SetAttributes(kv ...attribute.KeyValue) {
	if s.Recording() {
		s.span.SetAttributes(kv...)
	}
}

// End ends s, failed with err if it is not nil: the error's code as
// ErrorType and as the status's description. Not its message, which may
// quote what the caller sent (an address that is none, a tenant that
// does not exist).
func (s Span) End(err error) {
	if s.span == nil {
		return
	}
	if err != nil && s.span.IsRecording() {
		code := admit.ErrorCode(err).String()
		s.span.SetAttributes(ErrorType.String(code))
		s.span.SetStatus(codes.Error, code)
	}
	s.span.End()
}
