package server

import (
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestTracedFrontEnds: /v1/check, /v1/acquire and /v1/authz each make a
// decision's span, named for its front end, in the trace of the caller's
// traceparent, with the store's call beneath (the server's own Decider).
func TestTracedFrontEnds(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	h := start(t, testSpec(), "", func(o *Options) { o.TracerProvider = tp })
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	parent := "00-" + traceID + "-00f067aa0ba902b7-01"
	h.want(h.do("POST", "/v1/check", `{"tenant":"t1","user":"u","action":"read"}`, "Traceparent", parent), 200, "check")
	h.want(h.do("POST", "/v1/acquire", `{"tenant":"t1","user":"u","action":"read","max_wait_ms":0}`, "Traceparent", parent), 200, "acquire")
	h.want(h.do("GET", "/v1/authz/x", "", "X-API-Key", "secret-key", "Traceparent", parent), 200, "authz")

	type seen struct{ frontEnd, route, tenant string }
	var got []seen
	decisions := map[string]bool{}
	for _, s := range sr.Ended() {
		if s.Name() != "admit.decide" {
			continue
		}
		if s.SpanContext().TraceID().String() != traceID || s.Parent().SpanID().String() != "00f067aa0ba902b7" {
			t.Errorf("a decision's span is not the caller's child: %v under %v", s.SpanContext(), s.Parent())
		}
		decisions[s.SpanContext().SpanID().String()] = true
		var v seen
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case "admit.front_end":
				v.frontEnd = kv.Value.AsString()
			case "http.route":
				v.route = kv.Value.AsString()
			case "admit.tenant":
				v.tenant = kv.Value.AsString()
			}
		}
		got = append(got, v)
	}
	want := []seen{{"api", "/v1/check", "t1"}, {"api", "/v1/acquire", "t1"}, {"forward_auth", "", "keyed"}}
	if len(got) != len(want) {
		t.Fatalf("decision spans %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("decision %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	children := 0
	for _, s := range sr.Ended() {
		if s.Name() == "admit.store.decide" && decisions[s.Parent().SpanID().String()] {
			children++
		}
	}
	if children < len(want) {
		t.Errorf("%d store spans under the %d decisions", children, len(want))
	}
}
