package kuadrant

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// policy returns a policy manifest: kind RateLimitPolicy unless kind says
// TokenRateLimitPolicy, targeting target ("HTTPRoute toystore",
// "Gateway external#http"), with spec, the rest of the spec, indented by
// two.
func manifest(kind, namespace, name, target, spec string) string {
	version := "kuadrant.io/v1"
	if kind == tokenRateLimitPolicy {
		version = "kuadrant.io/v1alpha1"
	}
	tkind, tname, _ := strings.Cut(target, " ")
	tname, section, _ := strings.Cut(tname, "#")
	ref := fmt.Sprintf("    group: gateway.networking.k8s.io\n    kind: %s\n    name: %s\n", tkind, tname)
	if section != "" {
		ref += "    sectionName: " + section + "\n"
	}
	return fmt.Sprintf("apiVersion: %s\nkind: %s\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  targetRef:\n%s%s---\n", version, kind, name, namespace, ref, spec)
}

func rlp(namespace, name, target, spec string) string {
	return manifest(rateLimitPolicy, namespace, name, target, spec)
}

func trlp(namespace, name, target, spec string) string {
	return manifest(tokenRateLimitPolicy, namespace, name, target, spec)
}

// limits is a spec with implicit defaults: one limit per name, each of one
// rate of 5 a minute.
func limits(names ...string) string {
	s := "  limits:\n"
	for _, n := range names {
		s += fmt.Sprintf("    %s:\n      rates:\n      - limit: 5\n        window: 1m\n", n)
	}
	return s
}

// within puts a limits spec under defaults or overrides with a strategy.
func within(section, strategy, spec string) string {
	indented := strings.ReplaceAll(strings.TrimSuffix(spec, "\n"), "\n", "\n  ")
	return fmt.Sprintf("  %s:\n    strategy: %s\n  %s\n", section, strategy, indented)
}

// httpRoute is an HTTPRoute on parents ("gateway-system/external",
// "gateway-system/external#http") with rules named (or "" for rule-N).
func httpRoute(namespace, name string, parents []string, rules ...string) string {
	s := fmt.Sprintf("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  parentRefs:\n", name, namespace)
	if len(parents) == 0 {
		s += "  - {kind: Service, group: \"\", name: mesh}\n"
	}
	for _, p := range parents {
		gw, section, _ := strings.Cut(p, "#")
		ns, n, _ := strings.Cut(gw, "/")
		s += fmt.Sprintf("  - name: %s\n    namespace: %s\n", n, ns)
		if section != "" {
			s += "    sectionName: " + section + "\n"
		}
	}
	if len(rules) > 0 {
		s += "  rules:\n"
		for _, r := range rules {
			if r == "" {
				s += "  - matches: [{path: {value: /}}]\n"
			} else {
				s += "  - name: " + r + "\n"
			}
		}
	}
	return s + "---\n"
}

var ext = []string{"gateway-system/external"}

// render shows a limit as "namespace name limit.NAME max/seconds variables".
func render(l Limit) string {
	id := regexp.MustCompile(`^descriptors\[0\]\["((?:token)?limit\.[^"]*)__[0-9a-f]{8}"\] == "1"$`).FindStringSubmatch(l.Conditions[0])
	if len(l.Conditions) != 1 || id == nil {
		return fmt.Sprintf("unexpected conditions %q", l.Conditions)
	}
	s := fmt.Sprintf("%s %s %s %d/%d", l.Namespace, l.Name, id[1], l.MaxValue, l.Seconds)
	for _, v := range l.Variables {
		s += " " + v
	}
	return s
}

type importCase struct {
	name     string
	policies string
	routes   string
	opts     Options
	want     []string // rendered limits, in order
	refused  []string // one text each refusal holds, in order
}

func runCases(t *testing.T, cases []importCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var routes []File
			if c.routes != "" {
				routes = []File{{Name: "routes.yaml", Data: []byte(c.routes)}}
			}
			res, err := Import([]File{{Name: "policies.yaml", Data: []byte(c.policies)}}, routes, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, l := range res.Limits {
				got = append(got, render(l))
			}
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Errorf("limits:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
			if len(res.Refused) != len(c.refused) {
				t.Errorf("%d refused, want %d:\n%v", len(res.Refused), len(c.refused), res.Refused)
				return
			}
			for i, r := range res.Refused {
				if !strings.Contains(r.Error(), c.refused[i]) {
					t.Errorf("refusal %d: %v\nwant it to hold %q", i, r, c.refused[i])
				}
			}
		})
	}
}

// TestImportIdentifiers: the operator's own vectors for its identifiers.
func TestImportIdentifiers(t *testing.T) {
	for _, c := range []struct {
		kind, namespace, name, limit, want string
	}{
		{rateLimitPolicy, "testNS", "rlpA", "foo", "limit.foo__1da6e70a"},
		{rateLimitPolicy, "testNS", "rlpB", "foo", "limit.foo__2c1520b6"},
		{rateLimitPolicy, "testNS", "rlpA", "", "limit.__6d5e49dc"},
		{tokenRateLimitPolicy, "testNS", "trlpA", "foo", "tokenlimit.foo__13adad8e"},
	} {
		if got := identifier(&policy{kind: c.kind, namespace: c.namespace, name: c.name}, c.limit); got != c.want {
			t.Errorf("identifier(%s %s/%s, %q) = %q, want %q", c.kind, c.namespace, c.name, c.limit, got, c.want)
		}
	}
	// Every character but a letter, a digit or _ becomes _, the dot too.
	for limit, prefix := range map[string]string{"my/limit-0": "limit.my_limit_0__", "my.limit": "limit.my_limit__", "día_1": "limit.día_1__"} {
		if got := identifier(&policy{kind: rateLimitPolicy, namespace: "testNS", name: "rlpA"}, limit); !strings.HasPrefix(got, prefix) || len(got) != len(prefix)+8 {
			t.Errorf("identifier(%q) = %q, want %s and a hash", limit, got, prefix)
		}
	}
}

// TestImportKuadrantLimits: what one policy's limits become.
func TestImportKuadrantLimits(t *testing.T) {
	runCases(t, []importCase{{
		name:     "a limit of one rate, on a route not given",
		policies: rlp("shop", "toystore", "HTTPRoute toystore", limits("global")),
		want:     []string{"shop/toystore global limit.global 5/60"},
	}, {
		name: "windows in whole seconds, rounded down; each rate an entry, in order",
		policies: rlp("shop", "p", "HTTPRoute r", `  limits:
    w:
      rates:
      - {limit: 1, window: 30s}
      - {limit: 2, window: 1m}
      - {limit: 3, window: 1h30m}
      - {limit: 4, window: 1500ms}
      - {limit: 5, window: 500ms}
      - {limit: -7, window: 24h}
`),
		want: []string{
			"shop/r w limit.w 1/30", "shop/r w limit.w 2/60", "shop/r w limit.w 3/5400",
			"shop/r w limit.w 4/1", "shop/r w limit.w 0/86400",
		},
		refused: []string{`policies.yaml:18:28: spec.limits.w.rates[4].window: "500ms" is under a second`},
	}, {
		name: "counters become variables, when predicates stay with the wasm-shim",
		policies: rlp("shop", "p", "HTTPRoute r", `  when:
  - predicate: request.host == 'shop.example.com'
  limits:
    per-user:
      counters:
      - expression: auth.identity.username
      - expression: "  request.headers['x-tier']  "
      when:
      - predicate: request.method == 'POST'
      rates: [{limit: 10, window: 10s}]
`),
		want: []string{`shop/r per-user limit.per_user 10/10 descriptors[0]["auth.identity.username"] descriptors[0]["request.headers['x-tier']"]`},
	}, {
		name: "a counter the operator would write as broken CEL",
		policies: rlp("shop", "p", "HTTPRoute r", `  limits:
    bad:
      counters: [{expression: 'request.headers["x"]'}]
      rates: [{limit: 1, window: 1s}]
    good:
      rates: [{limit: 1, window: 1s}]
`),
		want:    []string{"shop/r good limit.good 1/1"},
		refused: []string{`policies.yaml:13:31: spec.limits.bad.counters[0].expression: "request.headers[\"x\"]" holds a quote`},
	}, {
		name:     "a limit without rates is written as nothing",
		policies: rlp("shop", "p", "HTTPRoute r", "  limits:\n    none: {}\n    one:\n      rates: [{limit: 1, window: 1s}]\n"),
		want:     []string{"shop/r one limit.one 1/1"},
	}, {
		name:     "a TokenRateLimitPolicy's identifiers",
		policies: trlp("shop", "llm", "HTTPRoute chat", "  limits:\n    free:\n      rates: [{limit: 20000, window: 24h}]\n      counters: [{expression: auth.identity.userid}]\n"),
		want:     []string{`shop/chat free tokenlimit.free 20000/86400 descriptors[0]["auth.identity.userid"]`},
	}, {
		name:     "the namespace of manifests that name none",
		policies: strings.Replace(rlp("x", "p", "HTTPRoute r", limits("a")), "  namespace: x\n", "", 1),
		opts:     Options{Namespace: "team"},
		want:     []string{"team/r a limit.a 5/60"},
	}, {
		name:     "no namespace, none given",
		policies: strings.Replace(rlp("x", "p", "HTTPRoute r", limits("a")), "  namespace: x\n", "", 1),
		refused:  []string{"policies.yaml:4:3: metadata.namespace: is missing"},
	}})
}

// TestImportKuadrantSchema: what the API server refuses is refused whole,
// with every problem named.
func TestImportKuadrantSchema(t *testing.T) {
	apiServer := "the API server refuses this RateLimitPolicy"
	runCases(t, []importCase{{
		name:     "a day is not a unit",
		policies: trlp("shop", "llm", "HTTPRoute chat", "  limits:\n    free:\n      rates: [{limit: 1, window: 1d}]\n"),
		refused:  []string{`policies.yaml:13:34: spec.limits.free.rates[0].window: "1d" does not match the CRD's pattern`},
	}, {
		name:     "defaults and limits",
		policies: rlp("shop", "p", "HTTPRoute r", limits("a")+within("defaults", "atomic", limits("b"))),
		refused:  []string{"spec.defaults: and spec.limits (implicit defaults) are mutually exclusive; " + apiServer},
	}, {
		name:     "targetRefs",
		policies: rlp("shop", "p", "HTTPRoute r", limits("a")+"  targetRefs: []\n"),
		refused:  []string{"policies.yaml:16:3: spec.targetRefs: is not a field of RateLimitPolicy: it takes one spec.targetRef"},
	}, {
		name:     "several problems at once",
		policies: rlp("shop", "p", "Service r", "  limits:\n    a:\n      rates: [{limit: many, window: 1m, burst: 2}]\n  strategy: merge\n"),
		refused: []string{
			`spec.targetRef.kind: is "Service": a RateLimitPolicy targets one of HTTPRoute, GRPCRoute, Gateway`,
			"spec.limits.a.rates[0].limit: is an integer (int64), not \"many\"",
			"spec.limits.a.rates[0].burst: unknown field",
			"spec.strategy: unknown field",
		},
	}, {
		name:     "a TokenRateLimitPolicy on a GRPCRoute",
		policies: trlp("shop", "p", "GRPCRoute r", limits("a")),
		refused:  []string{`a TokenRateLimitPolicy targets one of HTTPRoute, Gateway`},
	}, {
		name:     "an unknown strategy, overrides without limits",
		policies: rlp("shop", "p", "Gateway g", "  overrides:\n    strategy: replace\n"),
		refused:  []string{"spec.overrides.limits: at least one limit is required", `spec.overrides.strategy: is "replace": atomic or merge`},
	}, {
		name:     "the wrong version",
		policies: strings.Replace(rlp("shop", "p", "HTTPRoute r", limits("a")), "kuadrant.io/v1", "kuadrant.io/v1beta2", 1),
		refused:  []string{`policies.yaml:1:13: apiVersion: RateLimitPolicy is served as kuadrant.io/v1, not "kuadrant.io/v1beta2"`},
	}, {
		name:     "a key twice",
		policies: rlp("shop", "p", "HTTPRoute r", limits("a", "a")),
		refused:  []string{`policies.yaml:16:5: duplicate key "a" (first at line 12)`},
	}, {
		name:     "a policy twice",
		policies: rlp("shop", "p", "HTTPRoute r", limits("a")) + rlp("shop", "p", "HTTPRoute r", limits("b")),
		want:     []string{"shop/r a limit.a 5/60"},
		refused:  []string{"policies.yaml:17:1: RateLimitPolicy shop/p is given again (first at policies.yaml:1)"},
	}, {
		name:     "other kinds, syntax errors",
		policies: "apiVersion: kuadrant.io/v1\nkind: AuthPolicy\n---\n- a list\n---\nkind: HTTPRoute\n---\n" + rlp("shop", "p", "HTTPRoute r", limits("a")) + "a: [\n",
		want:     []string{"shop/r a limit.a 5/60"},
		refused: []string{
			"policies.yaml:2:7: kind: AuthPolicy (kuadrant.io/v1) is not a rate limit policy",
			"policies.yaml:4:1: a manifest is a mapping",
			"policies.yaml:6:7: kind: HTTPRoute among the policies: give it as a route file (--route)",
			"policies.yaml:24:1: did not find expected node content",
		},
	}, {
		name:     "a policy being deleted",
		policies: strings.Replace(rlp("shop", "p", "HTTPRoute r", limits("a")), "  namespace: shop\n", "  namespace: shop\n  deletionTimestamp: \"2026-01-01T00:00:00Z\"\n", 1),
		refused:  []string{"policies.yaml:6:22: metadata.deletionTimestamp: RateLimitPolicy shop/p is being deleted"},
	}, {
		name:     "routes given twice, of another version, or not routes",
		policies: rlp("shop", "p", "HTTPRoute r", limits("a")),
		routes:   httpRoute("shop", "r", ext) + httpRoute("shop", "r", nil) + strings.Replace(httpRoute("shop", "s", ext), "/v1\n", "/v1alpha2\n", 1) + "kind: Service\n",
		want:     []string{"shop/r a limit.a 5/60"},
		refused: []string{
			"routes.yaml:11:1: HTTPRoute shop/r is given again (first at routes.yaml:1)",
			`routes.yaml:20:13: apiVersion: is "gateway.networking.k8s.io/v1alpha2"`,
			"routes.yaml:30:7: kind: Service: a route file holds HTTPRoute and GRPCRoute manifests",
		},
	}, {
		name:     "a List, and aliases",
		policies: "apiVersion: v1\nkind: List\nitems:\n- apiVersion: kuadrant.io/v1\n  kind: RateLimitPolicy\n  metadata: {name: p, namespace: shop}\n  spec:\n    targetRef: {group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}\n    limits:\n      a:\n        rates: &rates [{limit: 3, window: 3s}]\n      b:\n        rates: *rates\n",
		want:     []string{"shop/r a limit.a 3/3", "shop/r b limit.b 3/3"},
	}})
}
