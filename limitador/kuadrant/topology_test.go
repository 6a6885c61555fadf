package kuadrant

import (
	"strings"
	"testing"
)

// TestImportKuadrantMerge: how a Gateway's policy and a route's merge, by
// the Gateway policy's defaults or overrides and strategy (the less
// specific policy's strategy decides), restated from the operator's merge
// strategies.
func TestImportKuadrantMerge(t *testing.T) {
	routes := httpRoute("shop", "toystore", ext) + httpRoute("shop", "bare", ext)
	route := rlp("shop", "toystore", "HTTPRoute toystore", limits("own", "shared"))
	gateway := func(spec string) string { return rlp("gateway-system", "gw", "Gateway external", spec) }
	runCases(t, []importCase{{
		name:     "implicit defaults: a route's own policy stands; a route without one takes the Gateway's",
		policies: gateway(limits("shared", "extra")) + route,
		routes:   routes,
		want: []string{
			"shop/bare extra limit.extra 5/60", "shop/bare shared limit.shared 5/60",
			"shop/toystore own limit.own 5/60", "shop/toystore shared limit.shared 5/60",
		},
	}, {
		name:     "defaults, merge: the Gateway's limits are added where the name is free",
		policies: gateway(within("defaults", "merge", limits("shared", "extra"))) + route,
		routes:   routes,
		want: []string{
			"shop/bare extra limit.extra 5/60", "shop/bare shared limit.shared 5/60",
			"shop/toystore extra limit.extra 5/60", "shop/toystore own limit.own 5/60", "shop/toystore shared limit.shared 5/60",
		},
	}, {
		name:     "overrides, atomic: the Gateway's limits replace the route's",
		policies: gateway(within("overrides", "atomic", limits("shared", "extra"))) + route,
		routes:   routes,
		want: []string{
			"shop/bare extra limit.extra 5/60", "shop/bare shared limit.shared 5/60",
			"shop/toystore extra limit.extra 5/60", "shop/toystore shared limit.shared 5/60",
		},
	}, {
		name:     "overrides, merge: the Gateway's limits replace those of the same name",
		policies: gateway(within("overrides", "merge", limits("shared", "extra"))) + route,
		routes:   routes,
		want: []string{
			"shop/bare extra limit.extra 5/60", "shop/bare shared limit.shared 5/60",
			"shop/toystore extra limit.extra 5/60", "shop/toystore own limit.own 5/60", "shop/toystore shared limit.shared 5/60",
		},
	}, {
		name:     "a Gateway policy and no route on it",
		policies: gateway(limits("extra")),
		routes:   httpRoute("shop", "elsewhere", []string{"gateway-system/internal"}),
		refused:  []string{"policies.yaml:8:5: spec.targetRef: no route given attaches to Gateway gateway-system/external"},
	}, {
		name:     "a parentRef's namespace is the route's unless it names one",
		policies: rlp("shop", "gw", "Gateway shared", limits("a")),
		routes:   httpRoute("shop", "r", []string{"shop/shared"}),
		want:     []string{"shop/r a limit.a 5/60"},
	}})
}

// TestImportKuadrantSections: policies on a route's rules and a Gateway's
// listeners.
func TestImportKuadrantSections(t *testing.T) {
	route := rlp("shop", "toystore", "HTTPRoute toystore", limits("all"))
	admin := rlp("shop", "admin", "HTTPRoute toystore#admin", limits("admins"))
	runCases(t, []importCase{{
		name:     "a rule's policy stands on its rule, the route's on the others",
		policies: route + admin,
		routes:   httpRoute("shop", "toystore", ext, "", "admin"),
		want:     []string{"shop/toystore admins limit.admins 5/60", "shop/toystore all limit.all 5/60"},
	}, {
		name:     "a route of one rule, which the rule's policy has",
		policies: route + admin,
		routes:   httpRoute("shop", "toystore", ext, "admin"),
		want:     []string{"shop/toystore admins limit.admins 5/60"},
	}, {
		name:     "without rules, a route has one, rule-1",
		policies: rlp("shop", "first", "HTTPRoute toystore#rule-1", limits("a")),
		routes:   httpRoute("shop", "toystore", ext),
		want:     []string{"shop/toystore a limit.a 5/60"},
	}, {
		name:     "a rule the route does not have",
		policies: route + admin,
		routes:   httpRoute("shop", "toystore", ext, "", ""),
		want:     []string{"shop/toystore all limit.all 5/60"},
		refused:  []string{`policies.yaml:24:5: spec.targetRef.sectionName: HTTPRoute shop/toystore (routes.yaml:1) has no rule "admin" (its rules: rule-1, rule-2)`},
	}, {
		name:     "a route on no Gateway",
		policies: route,
		routes:   httpRoute("shop", "toystore", nil),
		refused:  []string{"policies.yaml:8:5: spec.targetRef: HTTPRoute shop/toystore (routes.yaml:1) attaches to no Gateway"},
	}, {
		name:     "a route not given, a policy on one of its rules: whether it has others is open",
		policies: route + admin,
		want:     []string{"shop/toystore admins limit.admins 5/60"},
		refused:  []string{`limit "all" of RateLimitPolicy shop/toystore, for HTTPRoute shop/toystore: not converted, since whether the operator writes it turns on what the files do not say: HTTPRoute shop/toystore is not among the routes given, so whether it has rules besides admin is unknown`},
	}, {
		name:     "a listener's policy on a route that names the listener",
		policies: rlp("gateway-system", "https", "Gateway external#https", within("overrides", "atomic", limits("tls"))) + route,
		routes:   httpRoute("shop", "toystore", []string{"gateway-system/external#https"}) + httpRoute("shop", "plain", []string{"gateway-system/external#http"}),
		want:     []string{"shop/toystore tls limit.tls 5/60"},
	}, {
		name:     "a listener's overrides on a route on every listener: the Gateway's other listeners are open",
		policies: rlp("gateway-system", "https", "Gateway external#https", within("overrides", "atomic", limits("tls"))) + route,
		routes:   httpRoute("shop", "toystore", ext),
		want:     []string{"shop/toystore tls limit.tls 5/60"},
		refused:  []string{"HTTPRoute shop/toystore attaches to every listener of Gateway gateway-system/external, and no Gateway manifest is read to tell whether it has listeners besides https"},
	}, {
		name:     "a listener's defaults on a route on every listener: the route's own policy stands on all",
		policies: rlp("gateway-system", "https", "Gateway external#https", limits("tls")) + route,
		routes:   httpRoute("shop", "toystore", ext),
		want:     []string{"shop/toystore all limit.all 5/60"},
	}})
}

// TestImportKuadrantOpen: what the files leave open is refused, with the
// reason, and what holds whatever it is converted.
func TestImportKuadrantOpen(t *testing.T) {
	route := rlp("shop", "toystore", "HTTPRoute toystore", limits("own"))
	runCases(t, []importCase{{
		name:     "a route not given, a Gateway's overrides: neither is known",
		policies: rlp("gateway-system", "gw", "Gateway external", within("overrides", "atomic", limits("extra"))) + route,
		refused: []string{
			"policies.yaml:8:5: spec.targetRef: no route given attaches to Gateway gateway-system/external",
			`policies.yaml:14:7: limit "extra" of RateLimitPolicy gateway-system/gw, for HTTPRoute shop/toystore: not converted, since whether the operator writes it turns on what the files do not say: HTTPRoute shop/toystore is not among the routes given, so whether it attaches to Gateway gateway-system/external (and through which listener) is unknown`,
			`policies.yaml:30:5: limit "own" of RateLimitPolicy shop/toystore`,
		},
	}, {
		name:     "a route not given, a Gateway's atomic defaults: the route's own policy stands either way",
		policies: rlp("gateway-system", "gw", "Gateway external", limits("extra")) + route,
		want:     []string{"shop/toystore own limit.own 5/60"},
		refused:  []string{"no route given attaches to Gateway gateway-system/external"},
	}, {
		name:     "two policies on one route, no creationTimestamp to order them",
		policies: route + rlp("shop", "second", "HTTPRoute toystore", limits("other")),
		refused: []string{
			`limit "own" of RateLimitPolicy shop/toystore, for HTTPRoute shop/toystore: not converted, since whether the operator writes it turns on what the files do not say: the RateLimitPolicies shop/second, shop/toystore target HTTPRoute shop/toystore and no metadata.creationTimestamp tells the order they were created in`,
			`limit "other" of RateLimitPolicy shop/second`,
		},
	}, {
		name: "two policies on one route, the newer stands",
		policies: strings.Replace(route, "  namespace: shop\n", "  namespace: shop\n  creationTimestamp: \"2026-01-02T00:00:00Z\"\n", 1) +
			strings.Replace(rlp("shop", "second", "HTTPRoute toystore", limits("other")), "  namespace: shop\n", "  namespace: shop\n  creationTimestamp: \"2026-01-01T00:00:00Z\"\n", 1),
		want: []string{"shop/toystore own limit.own 5/60"},
	}, {
		name:     "a RateLimitPolicy and a TokenRateLimitPolicy on one route: both are written",
		policies: route + trlp("shop", "tokens", "HTTPRoute toystore", limits("own")),
		want:     []string{"shop/toystore own limit.own 5/60", "shop/toystore own tokenlimit.own 5/60"},
	}, {
		name:     "a TokenRateLimitPolicy on a Gateway reaches its HTTPRoutes, not its GRPCRoutes",
		policies: trlp("gateway-system", "tokens", "Gateway external", limits("t")) + rlp("gateway-system", "requests", "Gateway external", limits("r")),
		routes:   httpRoute("shop", "chat", ext) + strings.Replace(httpRoute("shop", "rpc", ext, ""), "kind: HTTPRoute", "kind: GRPCRoute", 1),
		want:     []string{"shop/chat r limit.r 5/60", "shop/chat t tokenlimit.t 5/60", "shop/rpc r limit.r 5/60"},
	}})
}

// TestImportKuadrantStable: the same manifests give the same bytes.
func TestImportKuadrantStable(t *testing.T) {
	policies := []File{{Name: "p.yaml", Data: []byte(rlp("gateway-system", "gw", "Gateway external", within("defaults", "merge", limits("a", "b", "c", "d"))) +
		rlp("shop", "r1", "HTTPRoute r1", limits("z", "y", "x")))}}
	routes := []File{{Name: "r.yaml", Data: []byte(httpRoute("shop", "r1", ext, "", "", "") + httpRoute("shop", "r2", ext) + httpRoute("other", "r3", ext))}}
	var first string
	for i := 0; i < 20; i++ {
		res, err := Import(policies, routes, Options{})
		if err != nil || len(res.Refused) > 0 {
			t.Fatal(err, res.Refused)
		}
		var b strings.Builder
		if err := Write(&b, res.Limits); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = b.String()
		} else if b.String() != first {
			t.Fatalf("run %d wrote\n%s\nthe first\n%s", i, b.String(), first)
		}
	}
	if strings.Count(first, "- namespace:") != 4+7+4 {
		t.Errorf("wrote\n%s", first)
	}
}

// TestImportKuadrantWrite: the limits file Limitador reads.
func TestImportKuadrantWrite(t *testing.T) {
	var b strings.Builder
	if err := Write(&b, nil); err != nil || b.String() != "[]\n" {
		t.Errorf("no limits: %q %v", b.String(), err)
	}
	b.Reset()
	err := Write(&b, []Limit{{Namespace: "shop/r", MaxValue: 5, Seconds: 60, Conditions: []string{`descriptors[0]["limit.a__0"] == "1"`}, Name: "yes", ID: "7"}})
	want := `- namespace: shop/r
  max_value: 5
  seconds: 60
  conditions:
    - descriptors[0]["limit.a__0"] == "1"
  variables: []
  name: "yes"
  id: "7"
`
	if err != nil || b.String() != want {
		t.Errorf("wrote\n%s\nwant\n%s", b.String(), want)
	}
}
