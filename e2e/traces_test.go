package e2e

import (
	"bufio"
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// A caller's W3C trace context, which Admit's spans continue.
const (
	callerTrace     = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpan      = "00f067aa0ba902b7"
	callerParent    = "00-" + callerTrace + "-" + callerSpan + "-01"
	otlpContentType = "application/x-protobuf"
)

// receivedSpan is a span an OTLP receiver was sent, with its resource's
// service name.
type receivedSpan struct {
	service string
	span    *tracepb.Span
}

// receiver is an OTLP trace receiver, over gRPC (its Export) or over
// HTTP (its ServeHTTP, at /v1/traces), that keeps what it is sent and
// counts the connections it accepted.
type receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	addr  string
	conns atomic.Int64

	mu    sync.Mutex
	spans []receivedSpan
}

func (rc *receiver) add(req *collectortrace.ExportTraceServiceRequest) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := attr(rs.GetResource().GetAttributes(), "service.name").GetStringValue()
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				rc.spans = append(rc.spans, receivedSpan{service: service, span: s})
			}
		}
	}
}

// Export implements the OTLP trace service.
func (rc *receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	rc.add(req)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// ServeHTTP is OTLP/HTTP's POST /v1/traces, in binary protobuf.
func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != otlpContentType {
		http.Error(w, "want POST /v1/traces of "+otlpContentType, http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(r.Body)
	var req collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &req)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc.add(&req)
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", otlpContentType)
	_, _ = w.Write(out)
}

// countingListener counts the connections its receiver accepts.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// startReceiver starts a receiver on addr ("127.0.0.1:0" for any port)
// speaking protocol ("grpc" or "http/protobuf"), stopped when the test
// ends; nil if addr cannot be listened on.
func startReceiver(t *testing.T, addr, protocol string) *receiver {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil
	}
	rc := &receiver{addr: ln.Addr().String()}
	cl := countingListener{Listener: ln, n: &rc.conns}
	if protocol == "grpc" {
		srv := grpc.NewServer()
		collectortrace.RegisterTraceServiceServer(srv, rc)
		go func() { _ = srv.Serve(cl) }()
		t.Cleanup(srv.Stop)
	} else {
		srv := &http.Server{Handler: rc, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(cl) }()
		t.Cleanup(func() { srv.Close() })
	}
	return rc
}

// find returns the spans received so far that match.
func (rc *receiver) find(match func(receivedSpan) bool) []receivedSpan {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []receivedSpan
	for _, s := range rc.spans {
		if match(s) {
			out = append(out, s)
		}
	}
	return out
}

// await waits up to d for a span that matches, and fails the test
// without one.
func (rc *receiver) await(t *testing.T, d time.Duration, what string, match func(receivedSpan) bool) receivedSpan {
	t.Helper()
	var got []receivedSpan
	if !waitUntil(d, func() bool { got = rc.find(match); return len(got) > 0 }) {
		rc.mu.Lock()
		n := len(rc.spans)
		rc.mu.Unlock()
		t.Fatalf("no %s within %v (%d spans received)", what, d, n)
	}
	return got[0]
}

func waitUntil(d time.Duration, ok func() bool) bool {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

func attr(kvs []*commonpb.KeyValue, key string) *commonpb.AnyValue {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return kv.GetValue()
		}
	}
	return nil
}

func spanAttr(s receivedSpan, key string) *commonpb.AnyValue {
	return attr(s.span.GetAttributes(), key)
}

func frontEnd(name string) func(receivedSpan) bool {
	return func(s receivedSpan) bool {
		return s.span.GetName() == "admit.decide" && spanAttr(s, "admit.front_end").GetStringValue() == name
	}
}

// tracedAdmit is an admit serve a test stops itself, to see what it does
// at its graceful stop.
type tracedAdmit struct {
	url, grpc string
	cmd       *exec.Cmd
	exited    chan struct{}
	log       *processLog
}

// startTracedAdmit runs admit serve (the demo configuration) with env,
// after every OTEL_ variable of the test's own environment, which it
// clears: the test says all the process sees of them.
func startTracedAdmit(t *testing.T, env ...string) *tracedAdmit {
	t.Helper()
	cmd := exec.Command(admitBinary(t), "serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data"))
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &tracedAdmit{cmd: cmd, exited: make(chan struct{}), log: newProcessLog()}
	serving := regexp.MustCompile(`msg="admit serving" http=(http://127\.0\.0\.1:\d+) grpc=(127\.0\.0\.1:\d+)`)
	found := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.log.add(sc.Text())
			if m := serving.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1:]
			}
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("admit serve:\n%s", p.log.tail(30))
		}
	})
	select {
	case m := <-found:
		p.url, p.grpc = m[0], m[1]
		return p
	case <-p.exited:
		t.Fatalf("admit serve exited:\n%s", p.log.tail(30))
	case <-time.After(30 * time.Second):
		t.Fatalf("admit serve did not start within 30s:\n%s", p.log.tail(30))
	}
	return nil
}

// stop stops the server as an orchestrator does (SIGTERM) and waits for
// it to exit, at most 20 seconds.
func (p *tracedAdmit) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("admit serve did not exit within 20s of SIGTERM")
	}
}

// check asks /v1/check about a request of acme's user, in the caller's
// trace.
func (p *tracedAdmit) check(t *testing.T) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, p.url+"/v1/check", strings.NewReader(`{"tenant":"acme","user":"alice","action":"read"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", callerParent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/v1/check: %s", resp.Status)
	}
}

// checkDecisionSpan checks that s is a decision of tenant acme in the
// caller's trace, its parent the caller's span, which charged rule, and
// that rc received its store call as its child.
func checkDecisionSpan(t *testing.T, rc *receiver, s receivedSpan, rule string) {
	t.Helper()
	if got := hex.EncodeToString(s.span.GetTraceId()); got != callerTrace {
		t.Errorf("trace id %s, want the traceparent's %s", got, callerTrace)
	}
	if got := hex.EncodeToString(s.span.GetParentSpanId()); got != callerSpan {
		t.Errorf("parent span %s, want the traceparent's %s", got, callerSpan)
	}
	if s.span.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("kind %v", s.span.GetKind())
	}
	if got := spanAttr(s, "admit.tenant").GetStringValue(); got != "acme" {
		t.Errorf("tenant %q", got)
	}
	var rules []string
	for _, v := range spanAttr(s, "admit.rules").GetArrayValue().GetValues() {
		rules = append(rules, v.GetStringValue())
	}
	if !strings.Contains(","+strings.Join(rules, ",")+",", ","+rule+",") {
		t.Errorf("rules %v, want %s among them", rules, rule)
	}
	if !spanAttr(s, "admit.allowed").GetBoolValue() || spanAttr(s, "admit.outcome").GetStringValue() != "stored" {
		t.Errorf("allowed %v, outcome %q", spanAttr(s, "admit.allowed"), spanAttr(s, "admit.outcome").GetStringValue())
	}
	for _, kv := range s.span.GetAttributes() {
		if v := kv.GetValue().GetStringValue(); strings.Contains(v, "alice") {
			t.Errorf("attribute %s names the user: %q", kv.GetKey(), v)
		}
	}
	store := rc.await(t, 10*time.Second, "store span of the decision", func(c receivedSpan) bool {
		return c.span.GetName() == "admit.store.decide" && string(c.span.GetParentSpanId()) == string(s.span.GetSpanId())
	})
	if got := spanAttr(store, "admit.store").GetStringValue(); got != "memory" {
		t.Errorf("store span: store %q", got)
	}
	if string(store.span.GetTraceId()) != string(s.span.GetTraceId()) {
		t.Error("the store span is in another trace")
	}
}

// TestTracesOverOTLPHTTP: with OTEL_EXPORTER_OTLP_ENDPOINT alone, admit
// serve sends its spans over OTLP/HTTP (the default protocol): the
// decision of /v1/check continues the caller's traceparent, and its store
// call is its child. They are sent at the graceful stop: the batch's delay
// (5 s by default) has not passed.
func TestTracesOverOTLPHTTP(t *testing.T) {
	rc := startReceiver(t, "127.0.0.1:0", "http/protobuf")
	p := startTracedAdmit(t, "OTEL_EXPORTER_OTLP_ENDPOINT=http://"+rc.addr, "OTEL_SERVICE_NAME=admit-e2e",
		"OTEL_BSP_SCHEDULE_DELAY=600000")
	p.check(t)
	p.stop(t)
	s := rc.await(t, 10*time.Second, "decision span of /v1/check", frontEnd("api"))
	if s.service != "admit-e2e" {
		t.Errorf("service.name %q, want OTEL_SERVICE_NAME's", s.service)
	}
	if got := spanAttr(s, "http.route").GetStringValue(); got != "/v1/check" {
		t.Errorf("http.route %q", got)
	}
	checkDecisionSpan(t, rc, s, "user-requests")
}

// TestTracesOverOTLPGRPC: over OTLP/gRPC, a decision of the Envoy rate
// limit service continues the trace of the call's traceparent metadata.
// The spans are sent within the batch's delay, the server still running.
func TestTracesOverOTLPGRPC(t *testing.T) {
	rc := startReceiver(t, "127.0.0.1:0", "grpc")
	p := startTracedAdmit(t, "OTEL_EXPORTER_OTLP_ENDPOINT=http://"+rc.addr, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
		"OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_TRACES_SAMPLER=parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG=0")
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", callerParent)
	entry := func(k, v string) *rlv3.RateLimitDescriptor_Entry {
		return &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "admit",
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{entry("tenant", "acme"), entry("user", "alice"), entry("action", "read")}}}})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v %v", resp, err)
	}
	// The sampler keeps no root trace (ratio 0), and so keeps this one
	// only because its parent, the caller's, was sampled.
	s := rc.await(t, 10*time.Second, "decision span of ShouldRateLimit", frontEnd("envoy_rls"))
	if got := spanAttr(s, "admit.domain").GetStringValue(); got != "admit" {
		t.Errorf("domain %q", got)
	}
	checkDecisionSpan(t, rc, s, "user-requests")
}

// TestNoTracesUnlessAsked: with no OTEL_ variable, or with an endpoint
// but OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true, admit serve
// sends nothing anywhere: no connection reaches a receiver on the OTLP
// default ports (4318 for HTTP, 4317 for gRPC, when this host has them
// free) nor on the endpoint named, through a decision and a graceful stop.
func TestNoTracesUnlessAsked(t *testing.T) {
	named := startReceiver(t, "127.0.0.1:0", "http/protobuf")
	defaults := []*receiver{startReceiver(t, "127.0.0.1:4318", "http/protobuf"), startReceiver(t, "127.0.0.1:4317", "grpc")}
	for _, c := range []struct {
		name string
		env  []string
	}{
		{"no variables", nil},
		{"exporter none", []string{"OTEL_TRACES_EXPORTER=none", "OTEL_EXPORTER_OTLP_ENDPOINT=http://" + named.addr}},
		{"sdk disabled", []string{"OTEL_SDK_DISABLED=true", "OTEL_EXPORTER_OTLP_ENDPOINT=http://" + named.addr}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startTracedAdmit(t, append(c.env, "OTEL_BSP_SCHEDULE_DELAY=10")...)
			p.check(t)
			p.stop(t)
			if strings.Contains(p.log.tail(100), "traces on") {
				t.Error("admit serve says traces are on")
			}
		})
	}
	if n := named.conns.Load(); n != 0 {
		t.Errorf("the endpoint named accepted %d connections", n)
	}
	for i, rc := range defaults {
		if rc == nil {
			t.Logf("default port %d in use on this host: not watched", []int{4318, 4317}[i])
			continue
		}
		if n := rc.conns.Load(); n != 0 {
			t.Errorf("the default endpoint %s accepted %d connections", rc.addr, n)
		}
	}
}
