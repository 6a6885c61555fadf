package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	ratelimitfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/admitdev/admit/envoyrls"
)

// yamlToProto decodes a YAML value into m strictly: an unknown field, or a
// typed_config of a type Envoy does not know, is an error.
func yamlToProto(t *testing.T, v any, m proto.Message) error {
	t.Helper()
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return protojson.Unmarshal(js, m)
}

// envoyBootstrap decodes deploy/envoy/envoy.yaml into Envoy's bootstrap
// type, strictly, and checks it with the API's own validation rules.
func envoyBootstrap(t *testing.T) *bootstrapv3.Bootstrap {
	t.Helper()
	return bootstrapOf(t, "../deploy/envoy/envoy.yaml")
}

// bootstrapOf decodes the Envoy configuration file into Envoy's bootstrap
// type, strictly, and checks it with the API's own validation rules.
func bootstrapOf(t *testing.T, file string) *bootstrapv3.Bootstrap {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := yamlToProto(t, doc, &b); err != nil {
		t.Fatalf("envoy.yaml is not an Envoy bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml breaks Envoy's validation rules: %v", err)
	}
	return &b
}

// httpFilters returns the connection manager's HTTP filters by name, and
// their names in order.
func httpFilters(t *testing.T, hcm *hcmv3.HttpConnectionManager) (map[string]*hcmv3.HttpFilter, []string) {
	t.Helper()
	byName := map[string]*hcmv3.HttpFilter{}
	var order []string
	for _, f := range hcm.GetHttpFilters() {
		byName[f.GetName()] = f
		order = append(order, f.GetName())
	}
	return byName, order
}

// claimHeaders returns the headers a JWT filter sets from verified
// claims, failing the test for a requirement that lets unverified claims
// through (extract_only_without_validation) or a header set from two
// claims.
func claimHeaders(t *testing.T, jwt *jwtv3.JwtAuthentication) map[string]string {
	t.Helper()
	var check func(r *jwtv3.JwtRequirement)
	check = func(r *jwtv3.JwtRequirement) {
		if r.GetExtractOnlyWithoutValidation() != nil {
			t.Fatal("a JWT requirement takes claims without verifying the token")
		}
		for _, s := range r.GetRequiresAny().GetRequirements() {
			check(s)
		}
		for _, s := range r.GetRequiresAll().GetRequirements() {
			check(s)
		}
	}
	for _, rule := range jwt.GetRules() {
		check(rule.GetRequires())
	}
	for _, r := range jwt.GetRequirementMap() {
		check(r)
	}
	out := map[string]string{}
	for name, p := range jwt.GetProviders() {
		if p.GetIssuer() == "" {
			t.Fatalf("provider %s checks no issuer", name)
		}
		for _, c := range p.GetClaimToHeaders() {
			h := strings.ToLower(c.GetHeaderName())
			if prev, ok := out[h]; ok && prev != c.GetClaimName() {
				t.Fatalf("%s is set from claims %s and %s", h, prev, c.GetClaimName())
			}
			out[h] = c.GetClaimName()
		}
	}
	return out
}

// TestEnvoyExampleWiring: examples/envoy/envoy.yaml, the file an
// envoyproxy/ratelimit user has, is an Envoy bootstrap (unknown fields
// refused, Envoy's validation rules kept) whose rate limit filter asks
// the domain of examples/envoy/ratelimit-config, on Admit's gRPC port,
// and whose descriptors are ones that file decides.
func TestEnvoyExampleWiring(t *testing.T) {
	b := bootstrapOf(t, "../examples/envoy/envoy.yaml")
	var hcm hcmv3.HttpConnectionManager
	if err := b.StaticResources.Listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	filters, _ := httpFilters(t, &hcm)
	var rl ratelimitfilter.RateLimit
	if err := filters["envoy.filters.http.ratelimit"].GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatal(err)
	}
	cfg, err := envoyrls.LoadDir("../examples/envoy/ratelimit-config")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cfg.Domains(), rl.Domain) {
		t.Fatalf("the filter asks domain %q; the example files have %v", rl.Domain, cfg.Domains())
	}
	cluster := rl.RateLimitService.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	for _, c := range b.StaticResources.Clusters {
		if c.Name == cluster {
			if port := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); port != 8081 {
				t.Errorf("cluster %s on port %d, want Admit's gRPC port 8081", cluster, port)
			}
			if c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"] == nil {
				t.Errorf("cluster %s does not speak HTTP/2, which gRPC needs", cluster)
			}
		}
	}
	// Every descriptor key an action makes is one the file knows.
	keys := map[string]bool{}
	vh := hcm.GetRouteConfig().GetVirtualHosts()[0]
	var actions []*routev3.RateLimit_Action
	for _, r := range vh.GetRateLimits() {
		actions = append(actions, r.GetActions()...)
	}
	for _, route := range vh.GetRoutes() {
		for _, r := range route.GetRoute().GetRateLimits() {
			actions = append(actions, r.GetActions()...)
		}
	}
	for _, a := range actions {
		switch {
		case a.GetRemoteAddress() != nil:
			keys["remote_address"] = true
		case a.GetGenericKey() != nil:
			keys[cmp.Or(a.GetGenericKey().GetDescriptorKey(), "generic_key")] = true
		case a.GetRequestHeaders() != nil:
			keys[a.GetRequestHeaders().GetDescriptorKey()] = true
		default:
			t.Errorf("an action the test does not read: %v", a)
		}
	}
	data, err := os.ReadFile("../examples/envoy/ratelimit-config/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys {
		if !strings.Contains(string(data), "key: "+k+"\n") {
			t.Errorf("descriptor key %s is in no descriptor of the example file", k)
		}
	}
}

// TestEnvoyWiring decodes deploy/envoy/envoy.yaml into Envoy's bootstrap
// type, strictly (an unknown field or a typed_config Envoy does not know
// is an error), checks it with the API's own validation rules, and checks
// that its rate limit filter asks Admit's cluster for the catalog domain,
// after the filter that verifies the platform's tokens, and that the keys
// of those tokens are fetched only from the identity provider itself.
func TestEnvoyWiring(t *testing.T) {
	b := envoyBootstrap(t)
	var hcm hcmv3.HttpConnectionManager
	if err := b.StaticResources.Listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	filters, order := httpFilters(t, &hcm)
	if want := []string{"envoy.filters.http.jwt_authn", "envoy.filters.http.ratelimit", "envoy.filters.http.router"}; strings.Join(order, " ") != strings.Join(want, " ") {
		t.Fatalf("HTTP filters %v, want %v", order, want)
	}
	var rl ratelimitfilter.RateLimit
	if err := filters["envoy.filters.http.ratelimit"].GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatal(err)
	}
	if rl.Domain != envoyrls.DefaultCatalogDomain || rl.RateLimitService.GetGrpcService().GetEnvoyGrpc().GetClusterName() != "admit" {
		t.Fatalf("the rate limit filter asks %q of %q", rl.Domain, rl.RateLimitService.GetGrpcService().GetEnvoyGrpc().GetClusterName())
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.StaticResources.Clusters {
		clusters[c.Name] = c
	}
	admit := clusters["admit"]
	if port := admit.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); port != 8081 {
		t.Fatalf("cluster admit on port %d", port)
	}
	var jwt jwtv3.JwtAuthentication
	if err := filters["envoy.filters.http.jwt_authn"].GetTypedConfig().UnmarshalTo(&jwt); err != nil {
		t.Fatal(err)
	}
	for name, p := range jwt.GetProviders() {
		uri := p.GetRemoteJwks().GetHttpUri()
		auth := clusters[uri.GetCluster()]
		if auth == nil || !strings.HasPrefix(uri.GetUri(), "https://") {
			t.Fatalf("provider %s fetches its keys from %q through cluster %q", name, uri.GetUri(), uri.GetCluster())
		}
		var tlsCtx tlsv3.UpstreamTlsContext
		if err := auth.GetTransportSocket().GetTypedConfig().UnmarshalTo(&tlsCtx); err != nil {
			t.Fatalf("cluster %s: %v", auth.Name, err)
		}
		v := tlsCtx.GetCommonTlsContext().GetValidationContext()
		if v.GetTrustedCa() == nil || len(v.GetMatchTypedSubjectAltNames()) == 0 {
			t.Fatalf("cluster %s does not check the identity provider's certificate: anyone on the path could serve keys that sign tokens", auth.Name)
		}
	}
}

// envoyEdge reads from deploy/envoy/envoy.yaml what happens to a request
// before its rate limit filter, and returns it with the routes.
func envoyEdge(t *testing.T) (edge, []*routev3.Route) {
	t.Helper()
	b := envoyBootstrap(t)
	var hcm hcmv3.HttpConnectionManager
	if err := b.StaticResources.Listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	e := readHCM(t, &hcm)
	_, order := httpFilters(t, &hcm)
	for _, f := range hcm.GetHttpFilters() {
		if f.GetName() == "envoy.filters.http.ratelimit" {
			break
		}
		switch f.GetName() {
		case "envoy.filters.http.jwt_authn":
			var jwt jwtv3.JwtAuthentication
			if err := f.GetTypedConfig().UnmarshalTo(&jwt); err != nil {
				t.Fatal(err)
			}
			e.claimToHeaders = claimHeaders(t, &jwt)
		default:
			t.Fatalf("filter %s before the rate limit filter (%v): not modelled", f.GetName(), order)
		}
	}
	var routes []*routev3.Route
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		if len(vh.GetRateLimits()) > 0 || vh.GetRequestHeadersToAdd() != nil {
			t.Fatalf("virtual host %s: rate limits or headers of its own: not modelled", vh.Name)
		}
		routes = append(routes, vh.GetRoutes()...)
	}
	return e, routes
}

// TestEnvoyDescriptorsFromThePlatform works out the descriptors
// deploy/envoy/envoy.yaml makes Envoy send for requests whose clients add
// their own x-tenant-id, x-user-id (any spelling) and X-Forwarded-For, and
// checks that only the platform's token and the connection choose them.
// Until 2026-11-26 the file sent the client's own x-tenant-id and
// x-user-id: a new x-user-id at every request was a fresh bucket.
//
// Then it sends what a hostile client's requests make to a running admit
// serve: acme's alice, naming victim's tenant and a new user at every
// request from new X-Forwarded-For addresses, gets her own 3 requests and
// leaves the victim's tenant bucket whole; a client without a token gets
// its address's 4.
func TestEnvoyDescriptorsFromThePlatform(t *testing.T) {
	e, routes := envoyEdge(t)
	if !e.useRemoteAddress {
		t.Fatal("use_remote_address is off: the client's X-Forwarded-For names the remote_address")
	}
	for _, r := range routes {
		var action string
		for _, rl := range r.GetRoute().GetRateLimits() {
			for _, a := range rl.GetActions() {
				if g := a.GetGenericKey(); g != nil && g.GetDescriptorKey() == envoyrls.EntryAction {
					action = ",action=" + g.GetDescriptorValue()
				}
			}
		}
		t.Run(r.GetMatch().GetPrefix(), func(t *testing.T) {
			checkPlatformKeys(t, e, r.GetRoute().GetRateLimits(), true, func(claims map[string]string, peer string) string {
				s := "remote_address=" + peer
				if claims != nil {
					s += ",tenant=" + claims["tenant"] + ",user=" + claims["sub"]
				}
				return s + action
			})
		})
	}

	// Through admit serve, with the descriptors of the catch-all route.
	limits := routes[len(routes)-1].GetRoute().GetRateLimits()
	cfg := filepath.Join(t.TempDir(), "admit.yaml")
	if err := os.WriteFile(cfg, []byte(`version: 1
global:
  - {name: per-address, scope: ip, algorithm: fixed_window, limit: 4, window: 1h}
tiers:
  t:
    rules:
      - {name: per-user, scope: user, algorithm: fixed_window, limit: 3, window: 1h}
      - {name: per-tenant, scope: tenant, algorithm: fixed_window, limit: 5, window: 1h}
tenants:
  acme: {tier: t}
  victim: {tier: t}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	admit := startAdmit(t, "--config", cfg)
	conn, err := grpc.NewClient(admit.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	admitted := func(who string, n int, req func(i int) edgeRequest) int {
		t.Helper()
		ok := 0
		for i := range n {
			ds, refused := e.descriptors(t, limits, req(i))
			if refused {
				t.Fatalf("%s's request %d refused by Envoy", who, i)
			}
			r, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: envoyrls.DefaultCatalogDomain, Descriptors: ds, HitsAddend: 1})
			if err != nil {
				t.Fatalf("%s: ShouldRateLimit(%s): %v", who, describe(ds), err)
			}
			if r.OverallCode == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}
	alice := map[string]string{"sub": "alice", "tenant": "acme"}
	if got := admitted("alice", 10, func(i int) edgeRequest {
		return edgeRequest{peer: "192.0.2.1", headers: spoofs(i), claims: alice}
	}); got != 3 {
		t.Fatalf("alice, naming another tenant and a new user at each request: %d of 10 admitted, want her own 3", got)
	}
	bob := map[string]string{"sub": "bob", "tenant": "victim"}
	if got := admitted("bob", 3, func(int) edgeRequest { return edgeRequest{peer: "192.0.2.2", claims: bob} }); got != 3 {
		t.Fatalf("victim's bob after alice's requests: %d of 3 admitted", got)
	}
	carol := map[string]string{"sub": "carol", "tenant": "victim"}
	if got := admitted("carol", 3, func(int) edgeRequest { return edgeRequest{peer: "192.0.2.4", claims: carol} }); got != 2 {
		t.Fatalf("victim's carol after bob: %d of 3 admitted, want the 2 left of victim's 5", got)
	}
	if got := admitted("a client without a token", 10, func(i int) edgeRequest {
		return edgeRequest{peer: "192.0.2.3", headers: spoofs(i)}
	}); got != 4 {
		t.Fatalf("a client without a token, naming a tenant, users and addresses: %d of 10 admitted, want its address's 4", got)
	}
}

// istioDocs decodes deploy/istio/envoyfilter.yaml: the EnvoyFilter and
// the RequestAuthentication.
func istioDocs(t *testing.T) (ef istioEnvoyFilter, ra istioRequestAuthentication) {
	t.Helper()
	data, err := os.ReadFile("../deploy/istio/envoyfilter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var kinds []string
	for {
		var node yaml.Node
		if err := dec.Decode(&node); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		var head struct{ Kind string }
		if err := node.Decode(&head); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, head.Kind)
		switch head.Kind {
		case "EnvoyFilter":
			err = node.Decode(&ef)
		case "RequestAuthentication":
			err = node.Decode(&ra)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(kinds, ",") != "EnvoyFilter,RequestAuthentication" {
		t.Fatalf("envoyfilter.yaml holds %v", kinds)
	}
	return ef, ra
}

type istioEnvoyFilter struct {
	Kind string
	Spec struct {
		WorkloadSelector struct {
			Labels map[string]string
		} `yaml:"workloadSelector"`
		ConfigPatches []struct {
			ApplyTo string `yaml:"applyTo"`
			Match   struct {
				Context string
			}
			Patch struct {
				Operation string
				Value     map[string]any
			}
		} `yaml:"configPatches"`
	}
}

type istioRequestAuthentication struct {
	APIVersion string `yaml:"apiVersion"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		}
		JWTRules []struct {
			Issuer               string
			JWKSURI              string `yaml:"jwksUri"`
			OutputClaimToHeaders []struct {
				Header string
				Claim  string
			} `yaml:"outputClaimToHeaders"`
		} `yaml:"jwtRules"`
	}
}

// istioGateway is what deploy/istio/envoyfilter.yaml makes of an Istio
// ingress gateway: the connection manager's settings it merges, its rate
// limit filter and cluster, and the virtual hosts' rate limits.
type istioGateway struct {
	edge    edge
	filter  *ratelimitfilter.RateLimit
	cluster *clusterv3.Cluster
	limits  []*routev3.RateLimit
}

// readIstio decodes each patch of deploy/istio/envoyfilter.yaml into the
// Envoy type Istio applies it as, strictly, with the API's validation
// rules where the patch is whole (a merge is part of an object), and the
// RequestAuthentication's claims as the headers Istio's JWT filter sets.
func readIstio(t *testing.T) istioGateway {
	t.Helper()
	ef, ra := istioDocs(t)
	var g istioGateway
	var applied []string
	for i, p := range ef.Spec.ConfigPatches {
		applied = append(applied, p.ApplyTo+" "+p.Patch.Operation)
		if p.Match.Context != "GATEWAY" {
			t.Fatalf("patch %d applies to %q, not the gateway", i, p.Match.Context)
		}
		var m interface {
			proto.Message
			ValidateAll() error
		}
		switch p.ApplyTo {
		case "NETWORK_FILTER":
			m = &listenerv3.Filter{}
		case "HTTP_FILTER":
			m = &hcmv3.HttpFilter{}
		case "CLUSTER":
			m = &clusterv3.Cluster{}
		case "VIRTUAL_HOST":
			m = &routev3.VirtualHost{}
		default:
			t.Fatalf("patch %d applies to %s", i, p.ApplyTo)
		}
		if err := yamlToProto(t, p.Patch.Value, m); err != nil {
			t.Fatalf("patch %d (%s) is not an Envoy %T: %v", i, p.ApplyTo, m, err)
		}
		switch m := m.(type) {
		case *listenerv3.Filter:
			var hcm hcmv3.HttpConnectionManager
			if err := m.GetTypedConfig().UnmarshalTo(&hcm); err != nil || m.GetName() != "envoy.filters.network.http_connection_manager" {
				t.Fatalf("patch %d merges %s: %v", i, m.GetName(), err)
			}
			// Whole once merged into the gateway's own.
			hcm.StatPrefix, hcm.RouteSpecifier = "gateway", &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: "gateway"}}
			if err := hcm.ValidateAll(); err != nil {
				t.Fatalf("patch %d breaks Envoy's validation rules: %v", i, err)
			}
			g.edge = readHCM(t, &hcm)
			continue
		case *routev3.VirtualHost:
			g.limits = m.GetRateLimits()
			m.Name, m.Domains = "gateway", []string{"*"}
		case *hcmv3.HttpFilter:
			g.filter = &ratelimitfilter.RateLimit{}
			if err := m.GetTypedConfig().UnmarshalTo(g.filter); err != nil || g.filter.Domain != envoyrls.DefaultCatalogDomain {
				t.Fatalf("the filter's domain: %q (%v)", g.filter.Domain, err)
			}
		case *clusterv3.Cluster:
			g.cluster = m
		}
		if err := m.ValidateAll(); err != nil {
			t.Fatalf("patch %d breaks Envoy's validation rules: %v", i, err)
		}
	}
	if want := "NETWORK_FILTER MERGE,HTTP_FILTER INSERT_BEFORE,CLUSTER ADD,VIRTUAL_HOST MERGE"; strings.Join(applied, ",") != want {
		t.Fatalf("patches %v, want %s", applied, want)
	}
	if fmt.Sprint(ra.Spec.Selector.MatchLabels) != fmt.Sprint(ef.Spec.WorkloadSelector.Labels) {
		t.Fatalf("the RequestAuthentication selects %v, the EnvoyFilter %v", ra.Spec.Selector.MatchLabels, ef.Spec.WorkloadSelector.Labels)
	}
	for _, r := range ra.Spec.JWTRules {
		if r.Issuer == "" || !strings.HasPrefix(r.JWKSURI, "https://") {
			t.Fatalf("JWT rule of issuer %q, keys from %q", r.Issuer, r.JWKSURI)
		}
		for _, c := range r.OutputClaimToHeaders {
			g.edge.claimToHeaders[strings.ToLower(c.Header)] = c.Claim
		}
	}
	return g
}

// TestIstioWiring decodes each patch of deploy/istio/envoyfilter.yaml
// into the Envoy type Istio applies it as, strictly, and checks that the
// rate limit filter asks Admit through the cluster the file adds.
func TestIstioWiring(t *testing.T) {
	g := readIstio(t)
	if name := g.filter.RateLimitService.GetGrpcService().GetEnvoyGrpc().GetClusterName(); name != g.cluster.GetName() {
		t.Fatalf("the rate limit filter asks cluster %q; the file adds %q", name, g.cluster.GetName())
	}
	if port := g.cluster.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); port != 8081 {
		t.Fatalf("cluster %s on port %d", g.cluster.GetName(), port)
	}
}

// TestIstioDescriptorsFromThePlatform works out the descriptors
// deploy/istio/envoyfilter.yaml makes an Istio ingress gateway send for
// requests whose clients add their own x-tenant-id, x-user-id and
// X-Forwarded-For, and checks that only the platform's token (the
// RequestAuthentication's claims) and the connection choose them.
func TestIstioDescriptorsFromThePlatform(t *testing.T) {
	g := readIstio(t)
	if !g.edge.useRemoteAddress {
		t.Fatal("use_remote_address is off: the client's X-Forwarded-For names the remote_address")
	}
	checkPlatformKeys(t, g.edge, g.limits, true, func(claims map[string]string, peer string) string {
		s := "remote_address=" + peer
		if claims != nil {
			s += ",tenant=" + claims["tenant"] + ",user=" + claims["sub"]
		}
		return s
	})
}
