package envoyrls

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The scenarios here are envoyproxy/ratelimit's behaviour, written from
// what its tests and examples show that service answering.

func parse(t *testing.T, yaml string) *Config {
	t.Helper()
	c, err := Parse(File{Name: "t.yaml", Data: []byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// remaining returns every status's limit_remaining.
func remaining(r *rlsv3.RateLimitResponse) []uint32 {
	out := make([]uint32, len(r.Statuses))
	for i, s := range r.Statuses {
		out[i] = s.LimitRemaining
	}
	return out
}

// hitsOf returns d with its own hits_addend.
func hitsOf(d *rlext.RateLimitDescriptor, n uint64) *rlext.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// TestMetadataAccepted: a descriptor's metadata block, whatever it holds,
// loads, and the limit beside it applies.
func TestMetadataAccepted(t *testing.T) {
	e := start(t, Options{Config: parse(t, `
domain: d
descriptors:
  - key: k
    metadata:
      owner: team-a
      tags: [billing, external]
      nested: {a: 1}
    rate_limit: {unit: minute, requests_per_unit: 1}
`)}, nil)
	if got := codesOf(e.ask(t, "d", 0, desc("k", "v"))); !same(got, []rlsv3.RateLimitResponse_Code{ok, ok}) {
		t.Fatalf("first: %v", got)
	}
	if got := codesOf(e.ask(t, "d", 0, desc("k", "v"))); !same(got, []rlsv3.RateLimitResponse_Code{over, over}) {
		t.Fatalf("second: %v", got)
	}
}

func TestWildcardPatterns(t *testing.T) {
	for _, tc := range []struct {
		pattern, value string
		want           bool
	}{
		{"foo*", "foo", true}, {"foo*", "foobar", true}, {"foo*", "fo", false},
		{"*", "", true}, {"*", "anything", true},
		{"bar*b", "barb", true}, {"bar*b", "bar-x-b", true}, {"bar*b", "barbx", false}, {"bar*b", "bab", false},
		{"foo*bar*baz", "foobarbaz", true}, {"foo*bar*baz", "foo1bar2baz", true}, {"foo*bar*baz", "foobaz", false},
		{"foo*bar*baz", "foo-baz-bar", false}, {"ab*ab", "ab", false}, {"ab*ab", "abab", true},
		{"*x*", "x", true}, {"*x*", "yyy", false}, {"a**b", "ab", true},
	} {
		if got := matches(tc.pattern, tc.value); got != tc.want {
			t.Errorf("matches(%q, %q) = %v, want %v", tc.pattern, tc.value, got, tc.want)
		}
	}
}

// TestWildcardsAnywhere: a '*' in the middle of a value, or several, match
// (each value its own counter, or one shared with share_threshold).
func TestWildcardsAnywhere(t *testing.T) {
	e := start(t, Options{Config: parse(t, `
domain: d
descriptors:
  - key: k
    value: bar*b
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: k
    value: foo*bar*baz
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 1}
`)}, nil)
	for _, v := range []string{"barb", "bar-x-b"} { // a counter each
		if got := codesOf(e.ask(t, "d", 0, desc("k", v))); got[0] != ok {
			t.Errorf("%s, first: %v", v, got)
		}
		if got := codesOf(e.ask(t, "d", 0, desc("k", v))); got[0] != over {
			t.Errorf("%s, second: %v", v, got)
		}
	}
	for range 3 { // matches nothing: no limit
		if r := e.ask(t, "d", 0, desc("k", "barbx")); r.OverallCode != ok || r.Statuses[0].CurrentLimit != nil {
			t.Fatalf("barbx: %v", r)
		}
	}
	if r := e.ask(t, "d", 0, desc("k", "foo1bar2baz")); r.OverallCode != ok {
		t.Fatalf("foo1bar2baz: %v", r)
	}
	if r := e.ask(t, "d", 0, desc("k", "foobarbaz")); r.OverallCode != over {
		t.Fatalf("foobarbaz shares foo1bar2baz's counter: %v", r)
	}
}

// TestCheckThenDebit: Envoy asks with hits_addend 0 when a request starts
// and sends its cost when it ends (apply_on_stream_done). envoyproxy/
// ratelimit counts that cost even past the limit, so the next requests are
// refused; so does a domain with charge: each. By default Admit refuses a
// request over the limit without counting it.
func TestCheckThenDebit(t *testing.T) {
	const rules = `
descriptors:
  - key: api
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 1}
`
	each := start(t, Options{Config: parse(t, "domain: d\ncharge: each\n"+rules)}, nil)
	if r := each.ask(t, "d", 0, hitsOf(desc("api", "x"), 0)); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 5 {
		t.Fatalf("check: %v", r)
	}
	if r := each.ask(t, "d", 0, hitsOf(desc("api", "x"), 7)); r.OverallCode != over {
		t.Fatalf("the stream's cost, 7 of 5: %v", r)
	}
	if r := each.ask(t, "d", 0, hitsOf(desc("api", "x"), 0)); r.OverallCode != over || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("check after the debit: %v", r)
	}
	// A refused request still counts its other descriptors.
	each.ask(t, "d", 0, desc("small", "s"), desc("api", "y"))
	if r := each.ask(t, "d", 0, desc("small", "s"), desc("api", "y")); !same(codesOf(r), []rlsv3.RateLimitResponse_Code{over, over, ok}) || r.Statuses[1].LimitRemaining != 3 {
		t.Fatalf("each, refused by small: %v", r)
	}

	all := start(t, Options{Config: parse(t, "domain: d\n"+rules)}, nil)
	all.ask(t, "d", 0, hitsOf(desc("api", "x"), 0))
	if r := all.ask(t, "d", 0, hitsOf(desc("api", "x"), 7)); r.OverallCode != over {
		t.Fatalf("all: 7 of 5: %v", r)
	}
	if r := all.ask(t, "d", 0, hitsOf(desc("api", "x"), 0)); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 5 {
		t.Fatalf("all: nothing was counted: %v", r)
	}
	all.ask(t, "d", 0, desc("small", "s"), desc("api", "y"))
	if r := all.ask(t, "d", 0, desc("small", "s"), desc("api", "y")); !same(codesOf(r), []rlsv3.RateLimitResponse_Code{over, over, ok}) || r.Statuses[1].LimitRemaining != 4 {
		t.Fatalf("all, refused by small: %v", r)
	}
}

const quotaRules = `
domain: d
descriptors:
  - key: q1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: n
    rate_limit: {unit: minute, requests_per_unit: 10}
    metadata: {route: {cluster: main}, owner: n}
  - key: backend_name
    descriptors:
      - key: model_name_override
        descriptors:
          - key: tenant
            quota_mode: true
            rate_limit: {unit: minute, requests_per_unit: 1}
            metadata: {route: {bucket: tenant, cluster: other}}
          - key: default
            quota_mode: true
            rate_limit: {unit: minute, requests_per_unit: 5}
            metadata: {route: {bucket: default}}
          - key: plain
            rate_limit: {unit: minute, requests_per_unit: 5}
`

// TestQuotaMode: with the default QuotaGroups, a quota descriptor over its
// limit answers OVER_LIMIT; the request is over when a regular descriptor
// is or every quota group is, and then (charge: all) nothing is counted.
func TestQuotaMode(t *testing.T) {
	e := start(t, Options{DynamicMetadata: true, Config: parse(t, quotaRules)}, nil)
	// One quota descriptor: over when it is, and then nothing is counted.
	if r := e.ask(t, "d", 0, desc("q1", "a"), desc("n", "a")); r.OverallCode != ok || r.Statuses[1].LimitRemaining != 9 {
		t.Fatalf("first: %v", r)
	}
	r := e.ask(t, "d", 0, desc("q1", "a"), desc("n", "a"))
	if !same(codesOf(r), []rlsv3.RateLimitResponse_Code{over, over, ok}) || r.Statuses[1].LimitRemaining != 9 || r.Statuses[0].DurationUntilReset.GetSeconds() == 0 {
		t.Fatalf("q1 over: %v", r)
	}
	md := r.GetDynamicMetadata().GetFields()
	if md["domain"].GetStringValue() != "d" || md["quotaModeEnabled"] != nil || md["quotaModeViolations"] != nil {
		t.Fatalf("metadata: %v", md)
	}
	// n passed, q1's group is over: n's metadata is repeated.
	if got := md["metadata"].GetStructValue().GetFields()["owner"].GetStringValue(); got != "n" {
		t.Fatalf("passed metadata: %v", md)
	}
	// Two groups: q1 is over, q2 has room: OK, q1 over.
	r = e.ask(t, "d", 0, desc("q1", "a"), desc("q2", "a"), desc("n", "a"))
	if !same(codesOf(r), []rlsv3.RateLimitResponse_Code{ok, over, ok, ok}) || r.Statuses[2].LimitRemaining != 8 || r.Statuses[1].LimitRemaining != 1 {
		t.Fatalf("q1 over, q2 not: %v", r)
	}
	e.ask(t, "d", 0, desc("q2", "a"))
	// Both over: the request is, and counts nothing.
	r = e.ask(t, "d", 0, desc("q1", "a"), desc("q2", "a"), desc("n", "a"))
	if !same(codesOf(r), []rlsv3.RateLimitResponse_Code{over, over, over, ok}) || r.Statuses[2].LimitRemaining != 8 {
		t.Fatalf("both over: %v", r)
	}
	// Without quota descriptors, no passedBackends.
	if r := e.ask(t, "d", 0, desc("n", "b")); r.GetDynamicMetadata().GetFields()["passedBackends"] != nil {
		t.Fatalf("no quota: %v", r.GetDynamicMetadata())
	}
}

// TestQuotaGroups: the quota descriptors of one backend_name and
// model_name_override are one group, over when any of them is; the request
// is over when every group is; dynamic metadata names the backends still
// available and merges the metadata of the descriptors that passed,
// leaving out those of an exhausted group. Both ways of counting answer
// the same here.
func TestQuotaGroups(t *testing.T) {
	for _, charge := range []Charge{ChargeAll, ChargeEach} {
		e := start(t, Options{DynamicMetadata: true, Charge: charge, Config: parse(t, quotaRules)}, nil)
		model := func(m, bucket string) *rlext.RateLimitDescriptor {
			return desc("backend_name", "be", "model_name_override", m, bucket, "x")
		}
		backends := func(r *rlsv3.RateLimitResponse) []string {
			var out []string
			for _, v := range r.GetDynamicMetadata().GetFields()["passedBackends"].GetListValue().GetValues() {
				f := v.GetStructValue().GetFields()
				out = append(out, f["backend_name"].GetStringValue()+"/"+f["model_name_override"].GetStringValue())
			}
			return out
		}
		r := e.ask(t, "d", 0, model("m1", "tenant"), model("m1", "default"), model("m2", "default"))
		if r.OverallCode != ok || !same(backends(r), []string{"be/m1", "be/m2"}) {
			t.Fatalf("%v first: %v", charge, r)
		}
		// The tenant's bucket of m1 is spent: m1's group is over, m2's is
		// not; the request fails over to m2.
		r = e.ask(t, "d", 0, model("m1", "tenant"), model("m1", "default"), model("m2", "default"))
		if !same(codesOf(r), []rlsv3.RateLimitResponse_Code{ok, over, ok, ok}) || !same(backends(r), []string{"be/m2"}) {
			t.Fatalf("%v m1's tenant over: %v", charge, r)
		}
		// m1's default bucket passed, but its group is spent: its metadata
		// is left out.
		route := r.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()["route"].GetStructValue().GetFields()
		if route["bucket"].GetStringValue() != "default" || route["cluster"] != nil {
			t.Fatalf("%v metadata: %v", charge, r.GetDynamicMetadata())
		}
		// m1 alone: one group, over: the request is.
		if r := e.ask(t, "d", 0, model("m1", "tenant"), model("m1", "default")); r.OverallCode != over || backends(r) != nil {
			t.Fatalf("%v m1 alone: %v", charge, r)
		}
		// A regular descriptor that passed names its backend too.
		if r := e.ask(t, "d", 0, model("m1", "tenant"), model("m9", "plain")); r.OverallCode != over || !same(backends(r), []string{"be/m9"}) {
			t.Fatalf("%v a regular descriptor's backend: %v", charge, r)
		}
		// Metadata blocks merge, the first descriptor's value kept.
		r = e.ask(t, "d", 0, desc("n", "c"), model("m3", "tenant"))
		route = r.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()["route"].GetStructValue().GetFields()
		if r.OverallCode != ok || route["cluster"].GetStringValue() != "main" || route["bucket"].GetStringValue() != "tenant" {
			t.Fatalf("%v merged: %v", charge, r.GetDynamicMetadata())
		}
	}
}

// TestQuotaReported: with QuotaReported, quota descriptors answer as
// envoyproxy/ratelimit's main of 2026-01-22: never refusing, over their
// limit reported OK (nothing remaining, no reset) and in
// quotaModeViolations.
func TestQuotaReported(t *testing.T) {
	e := start(t, Options{DynamicMetadata: true, Charge: ChargeEach, QuotaAnswers: QuotaReported, Config: parse(t, quotaRules)}, nil)
	violations := func(r *rlsv3.RateLimitResponse) []float64 {
		var out []float64
		for _, v := range r.GetDynamicMetadata().GetFields()["quotaModeViolations"].GetListValue().GetValues() {
			out = append(out, v.GetNumberValue())
		}
		return out
	}
	e.ask(t, "d", 0, desc("q1", "a"))
	r := e.ask(t, "d", 0, desc("n", "a"), desc("q1", "a"))
	if q := r.Statuses[1]; r.OverallCode != ok || r.Statuses[0].LimitRemaining != 9 || q.Code != ok || q.LimitRemaining != 0 || q.DurationUntilReset != nil || !same(violations(r), []float64{1}) {
		t.Fatalf("regular beside a quota over: %v", r)
	}
	if !r.GetDynamicMetadata().GetFields()["quotaModeEnabled"].GetBoolValue() || r.GetDynamicMetadata().GetFields()["metadata"] != nil {
		t.Fatalf("metadata: %v", r.GetDynamicMetadata())
	}
	if r := e.ask(t, "d", 0, desc("q1", "a")); r.OverallCode != ok {
		t.Fatalf("a quota alone over its limit: %v, want OK", r)
	}
	// charge: all keeps Admit's own quota mode: a request whose quota
	// descriptors are all over is refused, and counts nothing.
	all := start(t, Options{DynamicMetadata: true, QuotaAnswers: QuotaReported, Config: parse(t, quotaRules)}, nil)
	all.ask(t, "d", 0, desc("q1", "a"))
	r = all.ask(t, "d", 0, desc("q1", "a"), desc("q2", "a"), desc("n", "a"))
	if !same(codesOf(r), []rlsv3.RateLimitResponse_Code{ok, ok, ok, ok}) || !same(violations(r), []float64{0}) {
		t.Fatalf("all, q1 over, q2 not: %v", r)
	}
	all.ask(t, "d", 0, desc("q2", "a"))
	r = all.ask(t, "d", 0, desc("q1", "a"), desc("q2", "a"), desc("n", "a"))
	if !same(codesOf(r), []rlsv3.RateLimitResponse_Code{over, over, over, ok}) || r.Statuses[2].LimitRemaining != 9 {
		t.Fatalf("all, both over: %v", r)
	}
}

// TestGlobalModes: QuotaAll makes every descriptor of a charge: each
// domain a quota one (QUOTA_MODE); GlobalShadow answers OK whatever the
// descriptors say (SHADOW_MODE), their statuses unchanged.
func TestGlobalModes(t *testing.T) {
	e := start(t, Options{Charge: ChargeEach, QuotaAll: true, Config: parse(t, quotaRules)}, nil)
	e.ask(t, "d", 0, desc("n", "a"), desc("q1", "a"))
	for range 9 {
		e.ask(t, "d", 0, desc("n", "a"))
	}
	// n is spent (a quota now), q2 is not: OK.
	if r := e.ask(t, "d", 0, desc("n", "a"), desc("q2", "a")); !same(codesOf(r), []rlsv3.RateLimitResponse_Code{ok, over, ok}) {
		t.Fatalf("QuotaAll, n over, q2 not: %v", r)
	}
	if r := e.ask(t, "d", 0, desc("n", "a"), desc("q1", "a")); r.OverallCode != over {
		t.Fatalf("QuotaAll, both over: %v", r)
	}
	sh := start(t, Options{GlobalShadow: true, Config: parse(t, quotaRules)}, nil)
	sh.ask(t, "d", 0, desc("q1", "a"))
	if r := sh.ask(t, "d", 0, desc("q1", "a")); !same(codesOf(r), []rlsv3.RateLimitResponse_Code{ok, over}) {
		t.Fatalf("GlobalShadow: %v", r)
	}
}

func override(rpu uint32, unit typev3.RateLimitUnit, kv ...string) *rlext.RateLimitDescriptor {
	d := desc(kv...)
	d.Limit = &rlext.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	return d
}

// TestOverridesOfOtherUnitsCountApart: limit overrides of the same entries
// with different units have counters of their own.
func TestOverridesOfOtherUnitsCountApart(t *testing.T) {
	e := start(t, Options{}, nil)
	r := e.ask(t, "messaging", 0, override(2, typev3.RateLimitUnit_SECOND, "o", "1"), override(100, typev3.RateLimitUnit_DAY, "o", "1"))
	if r.OverallCode != ok || !same(remaining(r), []uint32{1, 99}) {
		t.Fatalf("[2/s, 100/day]: %v", r)
	}
	for range 2 {
		e.ask(t, "messaging", 0, override(2, typev3.RateLimitUnit_DAY, "o", "2"))
	}
	if r := e.ask(t, "messaging", 0, override(2, typev3.RateLimitUnit_DAY, "o", "2")); r.OverallCode != over {
		t.Fatalf("third of 2/day: %v", r)
	}
	e.clock.Set(time.Hour + 1100*time.Millisecond)
	if r := e.ask(t, "messaging", 0, override(2, typev3.RateLimitUnit_SECOND, "o", "2")); r.OverallCode != ok {
		t.Fatalf("2/s after 2/day is over: %v", r)
	}
}

// TestSameDescriptorTwice: each is counted, and each reports its place.
func TestSameDescriptorTwice(t *testing.T) {
	e := start(t, Options{}, nil)
	if r := e.ask(t, "messaging", 0, desc("a", "x"), desc("a", "x")); r.OverallCode != ok || !same(remaining(r), []uint32{1, 0}) {
		t.Fatalf("twice: %v", r)
	}
	if r := e.ask(t, "messaging", 0, desc("a", "x")); r.OverallCode != over {
		t.Fatalf("both were counted: %v", r)
	}
}

// TestResetInWholeSeconds: duration_until_reset is whole seconds, rounded
// up, as upstream computes it from the window.
func TestResetInWholeSeconds(t *testing.T) {
	e := start(t, Options{}, nil)
	e.clock.Set(time.Hour + 10300*time.Millisecond)
	r := e.ask(t, "messaging", 0, desc("a", "x"))
	if d := r.Statuses[0].DurationUntilReset; d.GetSeconds() != 50 || d.GetNanos() != 0 {
		t.Fatalf("reset %v, want 50s", d)
	}
}

// TestRefusedRequestRemaining: a descriptor that did not refuse reports
// what it holds, the same whichever descriptor refused the request: one
// whose counter is over, or one that refuses everything.
func TestRefusedRequestRemaining(t *testing.T) {
	e := start(t, Options{}, nil)
	e.ask(t, "messaging", 0, desc("b", "x"))
	for name, refusing := range map[string]*rlext.RateLimitDescriptor{"over": desc("b", "x"), "banned": desc("banned", "x")} {
		r := e.ask(t, "messaging", 0, desc("to_number", name), refusing)
		if r.OverallCode != over || r.Statuses[0].LimitRemaining != 100 {
			t.Errorf("refused by %s: %v", name, r)
		}
	}
}

// TestUpstreamCountingByDefault: with Options.Charge = ChargeEach (what
// admit ratelimit sets), a file with no charge: line counts as
// envoyproxy/ratelimit does, in the scenarios where Admit's all or nothing
// answers differently; a file that says charge: all keeps it.
func TestUpstreamCountingByDefault(t *testing.T) {
	const rules = `
descriptors:
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 2}
`
	e := start(t, Options{Charge: ChargeEach, Config: parse(t, "domain: d\n"+rules)}, nil)
	// Shadow mode: hits past a shadow limit are counted (upstream's counter
	// at 28 of 20), the request admitted.
	e.ask(t, "d", 0, hitsOf(desc("shadow", "s"), 8))
	if r := e.ask(t, "d", 0, hitsOf(desc("shadow", "s"), 20)); r.OverallCode != ok {
		t.Fatalf("shadow, 20 more on 8 of 20: %v", r)
	}
	if r := e.ask(t, "d", 0, hitsOf(desc("shadow", "s"), 0)); r.Statuses[0].LimitRemaining != 0 {
		t.Errorf("shadow after 28 hits of 20: remaining %d, want 0 (counted)", r.Statuses[0].LimitRemaining)
	}
	// A regular descriptor under its limit beside a quota descriptor over
	// its own: the quota answers OVER_LIMIT with its reset, and as the
	// request's only quota group is over, so is the request; the regular
	// one is counted.
	e.ask(t, "d", 0, desc("quota", "q"))
	r := e.ask(t, "d", 0, desc("regular", "r"), desc("quota", "q"))
	if q := r.Statuses[1]; r.OverallCode != over || r.Statuses[0].LimitRemaining != 4 || q.Code != over || q.LimitRemaining != 0 || q.DurationUntilReset.GetSeconds() == 0 || q.CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Fatalf("regular beside a quota over: %v, want OVER_LIMIT, 4 of 5 left, the quota over", r)
	}
	// Check, then debit, on 2 a minute: the 4th check is refused.
	var checks []rlsv3.RateLimitResponse_Code
	for range 4 {
		checks = append(checks, e.ask(t, "d", 0, hitsOf(desc("tokens", "t"), 0)).OverallCode)
		e.ask(t, "d", 0, hitsOf(desc("tokens", "t"), 1))
	}
	if !same(checks, []rlsv3.RateLimitResponse_Code{ok, ok, ok, over}) {
		t.Errorf("checks between debits: %v, want ok ok ok over", checks)
	}

	// The file's own line wins over the service's default.
	all := start(t, Options{Charge: ChargeEach, Config: parse(t, "domain: d\ncharge: all\n"+rules)}, nil)
	checks = checks[:0]
	for range 4 {
		checks = append(checks, all.ask(t, "d", 0, hitsOf(desc("tokens", "t"), 0)).OverallCode)
		all.ask(t, "d", 0, hitsOf(desc("tokens", "t"), 1))
	}
	if !same(checks, []rlsv3.RateLimitResponse_Code{ok, ok, ok, ok}) {
		t.Errorf("charge: all, checks between hits: %v, want all ok (a refused hit is not counted)", checks)
	}
}

// TestUpstreamConfigErrors: broken files are refused in
// envoyproxy/ratelimit's words (its config_impl.go; yaml.v2 gives the
// same syntax message as yaml.v3 here), Admit adding the
// file, line and column before them.
func TestUpstreamConfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"bad YAML", "domain: d\ndescriptors: [\n", "error loading config file: yaml: line 2: did not find expected node content"},
		{"a list of scalars", "domain: d\ndescriptors:\n  - a\n  - [b, c]\n", "config error, yaml file contains list of type other than map: a"},
		{"a list in the list", "domain: d\ndescriptors:\n  - [b, c]\n", "config error, yaml file contains list of type other than map: [b c]"},
		{"no domain", "descriptors: []\n", "config file cannot have empty domain"},
		{"an unknown key", "domain: d\nbogus: 1\n", "config error, unknown key 'bogus'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(File{Name: "rl.yaml", Data: []byte(tc.yaml)})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "rl.yaml:") {
				t.Errorf("got %v\nwant the file named and %q", err, tc.want)
			}
		})
	}
}

// TestLargeHitsCounted: with charge: each, a fixed window counts a hit of
// any cost, as envoyproxy/ratelimit does: 2e9 fits a limit of 4e9, and a
// cost past bounds.MaxCost (up to 2⁶⁴−1) is counted, so the next check is
// refused. Red team, 2026-11-26: such costs were refused and not counted.
func TestLargeHitsCounted(t *testing.T) {
	e := start(t, Options{Charge: ChargeEach, Config: parse(t, `
domain: d
descriptors:
  - {key: huge, rate_limit: {unit: day, requests_per_unit: 4000000000}}
  - {key: five, rate_limit: {unit: minute, requests_per_unit: 5}}
`)}, nil)
	if r := e.ask(t, "d", 0, hitsOf(desc("huge", "a"), 2_000_000_000)); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 2_000_000_000 {
		t.Fatalf("2e9 of 4e9: %v", r)
	}
	if r := e.ask(t, "d", 0, hitsOf(desc("huge", "a"), 2_000_000_001)); r.OverallCode != over {
		t.Fatalf("2e9+1 more: %v", r)
	}
	for _, n := range []uint64{1_000_000_001, 1 << 63, 1<<64 - 1} {
		key := strconv.FormatUint(n, 10)
		if r := e.ask(t, "d", 0, hitsOf(desc("five", key), n)); r.OverallCode != over {
			t.Fatalf("%d hits of 5: %v", n, r)
		}
		if r := e.ask(t, "d", 0, hitsOf(desc("five", key), 0)); r.OverallCode != over || r.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("a check after %d hits of 5: %v, want refused (counted)", n, r)
		}
	}
}

// TestShadowQuota: a quota limit in shadow mode answers OK over its limit
// and its group is never over; with QuotaAll, so is a shadow limit's, and
// a descriptor no limit matches is a group never over. Red team,
// 2026-11-26: they answered OVER_LIMIT and refused requests.
func TestShadowQuota(t *testing.T) {
	rules := parse(t, `
domain: d
descriptors:
  - {key: sh, shadow_mode: true, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: shr, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 0}}
  - {key: one, rate_limit: {unit: minute, requests_per_unit: 1}}
`)
	for _, charge := range []Charge{ChargeAll, ChargeEach} {
		e := start(t, Options{Charge: charge, Config: rules}, nil)
		for i := range 3 {
			if r := e.ask(t, "d", 0, desc("sh", "1")); r.OverallCode != ok || r.Statuses[0].Code != ok {
				t.Fatalf("%v, shadow quota, ask %d: %v", charge, i+1, r)
			}
		}
	}
	e := start(t, Options{Charge: ChargeEach, QuotaAll: true, Config: rules}, nil)
	e.ask(t, "d", 0, desc("one", "1"))
	if r := e.ask(t, "d", 0, desc("shr", "1"), desc("one", "1")); r.OverallCode != ok || r.Statuses[0].Code != ok {
		t.Fatalf("QuotaAll, a shadow limit beside one over: %v", r)
	}
	if r := e.ask(t, "d", 0, desc("nothing", "1"), desc("one", "1")); r.OverallCode != ok {
		t.Fatalf("QuotaAll, an unmatched descriptor beside one over: %v", r)
	}
}

// TestMetadataScalars: metadata scalars keep their YAML types, and the
// others their text (a date is "2026-12-31"), as envoyproxy/ratelimit
// reads them. Red team, 2026-11-26: a date refused the file.
func TestMetadataScalars(t *testing.T) {
	e := start(t, Options{DynamicMetadata: true, Config: parse(t, `
domain: d
descriptors:
  - key: k
    metadata: {expires: 2026-12-31, at: 2026-12-31T10:00:00Z, n: 3, f: 1.5, b: true, z: ~, s: text, l: [1, a]}
    rate_limit: {unit: minute, requests_per_unit: 10}
`)}, nil)
	md := e.ask(t, "d", 0, desc("k", "v")).GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()
	if md["expires"].GetStringValue() != "2026-12-31" || md["at"].GetStringValue() != "2026-12-31T10:00:00Z" || md["n"].GetNumberValue() != 3 ||
		md["f"].GetNumberValue() != 1.5 || !md["b"].GetBoolValue() || md["z"].GetNullValue() != 0 || md["z"] == nil || md["s"].GetStringValue() != "text" ||
		len(md["l"].GetListValue().GetValues()) != 2 {
		t.Fatalf("metadata %v", md)
	}
}

// TestManyHitsOneRequest: with charge: each, a request of more charges
// than one decision takes (a descriptor repeated 64 times) is decided in
// several: every hit counted. Red team, 2026-11-26: INVALID_ARGUMENT.
func TestManyHitsOneRequest(t *testing.T) {
	e := start(t, Options{Charge: ChargeEach, Config: parse(t, "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 40}}\n")}, nil)
	ds := make([]*rlext.RateLimitDescriptor, MaxDescriptors)
	for i := range ds {
		ds[i] = desc("k", "v")
	}
	r := e.ask(t, "d", 0, ds...)
	if r.OverallCode != over || r.Statuses[38].Code != ok || r.Statuses[39].LimitRemaining != 0 || r.Statuses[40].Code != over || r.Statuses[63].Code != over {
		t.Fatalf("64 hits of 40: %v", r)
	}
	if r := e.ask(t, "d", 0, hitsOf(desc("k", "v"), 0)); r.OverallCode != over || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("a check after: %v", r)
	}
	all := start(t, Options{Config: parse(t, "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 40}}\n")}, nil)
	if _, err := all.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: ds}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("charge: all, 64 charges: %v, want InvalidArgument", err)
	}
}

// TestMetadataLimitText: a descriptor's limit override reads the same in
// the dynamic metadata of every build, one space between its fields,
// where the protobuf text format spaces them differently build to build.
func TestMetadataLimitText(t *testing.T) {
	e := start(t, Options{DynamicMetadata: true, Config: parse(t, quotaRules)}, nil)
	d := desc("plain", "x")
	d.Limit = &rlext.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
	r := e.ask(t, "d", 0, d)
	got := r.GetDynamicMetadata().GetFields()["descriptors"].GetListValue().GetValues()[0].GetStructValue().GetFields()["limit"].GetStringValue()
	if got != "requests_per_unit:2 unit:MINUTE" {
		t.Errorf("limit %q in the metadata, want %q", got, "requests_per_unit:2 unit:MINUTE")
	}
}
