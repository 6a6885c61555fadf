// Package server is Admit's HTTP API: decisions, leases, the admin API,
// health, readiness and metrics, over net/http (docs/api.md).
//
// A Server decides against one admit.Store and resolves requests against
// the current Policy of one catalog.Catalog. Both are safe for concurrent
// use, so handlers share them without locks of their own; the only
// per-server state that handlers write is atomic (counters, the last reload
// error) or behind the decision log's channel.
package server

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/policy/catalog"
	"github.com/admitdev/admit/policy/top"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/api"
	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/idempotency"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/internal/tracing"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/usage"
	"github.com/admitdev/admit/problem"
	"github.com/admitdev/admit/wsgateway"
)

// StoreStats is what the metrics report about the store.
type StoreStats struct {
	Keys, Evictions, Expirations, Leases int64
}

// StoreHealth is what the metrics and /readyz report about a remote store.
type StoreHealth struct {
	Breaker                       string // closed, open or half-open
	Calls, Failures, UndoFailures int64
	// Decisions asked of the store, those decided without a call (from
	// leased allowances, or refused until a time the store was given),
	// those of them that were refusals, withdrawal calls, and allowance
	// units withdrawn, given back, expired unused and lost.
	Decisions, LocalDecisions, LocalRefusals, Withdrawals int64
	Withdrawn, Refunded, Expired, Lost                    int64
	// Region is set when the store is one region of limits held across
	// regions.
	Region *RegionHealth
}

// RegionHealth is what a region's store says of its home: the region's
// name, the units its pools held when last looked at, its share of the
// last limit it was granted, calls to the home (and how many failed),
// units granted and given back, the calls' round trip, whether the home
// is cut off (its last call failed), and why.
type RegionHealth struct {
	Name         string  `json:"name"`
	Held         int64   `json:"held"`
	Share        float64 `json:"share"`
	HomeCalls    int64   `json:"home_calls"`
	HomeFailures int64   `json:"home_failures"`
	Granted      int64   `json:"granted"`
	GivenBack    int64   `json:"given_back"`
	RoundTripMS  float64 `json:"round_trip_ms"`
	Cut          bool    `json:"cut"`
	LastError    string  `json:"last_error,omitempty"`
}

// Options configure a Server. Store and Catalog are required; the zero
// value of every other field is a documented default.
type Options struct {
	Store   admit.Store
	Catalog *catalog.Catalog
	// AdminToken opens the admin API to callers that present it
	// (Authorization: Bearer). It is also a service token. Empty: the
	// admin API is closed, unless AdminLoopback.
	AdminToken string
	// AdminLoopback opens the admin API without a token to clients on
	// this host that reach it directly: from 127.0.0.1 or ::1, not a
	// trusted proxy, with no forwarding header, a loopback Host, not
	// from another site's page, and changes sent as JSON. Never set it
	// where a proxy, TLS terminator or sidecar on the host connects from
	// loopback on behalf of others.
	AdminLoopback bool
	// ServiceTokens are the credentials of the platform's own backends:
	// a caller that presents one (Authorization: Bearer) may act for any
	// tenant and name the ip and attributes of keys that all tenants
	// share, but not use the admin API.
	ServiceTokens []string
	// Logger receives the server's logs; default slog.Default().
	Logger *slog.Logger
	// DecisionLog, if set, receives one JSON line per decision.
	DecisionLog io.Writer
	// TenantMetrics adds admit_tenant_decisions_total, by tenant and
	// result. It names tenants and tells their volumes, which no tenant
	// may read of another: MetricsHandler serves it, never the HTTP API.
	TenantMetrics bool
	// Registry, if set, holds more metrics to serve with the server's
	// (envoyproxy/ratelimit's statistics, say). Their names and labels
	// may carry what clients send (a domain, a descriptor's value), so
	// MetricsHandler serves them, never the HTTP API.
	Registry *prometheus.Registry
	// MetricsElsewhere says that MetricsHandler is served on an address
	// of the operator's: the HTTP API then answers /metrics with 404.
	// Otherwise it serves there the series that name no tenant and
	// nothing a client chose (counts by endpoint, tier and rule; the
	// store's health; the Go runtime).
	MetricsElsewhere bool
	// Stats reports the store's key counts for the metrics; optional.
	Stats func() StoreStats
	// Ready reports whether the store answers; nil means always ready.
	// While it fails, /readyz answers ready if no rule fails closed:
	// the rules' on_error decide meanwhile.
	Ready func(ctx context.Context) error
	// Waiting, if set, reports what the server waits for before it can
	// decide at all (the first configuration from an xDS server): /readyz
	// answers unready while it does.
	Waiting func() error
	// Idempotency keeps the answers of charges made with an
	// Idempotency-Key header for IdempotencyWindow (default
	// DefaultIdempotencyWindow); nil keeps them in this process.
	Idempotency       idempotency.Store
	IdempotencyWindow time.Duration
	// AnonymousIdempotency keeps the keys of anonymous callers, and of
	// tenants the catalog does not know, per address (nil: in this
	// process, a tenth of the default bound an address).
	AnonymousIdempotency idempotency.Store
	// Health reports a remote store's breaker and call counters for the
	// metrics and /readyz; optional.
	Health func() StoreHealth
	// Instances is the number of servers sharing the limits: a rule with
	// on_error local gives each server limit / Instances. Default 1.
	Instances int64
	// MaxWait caps /v1/acquire's max_wait_ms; default 60s.
	MaxWait time.Duration
	// Decider, if set, decides (and holds the on_error: local limiter);
	// default a new one over Store and Instances. Share one with other
	// front ends of the same process.
	Decider *policy.Decider
	// Callers, if set, counts the heaviest callers of each rule
	// (GET /v1/admin/top, the dashboard); the Decider tells it of every
	// decision.
	Callers *top.Callers
	// Usage, if set, answers GET /v1/admin/usage with the quotas' usage
	// records (the Decider's meter writes them).
	Usage usage.Store
	// Gateway, if set, serves the WebSocket gateway: PUT /v1/sessions,
	// DELETE /v1/sessions/{tenant}/{session} and GET /v1/ws. The caller
	// owns it and closes it.
	Gateway *wsgateway.Gateway
	// Demo serves the seed-001 sample client page at /demo/ (with the
	// gateway).
	Demo bool
	// ForwardAuth names the proxy in front of /v1/authz, whose headers
	// carry the original method, URI and host (see ForwardAuthProxies):
	// "traefik", "caddy", "nginx", "haproxy", or "envoy", which reads the
	// request's own method and path. The user header (HTTP.UserHeader)
	// is read only when it names one, from HTTP.TrustedProxies: that
	// proxy's configuration must set or clear it. Unset, /v1/authz reads
	// the request as for envoy, and no user header.
	ForwardAuth string
	// HTTP configures how /v1/authz identifies the original request:
	// trusted proxies, user header, JWT, actions, Retry-After jitter. Its
	// Store, Decider, Policy, Observe, Logger and tracing are the server's.
	HTTP httplimit.Options
	// TracerProvider, if set, traces the decisions of /v1/check,
	// /v1/report, /v1/acquire and /v1/authz in OpenTelemetry spans
	// (docs/traces.md), children of the traces their callers'
	// traceparent headers continue. A Decider of the server's own traces
	// its store calls with it too; a given one is traced by its maker
	// (policy.Decider.Trace). Nil traces nothing, at no cost.
	TracerProvider trace.TracerProvider
	// Limitador, if set, serves Limitador's HTTP API (GET /status,
	// /limits/{namespace}, /counters/{namespace}; POST /check, /report,
	// /check_and_report) beside Admit's own.
	Limitador http.Handler
}

// Server serves the HTTP API. Create it with New; it is safe for concurrent
// use.
type Server struct {
	store   admit.Store
	catalog *catalog.Catalog
	// adminHash is the admin token's SHA-256, nil without one;
	// serviceHashes the service tokens'.
	adminHash      *[sha256.Size]byte
	serviceHashes  [][sha256.Size]byte
	adminLoopback  bool
	trustedProxies httplimit.Proxies
	forwarded      string    // the header trusted proxies name the client in
	forwardAuth    [3]string // the headers of the original method, URI, host
	log            *slog.Logger
	ready          func(ctx context.Context) error
	waiting        func() error
	idem           idempotency.Store
	idemWindow     time.Duration
	idemRetry      *idemRetrier
	held           *heldKeys
	anonIdem       idempotency.Store
	health         func() StoreHealth
	maxWait        time.Duration

	metrics *metrics
	// public holds the metrics the HTTP API serves; all gathers them
	// with the tenants' and the caller's (see MetricsHandler).
	public   *prometheus.Registry
	all      prometheus.Gatherers
	activity *activity // the dashboard's last minutes
	// configVersion is the configuration in use, if the caller said.
	configVersion atomic.Pointer[configVersion]
	decisions     *decisionLog
	claimBase     string
	claimSeq      atomic.Uint64

	configErr atomic.Pointer[string]
	envoyErr  atomic.Pointer[string]
	// envoyDomains, once set, names the domains the Envoy rate limit
	// service decides from envoyproxy/ratelimit files.
	envoyDomains atomic.Pointer[func() []string]
	// quotaShares, once set, reads the quota service's shares for the
	// dashboard.
	quotaShares atomic.Pointer[func(context.Context) []envoyrls.QuotaShares]

	decider  *policy.Decider
	callers  *top.Callers
	topMu    sync.Mutex
	topAt    time.Time
	topLast  []top.Top
	ownDec   bool
	tracer   *tracing.Tracer // the decision API's; nil: traces are off
	waiters  waitQueues      // acquire's waiters on shared limits
	bookings bookingRefusals // acquire's refused bookings
	authz    *httplimit.Limiter
	gateway  *wsgateway.Gateway
	usage    usage.Store

	mux *http.ServeMux
}

// New returns a Server with the given options, or an error saying which
// of opts.HTTP is wrong.
func New(opts Options) (*Server, error) {
	s := &Server{
		store: opts.Store, catalog: opts.Catalog, adminLoopback: opts.AdminLoopback,
		trustedProxies: opts.HTTP.TrustedProxies, forwarded: opts.HTTP.ForwardedHeader,
		log: opts.Logger, ready: opts.Ready, waiting: opts.Waiting, health: opts.Health, maxWait: opts.MaxWait,
		idem: opts.Idempotency, idemWindow: cmp.Or(opts.IdempotencyWindow, DefaultIdempotencyWindow),
		decider: opts.Decider, callers: opts.Callers, gateway: opts.Gateway, usage: opts.Usage, activity: newActivity(),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.idemRetry, s.held = newIdemRetrier(), newHeldKeys()
	if s.anonIdem = opts.AnonymousIdempotency; s.anonIdem == nil {
		s.anonIdem = idempotency.NewMemory(idempotency.DefaultKeysPerScope/10, idempotency.MaxKeys/10)
	}
	if s.idem == nil {
		s.idem = idempotency.NewMemory(0, 0)
	}
	fa, ok := ForwardAuthProxies[opts.ForwardAuth]
	if !ok {
		return nil, fmt.Errorf("server: forward-auth proxy %q: want traefik, caddy, nginx, haproxy or envoy", opts.ForwardAuth)
	}
	s.forwardAuth = fa
	if opts.AdminToken != "" {
		h := hashToken(opts.AdminToken)
		s.adminHash = &h
	}
	for _, t := range opts.ServiceTokens {
		if t != "" {
			s.serviceHashes = append(s.serviceHashes, hashToken(t))
		}
	}
	if s.maxWait <= 0 {
		s.maxWait = time.Minute
	}
	if s.decider == nil {
		s.decider, s.ownDec = policy.NewDecider(opts.Store, opts.Instances), true
		s.decider.Trace(opts.TracerProvider, "")
	}
	s.tracer = tracing.New(opts.TracerProvider, "api")
	reg, private := prometheus.NewRegistry(), prometheus.NewRegistry()
	s.public, s.all = reg, prometheus.Gatherers{reg, private}
	if opts.Registry != nil {
		s.all = append(s.all, opts.Registry)
	}
	s.metrics = newMetrics(reg, private, opts.Stats, opts.TenantMetrics)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "admit_store_up", Help: "1 while decisions find the store answering, 0 during an outage (from its first failed decision to its first answered one).",
	}, func() float64 {
		if _, down := s.decider.StoreDownSince(); down {
			return 0
		}
		return 1
	}))
	s.decider.OnStoreChange(s.storeChanged)
	if opts.Health != nil {
		s.metrics.registerHealth(reg, opts.Health)
	}
	if opts.DecisionLog != nil {
		s.decisions = newDecisionLog(opts.DecisionLog, s.metrics.decisionLogDropped, s.metrics.decisionLogFailing, s.log)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	s.claimBase = hex.EncodeToString(b[:]) + "-"
	hopts := opts.HTTP
	hopts.Store, hopts.Decider, hopts.Policy, hopts.Logger = opts.Store, s.decider, s.catalog.Policy, s.log
	hopts.TracerProvider, hopts.FrontEnd = opts.TracerProvider, "forward_auth"
	hopts.PassUnlimited = true // forward-auth admits anonymous requests (docs/api.md)
	if opts.ForwardAuth == "" {
		// No proxy named: none is known to set or clear the user header
		// on its auth requests, and a proxy that passes the client's own
		// makes every user whoever the client says.
		hopts.UserHeader = ""
	}
	// /v1/authz answers before the request is served, and sheds nothing:
	// it reads no class header.
	hopts.Shedding = nil
	hopts.Observe = func(res *policy.Resolution, d *admit.Decision, out policy.Outcome, took time.Duration) {
		s.count(out, nil)
		s.metrics.observeDecision(res, d, "authz", took)
		s.activity.add(time.Now(), "authz", "", "", res, d)
	}
	authz, err := httplimit.New(hopts)
	if err != nil {
		return nil, err
	}
	s.authz = authz
	if s.gateway != nil {
		reg.MustRegister(newGatewayCollector(s.gateway))
	}
	s.routes(opts.Demo, opts.MetricsElsewhere, opts.Limitador)
	return s, nil
}

// RegisterMetrics adds cs to the metrics the HTTP API's /metrics serves:
// the server's own, which tell no client's values.
func (s *Server) RegisterMetrics(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := s.public.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// MetricsHandler serves every metric of the server in the Prometheus
// text format: those the HTTP API's /metrics serves, the tenant series
// of Options.TenantMetrics and those of Options.Registry. Serve it on an
// address only the operator's scrapers reach.
func (s *Server) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(s.all, promhttp.HandlerOpts{})
}

// MaxHeaderBytes bounds a request's line and headers (net/http's default
// is 1 MB): no request to Admit needs more, and a path or header that
// size only makes work (431 Request Header Fields Too Large).
const MaxHeaderBytes = 64 << 10

// HTTPServer returns the net/http server admit serve runs h on: timeouts
// that bound slow clients, with room for /v1/acquire's longest wait. The
// benchmarks serve their ceiling handler with it too, so that both sides of
// the comparison run on the same stack.
func HTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	hs := &http.Server{
		Handler:           h,
		MaxHeaderBytes:    MaxHeaderBytes,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      90 * time.Second, // /v1/acquire may wait up to a minute
		IdleTimeout:       2 * time.Minute,
	}
	if log != nil {
		hs.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	}
	return hs
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/v1/authz/") {
		// Envoy sends the original path under /v1/authz as the client
		// sent it. ServeMux would answer "/v1/authz//login" with a
		// redirect to the path it cleans, and Envoy would pass that on
		// to the client as its refusal.
		s.handleAuthz(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Close flushes the decision log and stops the local fallback limiter. It
// does not close the store, which the caller owns.
func (s *Server) Close() error {
	s.idemRetry.close()
	if s.decisions != nil {
		s.decisions.close()
	}
	if s.ownDec {
		return s.decider.Close()
	}
	return nil
}

// SetConfigError records the outcome of the latest configuration reload:
// nil after a good one; the error, shown by /readyz, after a bad one.
func (s *Server) SetConfigError(err error) { s.setReload(&s.configErr, s.metrics.reloads, err) }

// SetConfigVersion names the configuration in use (the dashboard shows
// it), and when it was applied.
func (s *Server) SetConfigVersion(v string) {
	s.configVersion.Store(&configVersion{Version: v, LoadedAt: time.Now().UTC()})
}

type configVersion struct {
	Version  string
	LoadedAt time.Time
}

// SetEnvoyDomains gives the server what names the domains the Envoy rate
// limit service decides from envoyproxy/ratelimit files (or xDS): their
// limits fail as the configuration's store.on_error says, which /readyz
// weighs with the rules'.
func (s *Server) SetEnvoyDomains(domains func() []string) { s.envoyDomains.Store(&domains) }

// SetQuotaShares makes the dashboard show the limits the Envoy quota
// service divides, as shares reads them.
func (s *Server) SetQuotaShares(shares func(context.Context) []envoyrls.QuotaShares) {
	s.quotaShares.Store(&shares)
}

// SetEnvoyConfigError records the outcome of the latest reload of the
// envoyproxy/ratelimit files, as SetConfigError does for the configuration.
func (s *Server) SetEnvoyConfigError(err error) {
	s.setReload(&s.envoyErr, s.metrics.envoyReloads, err)
}

func (s *Server) setReload(slot *atomic.Pointer[string], count *prometheus.CounterVec, err error) {
	if err == nil {
		slot.Store(nil)
		count.WithLabelValues("ok").Inc()
		return
	}
	msg := err.Error()
	slot.Store(&msg)
	count.WithLabelValues("error").Inc()
}

// ObserveGRPC counts one call of the Envoy rate limit service in the
// metrics: its result, latency and how the store answered.
func (s *Server) ObserveGRPC(allowed bool, out policy.Outcome, err error, took time.Duration) {
	s.count(out, err)
	em := s.metrics.endpoints["grpc"]
	switch {
	case err != nil:
		// The status label holds the HTTP status an error maps to, for
		// gRPC too, so that one series means one kind of failure.
		s.metrics.errors.WithLabelValues("grpc", strconv.Itoa(problem.Status(err))).Inc()
	case allowed:
		em.allowed.Inc()
	default:
		em.refused.Inc()
	}
	em.latency.Observe(took.Seconds())
	if err == nil {
		s.activity.add(time.Now(), "grpc", "", "", &policy.Resolution{}, &admit.Decision{Allowed: allowed})
	}
}

func (s *Server) routes(demo, metricsElsewhere bool, limitador http.Handler) {
	m := http.NewServeMux()
	allowed := map[string][]string{} // path → methods, for 405 answers
	handle := func(method, path string, h http.Handler) {
		m.Handle(method+" "+path, h)
		if allowed[path] == nil {
			m.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Allow", strings.Join(allowed[path], ", "))
				httpx.CloseUnreadBody(w, r)
				writeProblem(w, http.StatusMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path+"; use "+strings.Join(allowed[path], " or "))
			})
		}
		allowed[path] = append(allowed[path], method)
	}
	handle("POST", "/v1/check", credentials(s.handleCheck))
	handle("POST", "/v1/report", credentials(s.handleReport))
	handle("GET", "/v1/usage", credentials(s.handleUsage))
	handle("POST", "/v1/acquire", credentials(s.handleAcquire))
	handle("POST", "/v1/leases", credentials(s.handleLeaseAcquire))
	handle("PUT", "/v1/leases/{id}", credentials(s.handleLeaseRenew))
	handle("DELETE", "/v1/leases/{id}", credentials(s.handleLeaseRelease))

	handle("GET", "/v1/admin/tenants", s.admin(s.handleTenants))
	handle("GET", "/v1/admin/tenants/{id}", s.admin(s.handleTenantGet))
	handle("PUT", "/v1/admin/tenants/{id}", s.admin(s.handleTenantPut))
	handle("DELETE", "/v1/admin/tenants/{id}", s.admin(s.handleTenantDelete))
	handle("POST", "/v1/admin/tenants/{id}/api-keys", s.admin(s.handleAPIKeyCreate))
	handle("DELETE", "/v1/admin/tenants/{id}/api-keys/{key}", s.admin(s.handleAPIKeyRevoke))
	handle("GET", "/v1/admin/tiers", s.admin(s.handleTiers))
	handle("GET", "/v1/admin/tiers/{name}", s.admin(s.handleTierGet))
	handle("PUT", "/v1/admin/tiers/{name}", s.admin(s.handleTierPut))
	handle("GET", "/v1/admin/state", s.admin(s.handleState))
	handle("POST", "/v1/admin/reset", s.admin(s.handleReset))
	handle("GET", "/v1/admin/usage", s.admin(s.handleUsageRecords))
	handle("GET", "/v1/admin/dashboard", s.admin(s.handleDashboard))
	handle("POST", "/v1/admin/simulate", s.admin(s.handleSimulate))
	handle("GET", "/v1/admin/top", s.admin(s.handleTop))
	handle("GET", "/v1/admin/bans", s.admin(s.handleBans))
	handle("POST", "/v1/admin/bans", s.admin(s.handleBanCreate))
	handle("DELETE", "/v1/admin/bans", s.admin(s.handleBansDelete))
	handle("GET", "/v1/admin/bans/{id}", s.admin(s.handleBanGet))
	handle("DELETE", "/v1/admin/bans/{id}", s.admin(s.handleBanDelete))

	if s.gateway != nil {
		handle("PUT", "/v1/sessions", credentials(s.handleSessionCreate))
		handle("DELETE", "/v1/sessions/{tenant}/{session}", credentials(s.handleSessionDelete))
		handle("GET", "/v1/ws", s.gateway)
		handle("GET", "/v1/ws/preflight", http.HandlerFunc(s.gateway.Preflight))
		if demo {
			handle("GET", "/demo/", s.demoHandler())
		}
	}

	if limitador != nil {
		for _, p := range [...]string{"GET /status", "GET /limits/{namespace}", "GET /counters/{namespace}", "POST /check", "POST /report", "POST /check_and_report"} {
			method, path, _ := strings.Cut(p, " ")
			handle(method, path, limitador)
		}
	}

	for _, path := range []string{"/v1/authz", "/v1/authz/"} {
		m.HandleFunc(path, s.handleAuthz) // every method: Envoy forwards the original one
	}

	handle("GET", "/healthz", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeBody(w, http.StatusOK, []byte("{\"status\":\"ok\"}\n"))
	}))
	handle("GET", "/readyz", http.HandlerFunc(s.handleReady))
	if metricsElsewhere {
		handle("GET", "/metrics", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeProblem(w, http.StatusNotFound, "this server serves its metrics on its metrics address (admit serve --metrics), not on the API's")
		}))
	} else {
		handle("GET", "/metrics", promhttp.HandlerFor(s.public, promhttp.HandlerOpts{Registry: s.public}))
	}
	handle("GET", "/openapi.yaml", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		w.Header().Set("Content-Length", strconv.Itoa(len(api.OpenAPI)))
		_, _ = w.Write(api.OpenAPI)
	}))
	m.HandleFunc("GET /{$}", handleDashboardPage)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpx.CloseUnreadBody(w, r)
		writeProblem(w, http.StatusNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	s.mux = m
}

// storeChanged logs an outage once when decisions first find the store
// unavailable and once when it answers again, however many decisions fail
// in between, and counts it.
func (s *Server) storeChanged(ev policy.StoreEvent) {
	if ev.Up {
		s.metrics.lastOutage.Set(ev.Outage.Seconds())
		s.log.Warn("the store answers again; decisions are the store's once more", "outage", ev.Outage.Round(time.Millisecond).String())
		return
	}
	s.metrics.outages.Inc()
	s.log.Error("the store is unavailable; until it answers, each rule's on_error decides (open admits, closed answers 503, local uses this server's share)", "err", ev.Err)
}

type readyAnswer struct {
	Status string `json:"status"`
	Store  string `json:"store"`
	// StoreDownSince is when decisions first found the store unavailable,
	// during an outage.
	StoreDownSince *time.Time `json:"store_down_since,omitempty"`
	Breaker        string     `json:"breaker,omitempty"`
	// OnError says how decisions are made while the store is down: the
	// failure modes of the rules ("open", "local"). ClosedRules names the
	// rules that fail closed, which make the server unready then (at
	// most maxClosedRules, ClosedRulesMore the others).
	OnError         []string `json:"on_error,omitempty"`
	ClosedRules     []string `json:"closed_rules,omitempty"`
	ClosedRulesMore int      `json:"closed_rules_more,omitempty"`
	ConfigError     string   `json:"config_error,omitempty"`
	EnvoyError      string   `json:"envoy_config_error,omitempty"`
}

// maxClosedRules bounds the closed rules /readyz names.
const maxClosedRules = 20

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	ans, status := s.readiness(r)
	writeJSON(w, status, ans)
}

// readiness is what /readyz answers.
func (s *Server) readiness(r *http.Request) (readyAnswer, int) {
	ans := readyAnswer{Status: "ready", Store: "ok"}
	// Why a reload was refused quotes the file (a value mistyped into the
	// wrong field, a token among them; tenants' and rules' names): only
	// the admin reads it here, every caller that it happened.
	why := func(e *string) string {
		if s.isAdmin(r) || s.adminLoopback && s.loopbackClient(r) == "" {
			return ": " + *e
		}
		return " (the reason is in the server's log, and here with the admin token)"
	}
	if e := s.configErr.Load(); e != nil {
		ans.ConfigError = "the last configuration reload was refused, the previous configuration is in use" + why(e)
	}
	if e := s.envoyErr.Load(); e != nil {
		ans.EnvoyError = "the last envoyproxy/ratelimit configuration (files or xDS version) was refused, the previous one is in use" + why(e)
	}
	status := http.StatusOK
	if s.health != nil {
		ans.Breaker = s.health().Breaker
	}
	if since, down := s.decider.StoreDownSince(); down {
		since = since.UTC()
		ans.StoreDownSince = &since
	}
	if s.waiting != nil {
		if err := s.waiting(); err != nil {
			ans.Status, ans.Store = "unavailable", err.Error()
			return ans, http.StatusServiceUnavailable
		}
	}
	if s.ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := s.ready(ctx); err != nil {
			// The store is down: this server still decides as its
			// configuration says, unless a rule fails closed. Taken out
			// of a load balancer's rotation, it would serve no one,
			// whatever on_error says.
			ans.Store = err.Error()
			p := s.catalog.Policy()
			f := p.Failover()
			if d := s.envoyDomains.Load(); d != nil {
				// The files' limits fail as store.on_error says.
				for _, domain := range (*d)() {
					switch p.OnError() {
					case admit.FailClosed:
						f.Closed = append(f.Closed, "envoy:"+domain)
					case admit.FailLocal:
						f.Local = true
					default:
						f.Open = true
					}
				}
			}
			if f.Open {
				ans.OnError = append(ans.OnError, "open")
			}
			if f.Local {
				ans.OnError = append(ans.OnError, "local")
			}
			if len(f.Closed) > 0 {
				ans.Status, status = "unavailable", http.StatusServiceUnavailable
				ans.ClosedRules = f.Closed[:min(len(f.Closed), maxClosedRules)]
				ans.ClosedRulesMore = len(f.Closed) - len(ans.ClosedRules)
			}
		}
	}
	return ans, status
}
