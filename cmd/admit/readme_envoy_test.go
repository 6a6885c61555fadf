package main

import (
	"context"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/admitdev/admit/internal/readmetest"
)

// TestREADMEEnvoyPath runs the README's lines for an envoyproxy/ratelimit
// user as written: config validate on the example directory, serve with
// it, and each grpcurl call (its request sent by a Go client, through the
// method grpcurl would find by reflection), checked against the comment
// above it.
func TestREADMEEnvoyPath(t *testing.T) {
	block := readmetest.Block(t, "### From envoyproxy/ratelimit", "sh")
	var srv *running
	var cc *grpc.ClientConn
	comment := ""
	calls := 0
	lines := strings.Split(block, "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, `\`) + lines[i]
		}
		words := shellWords(t, line)
		for j, w := range words {
			if strings.HasPrefix(w, "examples/") {
				words[j] = "../../" + w
			}
		}
		switch {
		case strings.HasPrefix(line, "#"):
			comment = line
		case strings.HasPrefix(line, "go run ./cmd/admit config validate"):
			var out strings.Builder
			if code := run(context.Background(), words[3:], &env{stdout: &out, stderr: &out, getenv: func(string) string { return "" }}); code != 0 || !strings.Contains(out.String(), "ok (envoyproxy/ratelimit directory)") {
				t.Fatalf("%s: exit %d: %s", line, code, out.String())
			}
		case strings.HasPrefix(line, "go run ./cmd/admit serve"):
			srv = startCmd(t, append([]string{"serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", t.TempDir()}, words[4:]...)...)
			var err error
			if cc, err = grpc.NewClient(srv.grpc, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cc.Close() })
			checkReflection(t, cc)
		case strings.HasPrefix(line, "grpcurl"):
			if cc == nil {
				t.Fatalf("%s: before any serve line", line)
			}
			data, method := "", words[len(words)-1]
			for j, w := range words {
				if w == "-d" && j+1 < len(words) {
					data = words[j+1]
				}
			}
			if method != "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" {
				t.Fatalf("%s: method %s", line, method)
			}
			var req rlsv3.RateLimitRequest
			if err := protojson.Unmarshal([]byte(data), &req); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &req)
			cancel()
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			calls++
			switch {
			case strings.Contains(comment, "OK, 4 of 5 left"):
				st := resp.GetStatuses()
				if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(st) != 1 || st[0].GetLimitRemaining() != 4 || st[0].GetCurrentLimit().GetRequestsPerUnit() != 5 {
					t.Errorf("%s\n%s: %v", comment, line, resp)
				}
			case strings.Contains(comment, "OVER_LIMIT"):
				if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
					t.Errorf("%s\n%s: %v", comment, line, resp)
				}
			default:
				t.Fatalf("no expectation for %s (comment %q)", line, comment)
			}
		}
	}
	if srv == nil || calls != 2 {
		t.Fatalf("the block served %v and made %d calls; want a serve and 2 calls", srv != nil, calls)
	}
}

// checkReflection lists cc's services as grpcurl does, and wants the rate
// limit service among them.
func checkReflection(t *testing.T, cc *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil && err != io.EOF {
		t.Fatalf("reflection: %v", err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !strings.Contains(strings.Join(names, " "), "envoy.service.ratelimit.v3.RateLimitService") {
		t.Errorf("reflection lists %v, without the rate limit service", names)
	}
}

// TestREADMEWalkthroughGRPC runs the walk-through's grpcurl line against
// admit serve started as the walk-through starts it (the built-in demo,
// no flags but its ports): the demo serves reflection, which grpcurl
// needs without the .proto files, and the "admit" domain admits acme.
func TestREADMEWalkthroughGRPC(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^grpcurl -plaintext -d '(\{"domain":"admit"[^']*)' \\\n\s*localhost:8081 (\S+)$`).FindSubmatch(readme)
	if m == nil {
		t.Fatal(`no grpcurl line of the "admit" domain in README.md`)
	}
	srv := startCmd(t, "serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", t.TempDir())
	cc, err := grpc.NewClient(srv.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	checkReflection(t, cc)
	if string(m[2]) != "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" {
		t.Fatalf("method %s", m[2])
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(m[1], &req); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &req)
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v %v", resp, err)
	}
}
