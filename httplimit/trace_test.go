package httplimit

import (
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestTracedDecisions: each decision is a span named for the front end,
// in the trace of the request's traceparent, with its store call beneath
// (a Decider of the Limiter's own), a refusal's rule and wait, and no
// credential; a request refused before any decision (an unknown key) is a
// failed span.
func TestTracedDecisions(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	f := newFixture(t, Options{TracerProvider: tp, FrontEnd: "proxy"})
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for i, want := range []int{200, 200, 200, 429} {
		if w := f.do("GET", "/x", "198.51.100.1:1000", "X-API-Key", keyA, "Traceparent", parent); w.Code != want {
			t.Fatalf("request %d: %d, want %d", i, w.Code, want)
		}
	}
	if w := f.do("GET", "/x", "198.51.100.1:1000", "X-API-Key", "ak_nobody"); w.Code != 401 {
		t.Fatalf("unknown key: %d", w.Code)
	}
	var decisions, stores []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		switch s.Name() {
		case "admit.decide":
			decisions = append(decisions, s)
		case "admit.store.decide":
			stores = append(stores, s)
		}
	}
	if len(decisions) != 5 || len(stores) != 4 {
		t.Fatalf("%d decision spans, %d store spans; want 5 and 4", len(decisions), len(stores))
	}
	for i, s := range stores {
		if s.Parent().SpanID() != decisions[i].SpanContext().SpanID() {
			t.Errorf("store span %d is not its decision's child", i)
		}
	}
	attrs := func(s sdktrace.ReadOnlySpan) map[string]string {
		m := map[string]string{}
		for _, kv := range s.Attributes() {
			m[string(kv.Key)] = kv.Value.String()
			if strings.Contains(kv.Value.String(), keyA) {
				t.Errorf("%s holds the API key", kv.Key)
			}
		}
		return m
	}
	refused := attrs(decisions[3])
	if refused["admit.front_end"] != "proxy" || refused["admit.tenant"] != "a" || refused["admit.allowed"] != "false" ||
		refused["admit.denied_by"] != "per-ip" || refused["admit.retry_after"] == "" {
		t.Errorf("the refusal's attributes: %v", refused)
	}
	if got := decisions[3].SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("trace %s, want the traceparent's", got)
	}
	unknown := decisions[4]
	if unknown.Status().Code != codes.Error || attrs(unknown)["error.type"] != "unauthenticated" || unknown.Parent().IsValid() {
		t.Errorf("the unknown key's span: status %v, attributes %v, parent %v", unknown.Status(), attrs(unknown), unknown.Parent())
	}
}
