package envoyrls

import (
	"context"
	"strings"
	"testing"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
)

// FuzzParse: any bytes either load or are refused with positioned
// errors, never a panic; a loaded file's domains answer lookups.
func FuzzParse(f *testing.F) {
	f.Add([]byte(testConfig))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    value: v*\n    share_threshold: true\n    rate_limit: {unit: week, requests_per_unit: 3, unit_multiplier: 2, algorithm: gcra, burst: 1}\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, replaces: [{name: x}]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(File{Name: "f.yaml", Data: data})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.yaml") {
				t.Fatalf("error without its file: %v", err)
			}
			return
		}
		for _, d := range c.Domains() {
			m := c.Lookup(d, []Entry{{"k", "v"}, {"k", "vv"}})
			if m.Limit != nil && m.Limit.Rule() != nil && m.Limit.Rule().Validate() != nil {
				t.Fatalf("loaded an invalid rule: %+v", m.Limit)
			}
		}
	})
}

// FuzzParseFiles: a directory of envoyproxy/ratelimit files, as
// --envoy-config loads it, either loads or is refused with an error that
// names a file of it (two files may not share a domain); never a panic.
func FuzzParseFiles(f *testing.F) {
	f.Add([]byte(testConfig), []byte("domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	f.Add([]byte("domain: d\n"), []byte("domain: d\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: j\n        value: \"*\"\n"), []byte("{"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		c, err := Parse(File{Name: "a.yaml", Data: a}, File{Name: "b.yaml", Data: b})
		if err != nil {
			if msg := err.Error(); !strings.Contains(msg, "a.yaml") && !strings.Contains(msg, "b.yaml") {
				t.Fatalf("error names neither file: %v", err)
			}
			return
		}
		seen := map[string]bool{}
		for _, d := range c.Domains() {
			if seen[d] {
				t.Fatalf("domain %q loaded twice", d)
			}
			seen[d] = true
		}
	})
}

// FuzzShouldRateLimit: any request is answered with a status per
// descriptor, or refused as invalid, unauthenticated or not permitted;
// never a panic or an internal error.
func FuzzShouldRateLimit(f *testing.F) {
	cfg, err := Parse(File{Name: "test.yaml", Data: []byte(testConfig)})
	if err != nil {
		f.Fatal(err)
	}
	p, err := policy.Compile(&policy.Spec{UnknownTenant: "deny"})
	if err != nil {
		f.Fatal(err)
	}
	store := memstore.New(nil)
	defer store.Close()
	svc, err := New(Options{Decider: policy.NewDecider(store, 1), Config: cfg, Policy: func() *policy.Policy { return p }, ResponseHeaders: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("messaging", "a=x;b=y|to_number=1", uint32(1), uint64(0), uint32(0), uint32(0), false)
	f.Add("admit", "tenant=t|api_key=k", uint32(0), uint64(2), uint32(5), uint32(2), true)
	f.Add("messaging", "path=/files/x|key_1=value_1;user=bkthomps", uint32(7), uint64(1<<63), uint32(0), uint32(9), false)
	f.Fuzz(func(t *testing.T, domain, spec string, hits uint32, own uint64, rpu, unit uint32, negative bool) {
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits}
		for i, ds := range strings.Split(spec, "|") {
			d := &rlext.RateLimitDescriptor{IsNegativeHits: negative && i == 0}
			for _, kv := range strings.Split(ds, ";") {
				k, v, _ := strings.Cut(kv, "=")
				d.Entries = append(d.Entries, &rlext.RateLimitDescriptor_Entry{Key: k, Value: v})
			}
			if i == 1 {
				d.HitsAddend = wrapperspb.UInt64(own)
			}
			if i == 2 {
				d.Limit = &rlext.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit(unit % 8)}
			}
			req.Descriptors = append(req.Descriptors, d)
		}
		resp, err := svc.ShouldRateLimit(context.Background(), req)
		if err != nil {
			switch status.Code(err) {
			case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated:
				return
			}
			t.Fatalf("%v", err)
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
		over := false
		for _, s := range resp.Statuses {
			over = over || s.Code == rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if over != (resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT) {
			t.Fatalf("overall %v with statuses %v", resp.OverallCode, resp.Statuses)
		}
	})
}
