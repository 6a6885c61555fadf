package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// traceExporters returns the names of the span exporters the OTEL_*
// variables that getenv reads ask for: OTEL_TRACES_EXPORTER's list
// (otlp, console; none for none), or otlp when it is unset and an OTLP
// endpoint is (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). Nothing set, it returns none:
// OpenTelemetry's specification makes otlp the default exporter, which
// would have every server send spans to localhost:4318 whether or not a
// collector listens there, so Admit traces only when told where to.
// OTEL_SDK_DISABLED=true turns traces off whatever the rest says.
func traceExporters(getenv func(string) string) ([]string, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, nil
	}
	list := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))
	if list == "" {
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, nil
		}
		list = "otlp"
	}
	var names []string
	for _, name := range strings.Split(list, ",") {
		switch name = strings.ToLower(strings.TrimSpace(name)); name {
		case "none", "":
		case "otlp", "console":
			if !slices.Contains(names, name) {
				names = append(names, name)
			}
		default:
			return nil, fmt.Errorf("OTEL_TRACES_EXPORTER: unknown exporter %q: want otlp, console or none", name)
		}
	}
	return names, nil
}

// otlpProtocol returns the OTLP protocol of traces:
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL,
// else http/protobuf, the specification's default. Go's exporters speak
// grpc and http/protobuf, not http/json.
func otlpProtocol(getenv func(string) string) (string, error) {
	p := strings.TrimSpace(first(getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf"))
	switch p {
	case "grpc", "http/protobuf":
		return p, nil
	}
	return "", fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", p)
}

// startTracing returns the tracer provider of the OpenTelemetry
// variables e reads, and a stop that sends the spans still batched and
// shuts the exporters down (within 5 seconds); a nil provider, and a stop
// that does nothing, when they ask for no traces (see traceExporters).
//
// Whether to trace, and over which protocol, is read through e; the
// exporters and the SDK read the rest from the process's environment, as
// OpenTelemetry's Go SDK does: the endpoints, headers, TLS files, timeouts
// and compression (OTEL_EXPORTER_OTLP_*), the sampler
// (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG; default parentbased_always_on),
// the batching (OTEL_BSP_*) and the resource (OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES over service.name admit and service.version).
// The exporters connect when they first send, so a collector that is
// down delays no start; their failures are logged as warnings.
func startTracing(ctx context.Context, e *env, log *slog.Logger) (trace.TracerProvider, func(), error) {
	names, err := traceExporters(e.getenv)
	if err != nil || len(names) == 0 {
		return nil, func() {}, err
	}
	var opts []sdktrace.TracerProviderOption
	var exporters []sdktrace.SpanExporter
	for _, name := range names {
		exp, err := newExporter(ctx, name, e.getenv, e.stdout)
		if err != nil {
			for _, x := range exporters {
				_ = x.Shutdown(ctx)
			}
			return nil, func() {}, err
		}
		exporters = append(exporters, exp)
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	v, _, _ := versionInfo()
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", "admit"), attribute.String("service.version", v)),
		resource.WithFromEnv(), // last: the operator's names win
	)
	if err != nil {
		// A malformed OTEL_RESOURCE_ATTRIBUTES: the rest of it holds.
		log.Warn("traces: the resource attributes", "err", err)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("traces", "err", err) }))
	tp := sdktrace.NewTracerProvider(append(opts, sdktrace.WithResource(res))...)
	log.Info("traces on", "exporters", strings.Join(names, ","))
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
			log.Warn("shutdown: spans not sent", "err", err)
		}
	}
	return tp, stop, nil
}

// newExporter returns the span exporter named (see traceExporters).
func newExporter(ctx context.Context, name string, getenv func(string) string, stdout io.Writer) (sdktrace.SpanExporter, error) {
	if name == "console" {
		return stdouttrace.New(stdouttrace.WithWriter(stdout))
	}
	protocol, err := otlpProtocol(getenv)
	if err != nil {
		return nil, err
	}
	if protocol == "grpc" {
		return otlptracegrpc.New(ctx)
	}
	return otlptracehttp.New(ctx)
}
