package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	ratelimitfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"github.com/admitdev/admit/redistest"
)

// egctlVersion is the Envoy Gateway whose translator the test asks what
// Envoy sends for deploy/envoy-gateway's policy.
const egctlVersion = "v1.9.1"

// routeRateLimits is what egctl makes of the example policy: the rate
// limit domain of the route and, per rule, the actions that build the
// descriptor Envoy sends.
type routeRateLimits struct {
	Domain     string `json:"domain"`
	RateLimits []struct {
		Actions []struct {
			GenericKey *struct {
				DescriptorKey   string `json:"descriptorKey"`
				DescriptorValue string `json:"descriptorValue"`
			} `json:"genericKey"`
			RequestHeaders *struct {
				DescriptorKey string `json:"descriptorKey"`
				HeaderName    string `json:"headerName"`
			} `json:"requestHeaders"`
		} `json:"actions"`
	} `json:"rateLimits"`
}

// egGateway is what Envoy Gateway's translator makes of deploy/envoy-gateway's
// policies for the gateway's listener and the route.
type egGateway struct {
	// route is the route's rate limit configuration, as Envoy gets it.
	route routeRateLimits
	// limits are the same rate limits in Envoy's types.
	limits []*routev3.RateLimit
	// edge is what the listener does to a request before its rate limit
	// filter reads it.
	edge edge
	// jwtRequired says the route's requests need a token that verifies.
	jwtRequired bool
}

// typedObjects returns every object of the decoded JSON doc whose @type
// is typeURL, wherever it is.
func typedObjects(doc any, typeURL string) []map[string]any {
	var found []map[string]any
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["@type"] == typeURL {
				found = append(found, v)
			}
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(doc)
	return found
}

// unmarshalAny decodes an object of the translator's JSON output, with its
// @type, into m, strictly.
func unmarshalAny(t *testing.T, obj map[string]any, m proto.Message) {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var a anypb.Any
	if err := protojson.Unmarshal(b, &a); err != nil {
		t.Fatalf("%s: %v", obj["@type"], err)
	}
	if err := a.UnmarshalTo(m); err != nil {
		t.Fatal(err)
	}
}

// translatePolicy runs Envoy Gateway's own translator (egctl x translate,
// built from the module proxy) over a Gateway, an HTTPRoute and
// deploy/envoy-gateway's policies (backendtrafficpolicy.yaml and
// identity.yaml), and returns what it made of them for the gateway's
// listener and the route.
func translatePolicy(t *testing.T) egGateway {
	t.Helper()
	var policies []string
	for _, f := range []string{"backendtrafficpolicy.yaml", "identity.yaml"} {
		b, err := os.ReadFile("../deploy/envoy-gateway/" + f)
		if err != nil {
			t.Fatal(err)
		}
		policies = append(policies, string(b))
	}
	in := filepath.Join(t.TempDir(), "in.yaml")
	if err := os.WriteFile(in, []byte(`apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: eg}
spec: {controllerName: gateway.envoyproxy.io/gatewayclass-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: eg, namespace: default}
spec:
  gatewayClassName: eg
  listeners: [{name: http, protocol: HTTP, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: backend, namespace: default}
spec:
  parentRefs: [{name: eg}]
  rules: [{backendRefs: [{name: backend, port: 3000}]}]
---
`+strings.Join(policies, "\n---\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "github.com/envoyproxy/gateway/cmd/egctl@"+egctlVersion,
		"x", "translate", "--from", "gateway-api", "--to", "xds", "-t", "all", "--add-missing-resources", "-f", in, "-n", "default", "-o", "json")
	cmd.Dir = t.TempDir() // outside the e2e module: egctl's own go.mod decides
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("egctl x translate: %v\n%s", err, stderr)
	}
	var doc any
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("egctl output: %v", err)
	}
	var g egGateway

	// The per-route rate limit filter configuration, wherever it is.
	perRoute := typedObjects(doc, "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute")
	if len(perRoute) != 1 {
		t.Fatalf("egctl made %d per-route rate limit configurations of the policy, want 1:\n%s", len(perRoute), out)
	}
	b, _ := json.Marshal(perRoute[0])
	if err := json.Unmarshal(b, &g.route); err != nil {
		t.Fatal(err)
	}
	if len(g.route.RateLimits) != 2 {
		t.Fatalf("egctl made %d rate limits of the policy's rules, want 2:\n%s", len(g.route.RateLimits), out)
	}
	var prl ratelimitfilter.RateLimitPerRoute
	unmarshalAny(t, perRoute[0], &prl)
	g.limits = prl.GetRateLimits()

	// The gateway's listener: the connection manager whose filters
	// include the rate limit filter.
	var hcm *hcmv3.HttpConnectionManager
	for _, obj := range typedObjects(doc, "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager") {
		if len(typedObjects(obj, "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit")) == 0 {
			continue // Envoy Gateway's own listeners (health, stats)
		}
		if hcm != nil {
			t.Fatal("two listeners rate limit")
		}
		hcm = &hcmv3.HttpConnectionManager{}
		unmarshalAny(t, obj, hcm)
	}
	if hcm == nil {
		t.Fatalf("no listener rate limits:\n%s", out)
	}
	g.edge = readHCM(t, hcm)
	var jwt *jwtv3.JwtAuthentication
	for _, f := range hcm.GetHttpFilters() {
		if f.GetName() == "envoy.filters.http.ratelimit" {
			break
		}
		if f.GetName() != "envoy.filters.http.jwt_authn" {
			t.Fatalf("filter %s before the rate limit filter: not modelled", f.GetName())
		}
		jwt = &jwtv3.JwtAuthentication{}
		if err := f.GetTypedConfig().UnmarshalTo(jwt); err != nil {
			t.Fatal(err)
		}
		g.edge.claimToHeaders = claimHeaders(t, jwt)
	}
	// The route's requirement: a token of a provider, missing or not.
	for _, obj := range typedObjects(doc, "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.PerRouteConfig") {
		var pr jwtv3.PerRouteConfig
		unmarshalAny(t, obj, &pr)
		req := jwt.GetRequirementMap()[pr.GetRequirementName()]
		g.jwtRequired = req.GetProviderName() != "" && jwt.GetProviders()[req.GetProviderName()] != nil
	}
	return g
}

// rateLimitConfig builds the RateLimitConfig Envoy Gateway serves for the
// route, as its translator builds it from the same rules: under the
// route's descriptor, one chain per rule, the rule's limit on its last
// descriptor (a distinct header matches any value).
func rateLimitConfig(t *testing.T, r routeRateLimits, limits []uint32) *rlsconfv3.RateLimitConfig {
	t.Helper()
	cfg := &rlsconfv3.RateLimitConfig{Name: r.Domain, Domain: r.Domain}
	var route *rlsconfv3.RateLimitDescriptor
	for i, rl := range r.RateLimits {
		first := rl.Actions[0].GenericKey
		if route == nil {
			route = &rlsconfv3.RateLimitDescriptor{Key: first.DescriptorKey, Value: first.DescriptorValue}
			cfg.Descriptors = append(cfg.Descriptors, route)
		} else if first.DescriptorKey != route.Key {
			t.Fatalf("rule %d under %q, not the route's %q", i, first.DescriptorKey, route.Key)
		}
		parent := route
		for _, a := range rl.Actions[1:] {
			d := &rlsconfv3.RateLimitDescriptor{}
			switch {
			case a.GenericKey != nil:
				d.Key, d.Value = a.GenericKey.DescriptorKey, a.GenericKey.DescriptorValue
			case a.RequestHeaders != nil:
				d.Key = a.RequestHeaders.DescriptorKey
			}
			parent.Descriptors = append(parent.Descriptors, d)
			parent = d
		}
		parent.RateLimit = &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: limits[i]}
	}
	return cfg
}

// descriptors are what Envoy sends for a request with headers: one
// descriptor per rule whose actions all apply.
func (r routeRateLimits) descriptors(headers map[string]string) []*rlext.RateLimitDescriptor {
	var out []*rlext.RateLimitDescriptor
	for _, rl := range r.RateLimits {
		d := &rlext.RateLimitDescriptor{}
		for _, a := range rl.Actions {
			switch {
			case a.GenericKey != nil:
				d.Entries = append(d.Entries, &rlext.RateLimitDescriptor_Entry{Key: a.GenericKey.DescriptorKey, Value: a.GenericKey.DescriptorValue})
			case a.RequestHeaders != nil:
				v, ok := headers[a.RequestHeaders.HeaderName]
				if !ok {
					d = nil
				} else {
					d.Entries = append(d.Entries, &rlext.RateLimitDescriptor_Entry{Key: a.RequestHeaders.DescriptorKey, Value: v})
				}
			}
			if d == nil {
				break
			}
		}
		if d != nil {
			out = append(out, d)
		}
	}
	return out
}

// pki is a CA and the certificates Envoy Gateway's certgen makes with it:
// one for its xDS server (envoy-gateway), one its rate limit service
// serves gRPC and dials xDS with (envoy-rate-limit), one for Envoy.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caFile string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "envoy-gateway"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &pki{dir: t.TempDir(), ca: ca, caKey: key}
	p.caFile = p.write(t, "ca.crt", "CERTIFICATE", der)
	return p
}

func (p *pki) write(t *testing.T, name, kind string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue makes a certificate for name (and 127.0.0.1), for servers and
// clients, and returns its files.
func (p *pki) issue(t *testing.T, name string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, name+".crt", "CERTIFICATE", der), p.write(t, name+".key", "EC PRIVATE KEY", kd)
}

func (p *pki) tls(t *testing.T, name string) *tls.Config {
	t.Helper()
	cert, key := p.issue(t, name)
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
}

// TestEnvoyGateway runs Admit where Envoy Gateway runs envoyproxy/ratelimit:
// the binary started as /bin/ratelimit with the environment Envoy Gateway
// v1.9 gives its rate limit Deployment (names and values read in its
// internal/infrastructure/kubernetes/ratelimit; ports, paths and addresses
// made local), its configuration from an xDS server built as Envoy
// Gateway's (go-control-plane's ADS over a snapshot cache, mutual TLS, node
// envoy-ratelimit), and asked over mutual TLS with the descriptors Envoy
// Gateway's translator makes Envoy send for deploy/envoy-gateway's
// policies: a user's verified token, and a new x-user-id of the client's
// own at every request, which changes nothing (3 pass, the 4th is over).
func TestEnvoyGateway(t *testing.T) {
	eg := translatePolicy(t)
	route := eg.route
	if !strings.HasPrefix(route.Domain, "default/eg/") {
		t.Fatalf("domain %q", route.Domain)
	}
	p := newPKI(t)

	// The xDS server, with no configuration yet.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	snapshots := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	acks := make(chan *discoveryv3.DiscoveryRequest, 100)
	ctx, cancel := context.WithCancel(context.Background())
	xds := grpc.NewServer(grpc.Creds(credentials.NewTLS(p.tls(t, "envoy-gateway"))))
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(xds, serverv3.NewServer(ctx, snapshots, serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
			if r.ResponseNonce != "" {
				acks <- r
			}
			return nil
		},
	}))
	go xds.Serve(ln)
	t.Cleanup(func() { cancel(); xds.Stop() })
	setConfig := func(version string, limits ...uint32) {
		t.Helper()
		snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{
			resourcev3.RateLimitConfigType: {rateLimitConfig(t, route, limits)},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := snapshots.SetSnapshot(context.Background(), "envoy-ratelimit", snap); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-acks:
			if r.VersionInfo != version || r.ErrorDetail != nil {
				t.Fatalf("Admit answered version %s with %v", version, r)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("Admit did not acknowledge version %s", version)
		}
	}

	redis := redistest.Start(t)
	cert, key := p.issue(t, "envoy-rate-limit")
	metrics, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := metrics.Addr().String()
	metrics.Close()
	link := filepath.Join(t.TempDir(), "ratelimit")
	if err := os.Symlink(admitBinary(t), link); err != nil {
		t.Fatal(err)
	}
	admit := runAdmit(t, link, []string{
		"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=info", "USE_STATSD=false",
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + ln.Addr().String(), "CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit",
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + cert, "GRPC_SERVER_TLS_KEY=" + key, "GRPC_SERVER_TLS_CA_CERT=" + p.caFile,
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + cert, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + key,
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + p.caFile,
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true", "ADMIT_ADMIN_TOKEN=eg-admin", // /readyz says why a version was refused to the admin
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redis.Addr,
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=" + metricsAddr, "PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml",
		// Local: Envoy Gateway leaves these at 0.0.0.0:8080 and :8081.
		"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0",
		"ADMIT_DATA_DIR=" + filepath.Join(t.TempDir(), "data"),
	})

	// Envoy Gateway's probes ask /healthcheck on the HTTP port.
	resp, err := http.Get(admit.url + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "OK" {
		t.Fatalf("/healthcheck: %d %q", resp.StatusCode, body)
	}

	setConfig("1", 3, 100)
	// The policy's limits are per minute, in windows aligned to the Unix
	// epoch: the counts below hold only if every request falls in one
	// window, and a run that crossed a minute's end would find alice's
	// count reset. Start with at least 30 s of a minute left; the
	// requests take a few seconds, under -race on a loaded machine.
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 30*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
	envoy := p.tls(t, "envoy")
	envoy.ClientAuth, envoy.ClientCAs = 0, nil
	conn, err := grpc.NewClient(admit.grpc, grpc.WithTransportCredentials(credentials.NewTLS(envoy)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	// Each request comes with the user's verified token and a new
	// x-user-id of the client's own (Envoy Gateway refuses the underscore
	// spellings outright).
	asked := 0
	ask := func(user string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		asked++
		var hs [][2]string
		for _, h := range spoofs(asked) {
			if !strings.Contains(h[0], "_") {
				hs = append(hs, h)
			}
		}
		ds, refused := eg.edge.descriptors(t, eg.limits, edgeRequest{peer: "192.0.2.1", headers: hs, claims: map[string]string{"sub": user, "tenant": "acme"}})
		if refused {
			t.Fatalf("%s's request refused by the gateway", user)
		}
		r, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: route.Domain, Descriptors: ds, HitsAddend: 1})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		if len(ds) != 2 || len(r.Statuses) != 2 {
			t.Fatalf("%d descriptors, %d statuses", len(ds), len(r.Statuses))
		}
		return r.OverallCode
	}
	for i := 1; i <= 4; i++ {
		want := rlsv3.RateLimitResponse_OK
		if i == 4 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if got := ask("alice"); got != want {
			t.Fatalf("alice's request %d: %v, want %v", i, got, want)
		}
	}
	if got := ask("bob"); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("bob: %v", got)
	}

	// The policy is edited (3 → 5 a minute): Envoy Gateway serves a new
	// version, Admit applies it and keeps the counts. admit ratelimit counts
	// as envoyproxy/ratelimit does, the refused 4th request included: 4 of
	// 5, so one more passes.
	setConfig("2", 5, 100)
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := ask("alice"); got != want {
			t.Fatalf("alice after the edit, request %d: %v, want %v", i+1, got, want)
		}
	}

	// A client without a certificate of the CA is refused.
	stranger, err := grpc.NewClient(admit.grpc, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: envoy.RootCAs, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	if _, err := rlsv3.NewRateLimitServiceClient(stranger).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: route.Domain, Descriptors: route.descriptors(nil)}); err == nil {
		t.Fatal("a client without a certificate was answered")
	}

	// Prometheus scrapes PROMETHEUS_ADDR.
	resp, err = http.Get(fmt.Sprintf("http://%s/metrics", metricsAddr))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `admit_requests_total{endpoint="grpc",result="allowed"} 5`) {
		t.Fatalf("metrics on PROMETHEUS_ADDR: %d\n%.400s", resp.StatusCode, body)
	}

	// The rules of a version Admit cannot hold are refused, named in the
	// NACK, and the running ones kept.
	bad, err := cachev3.NewSnapshot("3", map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: {
		&rlsconfv3.RateLimitConfig{Name: "broken", Domain: "broken", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{RequestsPerUnit: 1}}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := snapshots.SetSnapshot(context.Background(), "envoy-ratelimit", bad); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-acks:
		if r.VersionInfo != "2" || !strings.Contains(r.ErrorDetail.GetMessage(), "xds:broken") {
			t.Fatalf("a bad version's answer: %v", r)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no answer to a bad version")
	}
	if got := ask("alice"); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("alice under the kept configuration: %v", got)
	}
	req, _ := http.NewRequest("GET", admit.url+"/readyz", nil)
	req.Header.Set("Authorization", "Bearer eg-admin")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var ready map[string]any
	json.NewDecoder(resp.Body).Decode(&ready)
	resp.Body.Close()
	if !strings.Contains(fmt.Sprint(ready["envoy_config_error"]), "xds:broken") {
		t.Fatalf("/readyz does not show the refused version: %v", ready)
	}
}

// TestEnvoyGatewayIdentity works out, from what Envoy Gateway's translator
// makes of deploy/envoy-gateway's policies, the descriptors Envoy sends
// for requests whose clients add their own x-user-id (any spelling),
// x-tenant-id and X-Forwarded-For, and checks that only the platform's
// token chooses the user: the client's headers change nothing and never
// reach the application. Until 2026-11-26 the example keyed its per-user
// limit by the client's own x-user-id.
func TestEnvoyGatewayIdentity(t *testing.T) {
	eg := translatePolicy(t)
	if !eg.jwtRequired {
		t.Fatal("the route lets requests without a token through: their user limit would not apply")
	}
	if len(eg.edge.claimToHeaders) == 0 {
		t.Fatal("no header is set from the token")
	}
	// The route's descriptors, as the translator names their entries: the
	// route, then the user for the first rule, the second rule's own key.
	route := eg.limits[0].GetActions()[0].GetGenericKey()
	user := eg.limits[0].GetActions()[1].GetRequestHeaders()
	rule := eg.limits[1].GetActions()[1].GetGenericKey()
	if route == nil || user == nil || rule == nil || user.GetHeaderName() != "x-user-id" {
		t.Fatalf("the translator's rate limits: %v", eg.limits)
	}
	checkPlatformKeys(t, eg.edge, eg.limits, false, func(claims map[string]string, _ string) string {
		return fmt.Sprintf("%s=%s,%s=%s | %s=%s,%s=%s",
			route.GetDescriptorKey(), route.GetDescriptorValue(), user.GetDescriptorKey(), claims["sub"],
			route.GetDescriptorKey(), route.GetDescriptorValue(), rule.GetDescriptorKey(), rule.GetDescriptorValue())
	})
}

// TestEnvoyGatewayConfig decodes the EnvoyGateway configuration of
// deploy/envoy-gateway strictly, as Kubernetes objects, and checks that it
// runs Admit's image as the rate limit service.
func TestEnvoyGatewayConfig(t *testing.T) {
	data, err := os.ReadFile("../deploy/envoy-gateway/envoy-gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.UnmarshalStrict(data, &cm); err != nil {
		t.Fatal(err)
	}
	var eg struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Gateway    struct {
			ControllerName string `json:"controllerName"`
		} `json:"gateway"`
		Provider struct {
			Type       string `json:"type"`
			Kubernetes struct {
				RateLimitDeployment struct {
					Container struct {
						Image string `json:"image"`
					} `json:"container"`
				} `json:"rateLimitDeployment"`
			} `json:"kubernetes"`
		} `json:"provider"`
		RateLimit struct {
			Backend struct {
				Type  string `json:"type"`
				Redis struct {
					URL string `json:"url"`
				} `json:"redis"`
			} `json:"backend"`
		} `json:"rateLimit"`
	}
	if err := yaml.UnmarshalStrict([]byte(cm.Data["envoy-gateway.yaml"]), &eg); err != nil {
		t.Fatalf("envoy-gateway.yaml: %v", err)
	}
	if cm.Kind != "ConfigMap" || cm.Metadata.Name != "envoy-gateway-config" || eg.Kind != "EnvoyGateway" || eg.APIVersion != "gateway.envoyproxy.io/v1alpha1" ||
		!strings.Contains(eg.Provider.Kubernetes.RateLimitDeployment.Container.Image, "admit") || eg.RateLimit.Backend.Type != "Redis" || eg.RateLimit.Backend.Redis.URL == "" {
		t.Fatalf("the EnvoyGateway configuration: %+v", eg)
	}
}
