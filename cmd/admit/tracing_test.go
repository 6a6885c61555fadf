package main

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

// TestTraceExporters: traces are off unless the variables say where to
// send them, or name an exporter.
func TestTraceExporters(t *testing.T) {
	for _, c := range []struct {
		env  string // NAME=value …
		want string // exporters, comma-separated; "error" for an error
	}{
		{"", ""},
		{"OTEL_SERVICE_NAME=admit-eu OTEL_TRACES_SAMPLER=always_on", ""},
		{"OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318", "otlp"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://collector:4318/v1/traces", "otlp"},
		{"OTEL_TRACES_EXPORTER=otlp", "otlp"}, // the exporter's default endpoint, as asked
		{"OTEL_TRACES_EXPORTER=none OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318", ""},
		{"OTEL_TRACES_EXPORTER=Console,otlp,console", "console,otlp"},
		{"OTEL_SDK_DISABLED=true OTEL_TRACES_EXPORTER=otlp OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318", ""},
		{"OTEL_SDK_DISABLED=false OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318", "otlp"},
		{"OTEL_TRACES_EXPORTER=zipkin", "error"},
	} {
		got, err := traceExporters(getenvOf(c.env))
		if err != nil {
			if c.want != "error" {
				t.Errorf("%s: %v", c.env, err)
			}
			continue
		}
		if s := strings.Join(got, ","); s != c.want {
			t.Errorf("%s: exporters %q, want %q", c.env, s, c.want)
		}
	}
}

func TestOTLPProtocol(t *testing.T) {
	for _, c := range []struct{ env, want string }{
		{"", "http/protobuf"},
		{"OTEL_EXPORTER_OTLP_PROTOCOL=grpc", "grpc"},
		{"OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf", "http/protobuf"},
		{"OTEL_EXPORTER_OTLP_PROTOCOL=http/json", "error"},
	} {
		got, err := otlpProtocol(getenvOf(c.env))
		if err != nil {
			got = "error"
		}
		if got != c.want {
			t.Errorf("%s: %q (%v), want %q", c.env, got, err, c.want)
		}
	}
}

// TestStartTracingOff: with no variables there is no provider, and so
// nothing for the front ends to trace with.
func TestStartTracingOff(t *testing.T) {
	e := &env{stdout: io.Discard, stderr: io.Discard, getenv: getenvOf("")}
	tp, stop, err := startTracing(context.Background(), e, slog.New(slog.DiscardHandler))
	if err != nil || tp != nil {
		t.Fatalf("provider %v, error %v", tp, err)
	}
	stop()
	e.getenv = getenvOf("OTEL_TRACES_EXPORTER=jaeger")
	if _, _, err := startTracing(context.Background(), e, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "jaeger") {
		t.Errorf("error %v, want one naming the exporter", err)
	}
}

// getenvOf returns a getenv of "NAME=value NAME=value".
func getenvOf(vars string) func(string) string {
	fields := strings.Fields(vars)
	return func(name string) string {
		i := slices.IndexFunc(fields, func(f string) bool { return strings.HasPrefix(f, name+"=") })
		if i < 0 {
			return ""
		}
		return strings.TrimPrefix(fields[i], name+"=")
	}
}
