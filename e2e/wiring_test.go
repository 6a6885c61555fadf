package e2e

import (
	"encoding/json"
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	ratelimitfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/admitdev/admit/envoyrls"
)

// TestEnvoyWiring decodes deploy/envoy/envoy.yaml into Envoy's bootstrap
// type, strictly (an unknown field or a typed_config Envoy does not know
// is an error), checks it with the API's own validation rules, and checks
// that its rate limit filter asks Admit's cluster for the catalog domain.
func TestEnvoyWiring(t *testing.T) {
	data, err := os.ReadFile("../deploy/envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, &b); err != nil {
		t.Fatalf("envoy.yaml is not an Envoy bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml breaks Envoy's validation rules: %v", err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := b.StaticResources.Listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	var rl ratelimitfilter.RateLimit
	if err := hcm.HttpFilters[0].GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatal(err)
	}
	if rl.Domain != envoyrls.DefaultCatalogDomain || rl.RateLimitService.GetGrpcService().GetEnvoyGrpc().GetClusterName() != "admit" {
		t.Fatalf("the rate limit filter asks %q of %q", rl.Domain, rl.RateLimitService.GetGrpcService().GetEnvoyGrpc().GetClusterName())
	}
	admit := b.StaticResources.Clusters[1]
	if port := admit.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().Address.GetSocketAddress().GetPortValue(); admit.Name != "admit" || port != 8081 {
		t.Fatalf("cluster %s on port %d", admit.Name, port)
	}
}

// TestIstioWiring decodes each patch of deploy/istio/envoyfilter.yaml
// into the Envoy type Istio applies it as, strictly.
func TestIstioWiring(t *testing.T) {
	data, err := os.ReadFile("../deploy/istio/envoyfilter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Kind string
		Spec struct {
			ConfigPatches []struct {
				ApplyTo string `yaml:"applyTo"`
				Patch   struct {
					Operation string
					Value     map[string]any
				}
			} `yaml:"configPatches"`
		}
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if f.Kind != "EnvoyFilter" || len(f.Spec.ConfigPatches) != 2 {
		t.Fatalf("%s with %d patches", f.Kind, len(f.Spec.ConfigPatches))
	}
	for i, p := range f.Spec.ConfigPatches {
		js, err := json.Marshal(p.Patch.Value)
		if err != nil {
			t.Fatal(err)
		}
		var m interface {
			proto.Message
			ValidateAll() error
		}
		switch p.ApplyTo {
		case "HTTP_FILTER":
			m = &hcmv3.HttpFilter{}
		case "CLUSTER":
			m = &clusterv3.Cluster{}
		default:
			t.Fatalf("patch %d applies to %s", i, p.ApplyTo)
		}
		if err := protojson.Unmarshal(js, m); err != nil {
			t.Fatalf("patch %d (%s) is not an Envoy %T: %v", i, p.ApplyTo, m, err)
		}
		if err := m.ValidateAll(); err != nil {
			t.Fatalf("patch %d breaks Envoy's validation rules: %v", i, err)
		}
		if f, ok := m.(*hcmv3.HttpFilter); ok {
			var rl ratelimitfilter.RateLimit
			if err := f.GetTypedConfig().UnmarshalTo(&rl); err != nil || rl.Domain != envoyrls.DefaultCatalogDomain {
				t.Fatalf("the filter's domain: %q (%v)", rl.Domain, err)
			}
		}
	}
}
