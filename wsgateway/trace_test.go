package wsgateway_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/coder/websocket"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/admitdev/admit/wsgateway"
)

// TestTracedConnect: a connection's admission is a span of the gateway,
// in the trace of the upgrade's traceparent, ended before the upgrade,
// with the connection limits it charged; one refused before its decision
// (an unknown session) tells its status.
func TestTracedConnect(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	h := newHarness(t, unlimited, unlimited, &wsgateway.Options{TracerProvider: tp})
	s, err := h.g.CreateSession(context.Background(), "t1")
	if err != nil {
		t.Fatal(err)
	}
	hdr := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	c, _, err := websocket.Dial(context.Background(), h.url("t1", s.ID), &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if _, _, err := websocket.Dial(context.Background(), h.url("t1", "no-such-session"), nil); err == nil {
		t.Fatal("an unknown session connected")
	}

	var spans []sdktrace.ReadOnlySpan
	for _, sp := range sr.Ended() {
		if sp.Name() == "admit.decide" {
			spans = append(spans, sp)
		}
	}
	if len(spans) != 2 {
		t.Fatalf("%d decision spans, want 2", len(spans))
	}
	attrs := func(sp sdktrace.ReadOnlySpan) map[string]string {
		m := map[string]string{}
		for _, kv := range sp.Attributes() {
			m[string(kv.Key)] = kv.Value.String()
		}
		return m
	}
	admitted := attrs(spans[0])
	if admitted["admit.front_end"] != "gateway" || admitted["admit.tenant"] != "t1" || admitted["admit.allowed"] != "true" ||
		admitted["admit.rules"] != `["`+wsgateway.LimitTenantConnections+`","`+wsgateway.LimitConnectionsPerSession+`","`+
			wsgateway.LimitTenantPerMinute+`","`+wsgateway.LimitSessionPerMinute+`"]` {
		t.Errorf("the admission: %v", admitted)
	}
	if got := spans[0].SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("trace %s, want the traceparent's", got)
	}
	if refused := attrs(spans[1]); refused["http.response.status_code"] == "" || refused["admit.allowed"] != "" {
		t.Errorf("the unknown session's attempt: %v", refused)
	}
}
