package envoyrls

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/metadata"

	"github.com/admitdev/admit/internal/tracing"
)

// The attributes of this package's spans, besides package tracing's.
const (
	// Domain is the domain a request or a quota stream names.
	Domain = attribute.Key("admit.domain")
	// ReportedBuckets counts the buckets a quota usage report reports.
	ReportedBuckets = attribute.Key("admit.rlqs.reported_buckets")
	// Assignments counts the bucket actions the report was answered with.
	Assignments = attribute.Key("admit.rlqs.assignments")
)

// startSpan starts the span of a decision of t in the context of a gRPC
// call, whose parent is the trace context of the call's metadata
// (traceparent, tracestate) unless ctx holds a span already. Traces off
// (t nil), it returns ctx and a span that does nothing, and reads nothing.
func startSpan(ctx context.Context, t *tracing.Tracer) (context.Context, tracing.Span) {
	if !t.Enabled() {
		return ctx, tracing.Span{}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	return t.Start(ctx, metadataCarrier(md))
}

// metadataCarrier carries a W3C trace context in gRPC metadata, whose
// keys are lower case, as the propagator's are.
type metadataCarrier metadata.MD

func (m metadataCarrier) Get(key string) string {
	if v := metadata.MD(m).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (m metadataCarrier) Set(key, value string) { metadata.MD(m).Set(key, value) }

func (m metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
