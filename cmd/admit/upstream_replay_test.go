package main

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/admitdev/admit/redistest"
)

// The scenarios of envoyproxy/ratelimit's own tests (main of 2026-01-22:
// test/integration/integration_test.go, test/redis/fixed_cache_impl_test.go,
// test/service/ratelimit_test.go), written from what they check and
// replayed against admit ratelimit: each request's overall code, each
// descriptor's code, limit and remaining, and the statistics. Where
// upstream's test mocks a counter at some value, the replay brings it
// there with hits of its own and checks what changes.

// replayFiles are the configurations the scenarios use, with the limits
// of upstream's test configurations (hours or days where its unit test
// mocks the time, so that no window ends during a replay).
var replayFiles = map[string]string{
	"basic.yaml": `domain: basic
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: one_per_minute
    rate_limit: {unit: minute, requests_per_unit: 1}
`,
	"another.yaml": `domain: another
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
`,
	"cache.yaml": `domain: cache
descriptors:
  - key: key4
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: key5
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: key6
    rate_limit: {unit: hour, requests_per_unit: 8}
  - key: key7
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: key8
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: key9
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: key
    value: value
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: key2
    value: value2
    descriptors:
      - key: subkey2
        value: subvalue2
        rate_limit: {unit: minute, requests_per_unit: 10}
`,
	"service.yaml": `domain: service
descriptors:
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: regular
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: quota
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
`,
	// The limits of upstream's integration-test scripts quota.sh and
	// token-quota.sh, and of its service tests of quota groups.
	"quota.yaml": `domain: quota
descriptors:
  - {key: q1, value: limit, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: q2, value: limit, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: tokens, value: limit, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 2}}
  - key: backend_name
    descriptors:
      - key: model_name_override
        descriptors:
          - {key: tenant, quota_mode: true, rate_limit: {unit: hour, requests_per_unit: 1}}
          - {key: default, quota_mode: true, rate_limit: {unit: hour, requests_per_unit: 2}}
`,
}

// replayStep is one request and what upstream answers and counts.
type replayStep struct {
	domain string
	hits   uint32
	descs  [][]string // each descriptor's keys and values
	check  bool       // every descriptor says hits_addend 0
	over   bool       // the overall code is OVER_LIMIT
	// want is each descriptor's status: "OK" or "OVER", the limit as
	// "20/MINUTE" ("" for none), and the remaining.
	want []string
	// stats are counters' values after the request (ratelimit.service.
	// rate_limit.<key>.<stat>, the prefix left out).
	stats map[string]uint64
}

type replayScenario struct {
	name, from string
	steps      []replayStep
}

func st(code, limit string, remaining int) string {
	return fmt.Sprintf("%s %s %d", code, limit, remaining)
}

// replayScenarios returns the scenarios; every random value of upstream's
// tests is a value of their own here.
func replayScenarios() []replayScenario {
	var sc []replayScenario
	sc = append(sc, replayScenario{name: "no limit for an unknown domain", from: "integration testBasicBaseConfig", steps: []replayStep{
		{domain: "foo", hits: 1, descs: [][]string{{"hello", "world"}}, want: []string{st("OK", "", 0)}},
	}})
	sc = append(sc, replayScenario{name: "a first hit", from: "integration testBasicBaseConfig", steps: []replayStep{
		{domain: "basic", hits: 1, descs: [][]string{{"key1", "foo"}}, want: []string{st("OK", "50/SECOND", 49)},
			stats: map[string]uint64{"basic.key1.total_hits": 1}},
	}})
	over := replayScenario{name: "25 hits on 20 a minute", from: "integration testBasicBaseConfig"}
	for i := range 25 {
		s := replayStep{domain: "another", hits: 1, descs: [][]string{{"key2", "r1"}}, want: []string{st("OK", "20/MINUTE", 20-(i+1))},
			stats: map[string]uint64{"another.key2.total_hits": uint64(i + 1)}}
		if i >= 20 {
			s.over, s.want[0] = true, st("OVER", "20/MINUTE", 0)
			s.stats["another.key2.over_limit"] = uint64(i - 19)
		}
		over.steps = append(over.steps, s)
	}
	sc = append(sc, over)
	two := replayScenario{name: "two limits, the second over after 10", from: "integration testBasicBaseConfig"}
	for i := range 15 {
		s := replayStep{domain: "another", hits: 1, descs: [][]string{{"key2", "r2"}, {"key3", "r2"}},
			want:  []string{st("OK", "20/MINUTE", 20-(i+1)), st("OK", "10/HOUR", 10-(i+1))},
			stats: map[string]uint64{"another.key3.total_hits": uint64(i + 1)}}
		if i >= 10 {
			s.over, s.want[1] = true, st("OVER", "10/HOUR", 0)
			s.stats["another.key3.over_limit"] = uint64(i - 9)
		}
		two.steps = append(two.steps, s)
	}
	sc = append(sc, two)
	// TestNearLimit: counters brought to a value, then the hits whose
	// statistics the test checks (near: past 0.8 of the limit).
	near := func(key, limit string, pre int, hits uint32, want string, stats map[string]uint64) replayScenario {
		r := replayScenario{name: fmt.Sprintf("%s: %d hits on a counter at %d of %s", key, hits, pre, limit), from: "redis TestNearLimit"}
		if stats != nil {
			stats["cache."+key+".total_hits"] = uint64(pre) + uint64(hits)
		}
		for range pre {
			r.steps = append(r.steps, replayStep{domain: "cache", hits: 1, descs: [][]string{{key, "v"}}})
		}
		r.steps = append(r.steps, replayStep{domain: "cache", hits: hits, descs: [][]string{{key, "v"}}, over: strings.HasPrefix(want, "OVER"), want: []string{want}, stats: stats})
		return r
	}
	sc = append(sc,
		near("key4", "15", 10, 1, st("OK", "15/HOUR", 4), map[string]uint64{"cache.key4.within_limit": 11, "cache.key4.near_limit": 0}),
		near("key5", "20", 2, 3, st("OK", "20/HOUR", 15), map[string]uint64{"cache.key5.within_limit": 5, "cache.key5.near_limit": 0}),
		near("key6", "8", 5, 2, st("OK", "8/HOUR", 1), map[string]uint64{"cache.key6.within_limit": 7, "cache.key6.near_limit": 1}),
		near("key7", "20", 16, 3, st("OK", "20/HOUR", 1), map[string]uint64{"cache.key7.within_limit": 19, "cache.key7.near_limit": 3}),
		near("key8", "20", 19, 3, st("OVER", "20/HOUR", 0), map[string]uint64{"cache.key8.over_limit": 2, "cache.key8.near_limit": 4}),
	)
	// TestNearLimit, counting on from 11: 13, then 16, of 15.
	k9 := near("key9", "15", 10, 1, st("OK", "15/HOUR", 4), nil)
	k9.name = "key9: near, then over 15"
	k9.steps = append(k9.steps,
		replayStep{domain: "cache", hits: 2, descs: [][]string{{"key9", "v"}}, want: []string{st("OK", "15/HOUR", 2)}, stats: map[string]uint64{"cache.key9.near_limit": 1}},
		replayStep{domain: "cache", hits: 3, descs: [][]string{{"key9", "v"}}, over: true, want: []string{st("OVER", "15/HOUR", 0)},
			stats: map[string]uint64{"cache.key9.near_limit": 3, "cache.key9.over_limit": 1, "cache.key9.within_limit": 13, "cache.key9.total_hits": 16}},
	)
	sc = append(sc, k9)
	// TestRedis: a counter at 5 of 10; a descriptor with no limit beside
	// one at 11 of 10, two levels down (its statistics named for both).
	at5 := replayScenario{name: "a counter at 5 of 10", from: "redis TestRedis"}
	for range 4 {
		at5.steps = append(at5.steps, replayStep{domain: "cache", hits: 1, descs: [][]string{{"key", "value"}}})
	}
	at5.steps = append(at5.steps, replayStep{domain: "cache", hits: 1, descs: [][]string{{"key", "value"}}, want: []string{st("OK", "10/HOUR", 5)},
		stats: map[string]uint64{"cache.key_value.total_hits": 5, "cache.key_value.within_limit": 5}})
	sub := []string{"key2", "value2", "subkey2", "subvalue2"}
	at11 := replayScenario{name: "no limit beside a counter at 11 of 10", from: "redis TestRedis"}
	for range 10 {
		at11.steps = append(at11.steps, replayStep{domain: "cache", hits: 1, descs: [][]string{sub}})
	}
	at11.steps = append(at11.steps, replayStep{domain: "cache", hits: 1, descs: [][]string{{"nolimit", "x"}, sub}, over: true,
		want: []string{st("OK", "", 0), st("OVER", "10/MINUTE", 0)},
		stats: map[string]uint64{"cache.key2_value2.subkey2_subvalue2.total_hits": 11, "cache.key2_value2.subkey2_subvalue2.over_limit": 1,
			"cache.key2_value2.subkey2_subvalue2.within_limit": 10, "cache.key2_value2.subkey2_subvalue2.near_limit": 2}})
	sc = append(sc, at5, at11)
	// Shadow mode: over its limit, the descriptor and the request are OK,
	// and the hits over it counted in shadow_mode.
	sc = append(sc, replayScenario{name: "a shadow rule over its limit", from: "service TestRuleShadowMode", steps: []replayStep{
		{domain: "service", hits: 1, descs: [][]string{{"shadow", "s"}}, want: []string{st("OK", "1/HOUR", 0)}},
		{domain: "service", hits: 1, descs: [][]string{{"shadow", "s"}}, want: []string{st("OK", "1/HOUR", 0)},
			stats: map[string]uint64{"service.shadow.over_limit": 1, "service.shadow.shadow_mode": 1}},
	}})
	sc = append(sc, replayScenario{name: "a shadow rule and a regular one, both over", from: "service TestMixedRuleShadowMode", steps: []replayStep{
		{domain: "service", hits: 1, descs: [][]string{{"shadow", "m"}, {"regular", "m"}}, want: []string{st("OK", "1/HOUR", 0), st("OK", "1/HOUR", 0)}},
		{domain: "service", hits: 1, descs: [][]string{{"shadow", "m"}, {"regular", "m"}}, over: true, want: []string{st("OK", "1/HOUR", 0), st("OVER", "1/HOUR", 0)},
			stats: map[string]uint64{"service.shadow.shadow_mode": 2, "service.regular.over_limit": 1}},
	}})
	// Quota mode, as upstream's main answers since spring 2026: a quota
	// over its limit answers OVER_LIMIT; the request is over when a
	// regular descriptor is or every quota group is (here each quota
	// descriptor is a group of its own).
	sc = append(sc, replayScenario{name: "quota mode", from: "service TestServicePerDescriptorQuotaMode, TestServiceMixedPerDescriptorModes, TestServiceQuotaModeOnly*", steps: []replayStep{
		{domain: "service", hits: 1, descs: [][]string{{"quota", "a"}}, want: []string{st("OK", "1/HOUR", 0)}},
		{domain: "service", hits: 1, descs: [][]string{{"quota", "a"}}, over: true, want: []string{st("OVER", "1/HOUR", 0)}},
		{domain: "service", hits: 1, descs: [][]string{{"regular", "a"}, {"quota", "a"}}, over: true, want: []string{st("OK", "1/HOUR", 0), st("OVER", "1/HOUR", 0)}},
		{domain: "service", hits: 1, descs: [][]string{{"regular", "a"}, {"quota", "a"}}, over: true, want: []string{st("OVER", "1/HOUR", 0), st("OVER", "1/HOUR", 0)}},
		{domain: "service", hits: 1, descs: [][]string{{"q2", "a"}}, want: []string{st("OK", "1/HOUR", 0)}},
		{domain: "service", hits: 1, descs: [][]string{{"quota", "a"}, {"q2", "a"}}, over: true, want: []string{st("OVER", "1/HOUR", 0), st("OVER", "1/HOUR", 0)}},
		{domain: "service", hits: 1, descs: [][]string{{"quota", "a"}, {"q2", "b"}}, want: []string{st("OVER", "1/HOUR", 0), st("OK", "1/HOUR", 0)}},
	}})
	sc = append(sc, replayScenario{name: "quota.sh", from: "integration-test/scripts/quota.sh", steps: []replayStep{
		{domain: "quota", hits: 1, descs: [][]string{{"q1", "limit"}, {"q2", "limit"}}, want: []string{st("OK", "1/MINUTE", 0), st("OK", "2/MINUTE", 1)}},
		{domain: "quota", hits: 1, descs: [][]string{{"q1", "limit"}, {"q2", "limit"}}, want: []string{st("OVER", "1/MINUTE", 0), st("OK", "2/MINUTE", 0)}},
		{domain: "quota", hits: 1, descs: [][]string{{"q1", "limit"}, {"q2", "limit"}}, over: true, want: []string{st("OVER", "1/MINUTE", 0), st("OVER", "2/MINUTE", 0)}},
	}})
	// A check (hits_addend 0) then a debit (1) per call, as an LLM
	// gateway asks before and after a call.
	var tokens []replayStep
	for i := range 4 {
		check := replayStep{domain: "quota", check: true, descs: [][]string{{"tokens", "limit"}}, want: []string{st("OK", "2/MINUTE", 2-min(i, 2))}}
		if i == 3 {
			check.over, check.want = true, []string{st("OVER", "2/MINUTE", 0)}
		}
		debit := replayStep{domain: "quota", hits: 1, descs: [][]string{{"tokens", "limit"}}, want: []string{st("OK", "2/MINUTE", 1-i)}}
		if i >= 2 {
			debit.over, debit.want = true, []string{st("OVER", "2/MINUTE", 0)}
		}
		tokens = append(tokens, check, debit)
	}
	sc = append(sc, replayScenario{name: "token-quota.sh", from: "integration-test/scripts/token-quota.sh", steps: tokens})
	// Quota groups: the descriptors of one backend_name and
	// model_name_override are one group, over when any is; the request is
	// over when every group is.
	model := func(backend, model, bucket string) []string {
		return []string{"backend_name", backend, "model_name_override", model, bucket, "x"}
	}
	sc = append(sc, replayScenario{name: "quota groups", from: "service TestServiceQuotaModeSameGroup*, TestServiceQuotaModeMultiModel*", steps: []replayStep{
		{domain: "quota", hits: 1, descs: [][]string{model("be", "m1", "tenant"), model("be", "m1", "default")}, want: []string{st("OK", "1/HOUR", 0), st("OK", "2/HOUR", 1)}},
		// The tenant's bucket over, the model's default not: the group
		// is over, and with it the request.
		{domain: "quota", hits: 1, descs: [][]string{model("be", "m1", "tenant"), model("be", "m1", "default")}, over: true, want: []string{st("OVER", "1/HOUR", 0), st("OK", "2/HOUR", 0)}},
		// Another model still has quota: the request fails over to it.
		{domain: "quota", hits: 1, descs: [][]string{model("be", "m1", "tenant"), model("be", "m2", "default")}, want: []string{st("OVER", "1/HOUR", 0), st("OK", "2/HOUR", 1)}},
		{domain: "quota", hits: 1, descs: [][]string{model("be", "m1", "default"), model("be", "m2", "default")}, want: []string{st("OVER", "2/HOUR", 0), st("OK", "2/HOUR", 0)}},
		{domain: "quota", hits: 1, descs: [][]string{model("be", "m1", "default"), model("be", "m2", "default")}, over: true, want: []string{st("OVER", "2/HOUR", 0), st("OVER", "2/HOUR", 0)}},
	}})
	sc = append(sc, replayScenario{name: "unlimited", from: "service TestUnlimited", steps: []replayStep{
		{domain: "service", hits: 1, descs: [][]string{{"free", "f"}}, want: []string{st("OK", "", 4294967295)}},
	}})
	return sc
}

// replayDifferences are the mismatches each store and counting mode is
// known to have, as docs/envoy.md lists them: none with charge: each;
// with charge: all, a limit under its own beside one over is not
// counted (as upstream's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT), the
// same on both stores but for Redis's local refusals (replayLocal).
var replayDifferences = map[string][]string{
	"memory/each": nil,
}

func init() {
	replayDifferences["redis/each"] = replayDifferences["memory/each"]
	var all []string
	for i := 10; i < 15; i++ {
		step := fmt.Sprintf("two limits, the second over after 10 step %d: descriptor 0 ", i+1)
		all = append(all, step+st("OK", "20/MINUTE", 10)+", upstream "+st("OK", "20/MINUTE", 20-(i+1)))
		if i > 10 {
			replayLocal[step+st("OVER", "20/MINUTE", 0)+", upstream "+st("OK", "20/MINUTE", 20-(i+1))] = all[len(all)-1]
		}
	}
	// A request refused is not counted: after a quota refused once, the
	// other counters of its request stand lower than upstream's.
	all = append(all,
		"quota groups step 2: descriptor 1 OK 2/HOUR 1, upstream OK 2/HOUR 0",
		"quota groups step 4: descriptor 0 OK 2/HOUR 0, upstream OVER 2/HOUR 0",
		"token-quota.sh step 7: descriptor 0 OK 2/MINUTE 0, upstream OVER 2/MINUTE 0",
		"token-quota.sh step 7: over false, upstream true",
		"quota mode step 3: descriptor 0 OK 1/HOUR 1, upstream OK 1/HOUR 0",
		"quota mode step 4: descriptor 0 OK 1/HOUR 1, upstream OVER 1/HOUR 0")
	replayLocal["quota mode step 3: descriptor 0 OVER 1/HOUR 0, upstream OK 1/HOUR 0"] = "quota mode step 3: descriptor 0 OK 1/HOUR 1, upstream OK 1/HOUR 0"
	replayLocal["quota mode step 4"] = "quota mode step 4: descriptor 0 OK 1/HOUR 1, upstream OVER 1/HOUR 0"
	replayDifferences["memory/all"] = all
	replayDifferences["redis/all"] = all
}

// replayLocal are, with charge: all on Redis, the answers of a request
// refused without asking Redis (a counter it refused a moment ago: how
// long a moment is, against how fast the machine replays, decides which),
// each with the line memory's answer makes of the step, which stands for
// it; a key naming a step alone stands for a step that then matches
// upstream (its descriptors reported over, nothing remaining).
var replayLocal = map[string]string{}

// sameAsMemory rewrites diffs, a replay's on Redis with charge: all, as
// memory's: each answer of a local refusal as the line it stands for, and
// the lines of steps a local refusal made match upstream, as memory's.
func sameAsMemory(diffs []string) []string {
	out := make([]string, 0, len(diffs))
	for _, d := range diffs {
		if m, ok := replayLocal[d]; ok {
			d = m
		}
		out = append(out, d)
	}
	for k, m := range replayLocal {
		if !strings.Contains(k, ": ") && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// TestUpstreamReplay replays the scenarios on admit ratelimit, on the
// memory store and on Redis, counting as upstream counts (the default)
// and all or nothing (ADMIT_CHARGE=all), and checks that the mismatches
// are exactly the ones docs/envoy.md lists.
func TestUpstreamReplay(t *testing.T) {
	environ := ratelimitRuntime(t, replayFiles)
	for _, store := range []string{"memory", "redis"} {
		for _, charge := range []string{"each", "all"} {
			t.Run(store+"/"+charge, func(t *testing.T) {
				metrics := freeAddr(t)
				env := environ("ADMIT_CHARGE", charge, "USE_STATSD", "false", "USE_PROMETHEUS", "true", "PROMETHEUS_ADDR", metrics)
				if store == "redis" {
					env["REDIS_URL"] = redistest.Start(t).Addr
				}
				r := startCmdEnv(t, env, "ratelimit")
				c := rlsClient(t, r.grpc)
				var diffs []string
				checks := 0
				for _, sc := range replayScenarios() {
					awayFromWindowEnds()
					for i, s := range sc.steps {
						got := replayRequest(t, c, s)
						where := fmt.Sprintf("%s step %d", sc.name, i+1)
						if s.want != nil {
							checks++
							if got.over != s.over {
								diffs = append(diffs, fmt.Sprintf("%s: over %v, upstream %v", where, got.over, s.over))
							}
							for k, w := range s.want {
								if got.statuses[k] != w {
									diffs = append(diffs, fmt.Sprintf("%s: descriptor %d %s, upstream %s", where, k, got.statuses[k], w))
								}
							}
						}
						if s.stats != nil {
							stats := scrapeUpstream(t, metrics)
							for _, name := range slices.Sorted(maps.Keys(s.stats)) {
								checks++
								if v := stats[name]; v != s.stats[name] {
									diffs = append(diffs, fmt.Sprintf("%s: %s = %d, upstream %d", where, name, v, s.stats[name]))
								}
							}
						}
					}
				}
				want := slices.Clone(replayDifferences[store+"/"+charge])
				if store == "redis" && charge == "all" {
					diffs = sameAsMemory(diffs)
				}
				slices.Sort(diffs)
				slices.Sort(want)
				t.Logf("%d checks, %d differ", checks, len(diffs))
				if !slices.Equal(diffs, want) {
					t.Errorf("differences from envoyproxy/ratelimit:\n%s\nwant those docs/envoy.md lists:\n%s", strings.Join(diffs, "\n"), strings.Join(want, "\n"))
				}
			})
		}
	}
}

type replayAnswer struct {
	over     bool
	statuses []string
}

func replayRequest(t *testing.T, c rlsv3.RateLimitServiceClient, s replayStep) replayAnswer {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: s.domain, HitsAddend: s.hits}
	for _, kv := range s.descs {
		d := &rlext.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &rlext.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		if s.check {
			d.HitsAddend = wrapperspb.UInt64(0)
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	resp, err := c.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	a := replayAnswer{over: resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT}
	for _, ds := range resp.Statuses {
		code, limit := "OK", ""
		if ds.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			code = "OVER"
		}
		if l := ds.CurrentLimit; l != nil {
			limit = fmt.Sprintf("%d/%s", l.RequestsPerUnit, l.Unit)
		}
		a.statuses = append(a.statuses, st(code, limit, int(ds.LimitRemaining)))
	}
	return a
}

// scrapeUpstream reads envoyproxy/ratelimit's per-limit statistics from
// the Prometheus metrics at addr, by their statsd names without the
// ratelimit.service.rate_limit. prefix.
func scrapeUpstream(t *testing.T, addr string) map[string]uint64 {
	t.Helper()
	_, body := get(t, "http://"+addr+"/metrics")
	stats := map[string]uint64{}
	lines := bufio.NewScanner(strings.NewReader(body))
	for lines.Scan() {
		stat, rest, ok := strings.Cut(strings.TrimPrefix(lines.Text(), "ratelimit_service_rate_limit_"), "{")
		if !ok || len(rest) == len(lines.Text()) || !strings.HasPrefix(lines.Text(), "ratelimit_service_rate_limit_") {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		var key []string
		for _, l := range strings.Split(labels, ",") {
			_, v, _ := strings.Cut(l, "=")
			key = append(key, strings.Trim(v, `"`))
		}
		n, err := strconv.ParseUint(value, 10, 64)
		if err != nil {
			t.Fatalf("metric line %q", lines.Text())
		}
		stats[strings.Join(key, ".")+"."+stat] = n
	}
	return stats
}

// awayFromWindowEnds waits, when a minute ends within the next 5 s,
// until it has, so that no window of the scenario that follows ends
// while it runs.
func awayFromWindowEnds() {
	if left := time.Minute - time.Duration(time.Now().UnixNano())%time.Minute; left < 5*time.Second {
		time.Sleep(left + 10*time.Millisecond)
	}
}
