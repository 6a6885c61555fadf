package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/internal/server"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/catalog"
	"github.com/admitdev/admit/policy/top"
	"github.com/admitdev/admit/policy/usage"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/wsgateway"
	"github.com/admitdev/admit/yamlconf"
)

const serveUsage = `Usage: admit serve [flags]

Runs the decision API, the admin API, /healthz, /readyz and /metrics on one
HTTP address (/metrics on --metrics instead, when set: the tenant series of
server.tenant_metrics are served only there), and the Envoy rate limit
service (gRPC) on another; with
--envoy-config it also decides the domains of envoyproxy/ratelimit's YAML
files, reloaded like the configuration. Without --config it runs the built-in demo configuration
(admit config example prints it). Flags override the file. The admin token
comes from the configuration's server.admin_token or ADMIT_ADMIN_TOKEN;
without one the admin API is closed, unless --admin-loopback opens it to
clients on this host that reach it directly. Service tokens (the
platform's own backends, which act for any tenant) come from
server.service_tokens and ADMIT_SERVICE_TOKEN. See docs/security.md.

The configuration file is reloaded when it changes (checked every
--reload-interval, applied once it has stayed the same for --reload-settle,
so that a file caught half-written is never applied) and at once on SIGHUP;
a file with errors is refused, the running configuration kept, and the
error logged and shown by /readyz. Write the file by renaming a complete
one over it (as Kubernetes updates a ConfigMap), so that no reader sees it
half-written.

Every decision is traced as an OpenTelemetry span, with its store call,
when OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_TRACES_EXPORTER) says where to
send them over OTLP; the other OTEL_* variables are read as the
specification says. Unset, nothing is traced. See docs/traces.md.

Flags:
`

// backendFlags are the flags of serve and proxy that pick the
// configuration and the store.
type backendFlags struct {
	config, store, dataDir string
	// reloadEvery is how often watched files are read; reloadSettle how
	// long a change must stay the same before it is applied.
	reloadEvery, reloadSettle time.Duration
	// empty, without config, starts with no tenants rather than the demo
	// configuration (admit ratelimit).
	empty bool
	// region and home, if set, override store.region and store.home;
	// regionEnv says they came from ADMIT_REGION and ADMIT_HOME.
	region, home string
	regionEnv    bool
	// readsDataDir says the process only reads the data directory (admit
	// proxy, which has no admin API and keeps no usage records): it takes
	// no lock on it and writes nothing there.
	readsDataDir bool
}

func (f *backendFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "configuration `file` (default: the built-in demo configuration)")
	fs.StringVar(&f.store, "store", "", "store `URL`: memory, redis://host:port/db, redis+sentinel://master@h1:p,h2:p or redis+cluster://h1:p,h2:p (default: store.backend)")
	fs.StringVar(&f.dataDir, "data-dir", "./admit-data", "`directory` that keeps the tenant catalog's changes and the usage records across restarts (memory store)")
	fs.StringVar(&f.region, "region", "", "this region's `name` (store.region), with --home")
	fs.StringVar(&f.home, "home", "", "`URL` of the home Redis that every region shares (store.home): with it, every rule's limit holds across all the regions, each deciding from what it holds")
	fs.DurationVar(&f.reloadEvery, "reload-interval", time.Second, "how often to check the configuration file for changes")
	fs.DurationVar(&f.reloadSettle, "reload-settle", time.Second, "apply a changed configuration file once it has stayed the same this long, so that a file caught half-written is never applied (SIGHUP applies at once)")
}

type serveFlags struct {
	backendFlags
	http, grpc, decisionLog, envoyConfig string
	// limitadorConfig is a Limitador limits file (limitador.limits_file).
	limitadorConfig string
	// topEvery is how often the heaviest callers' sketches are published
	// for the other servers of the store.
	topEvery time.Duration
	// envoyCharge is how envoyproxy/ratelimit domains whose file does not
	// say count their hits: all (all or nothing) or each (as upstream).
	envoyCharge string
	// grpcTLS serves gRPC over TLS; with a CA, mutual TLS, and with
	// grpcClientSAN, only clients whose certificate names it.
	grpcTLS       tlsFiles
	grpcClientSAN string
	// envoyXDS is the address of an xDS server to take envoyproxy/
	// ratelimit's configuration from (instead of envoyConfig).
	envoyXDS, xdsNode, xdsSAN string
	xdsTLS                    tlsFiles
	xdsPlaintext              bool
	// waitForXDS holds readiness until the first xDS configuration.
	waitForXDS bool
	// metrics, if set, serves /metrics on that address, at metricsPath,
	// rather than on the HTTP address.
	metrics, metricsPath string
	// healthPath, if set, also answers readiness at that path, plain "OK"
	// as envoyproxy/ratelimit's /healthcheck does.
	healthPath string
	// adminLoopback opens the admin API without a token to loopback
	// clients that reach the server directly.
	adminLoopback bool
	// grpcReflection serves gRPC server reflection; grpcReflectionSet
	// says --grpc-reflection was given (the demo serves it otherwise).
	grpcReflection, grpcReflectionSet bool
	// upstreamStats keeps envoyproxy/ratelimit's statistics (admit
	// ratelimit sets it from its environment).
	upstreamStats upstreamStatsFlags
	// limitHeaders and dynamicMetadata add envoyproxy/ratelimit's own
	// response headers and dynamic metadata (admit ratelimit sets them
	// from its environment).
	limitHeaders    *envoyrls.LimitHeaderNames
	dynamicMetadata bool
	// envoyQuota is how quota_mode descriptors answer: groups or
	// reported. quotaAll and globalShadow are envoyproxy/ratelimit's
	// QUOTA_MODE and SHADOW_MODE (admit ratelimit sets them from its
	// environment).
	envoyQuota             string
	quotaAll, globalShadow bool
}

func serve(ctx context.Context, args []string, e *env) int {
	fs := flag.NewFlagSet("admit serve", flag.ContinueOnError)
	var f serveFlags
	f.register(fs)
	fs.StringVar(&f.http, "http", "", "HTTP listen `address` (default :8080, or server.http)")
	fs.StringVar(&f.grpc, "grpc", "", "gRPC listen `address` for the Envoy rate limit service (default :8081, or server.grpc)")
	fs.StringVar(&f.envoyConfig, "envoy-config", "", "`directory` of envoyproxy/ratelimit YAML files (*.yaml) for the gRPC service, reloaded when they change (default envoy.config_dir)")
	fs.StringVar(&f.limitadorConfig, "limitador-config", "", "Limitador limits `file`, decided as Limitador decides it for the domains that are its namespaces (Envoy's rate limit service, Kuadrant's RPCs, Limitador's HTTP API), reloaded when it changes (default limitador.limits_file)")
	fs.StringVar(&f.grpcTLS.cert, "grpc-tls-cert", "", "serve gRPC over TLS with this certificate `file` (PEM; reloaded when it changes)")
	fs.StringVar(&f.grpcTLS.key, "grpc-tls-key", "", "the gRPC certificate's key `file` (PEM)")
	fs.StringVar(&f.grpcTLS.ca, "grpc-tls-ca", "", "CA bundle `file`: gRPC clients must show a certificate it signed (mutual TLS)")
	fs.StringVar(&f.grpcClientSAN, "grpc-tls-client-san", "", "with --grpc-tls-ca, accept only client certificates that name `SAN`")
	fs.StringVar(&f.envoyCharge, "envoy-charge", "all", "how envoyproxy/ratelimit domains whose file has no charge: line count hits: `all` (a request's counters all charged or none) or each (every descriptor counted on its own, past its limit too, as envoyproxy/ratelimit counts)")
	fs.StringVar(&f.envoyQuota, "envoy-quota", "groups", "how envoyproxy/ratelimit's quota_mode descriptors answer: `groups` (as it does since spring 2026: a quota over its limit answers OVER_LIMIT, and the request is refused when every group of quotas, one per backend_name and model_name_override, is over) or reported (as its main of 2026-01-22: a quota over its limit answers OK, never refusing)")
	fs.StringVar(&f.envoyXDS, "envoy-xds", "", "take envoyproxy/ratelimit's configuration from the xDS server at `host:port` (RateLimitConfig resources, state of the world, as Envoy Gateway serves them)")
	fs.StringVar(&f.xdsNode, "envoy-xds-node", "envoy-ratelimit", "node `ID` to give the xDS server")
	fs.StringVar(&f.xdsTLS.cert, "envoy-xds-tls-cert", "", "client certificate `file` for the xDS server (PEM)")
	fs.StringVar(&f.xdsTLS.key, "envoy-xds-tls-key", "", "the xDS client certificate's key `file` (PEM)")
	fs.StringVar(&f.xdsTLS.ca, "envoy-xds-tls-ca", "", "CA bundle `file` to check the xDS server with (default: the system's)")
	fs.StringVar(&f.xdsSAN, "envoy-xds-tls-san", "", "the `name` the xDS server's certificate must have (default: the host of --envoy-xds)")
	fs.BoolVar(&f.xdsPlaintext, "envoy-xds-plaintext", false, "reach the xDS server without TLS")
	fs.StringVar(&f.metrics, "metrics", "", "serve /metrics on this `address` (one only the operator's scrapers reach) rather than on the HTTP address: every series, server.tenant_metrics's too; the HTTP address then serves none")
	fs.BoolVar(&f.adminLoopback, "admin-loopback", false, "open the admin API without a token to clients on this host that reach it directly (not through a proxy, TLS terminator or sidecar on the host, nor from a web page)")
	fs.BoolVar(&f.grpcReflection, "grpc-reflection", false, "serve gRPC server reflection (grpcurl without .proto files); it lists the services to anyone who reaches the port (default: on for the built-in demo, off with --config or --empty)")
	fs.DurationVar(&f.topEvery, "top-publish-interval", 10*time.Second, "how often this server publishes its counts of each rule's heaviest callers for the other servers of the store (GET /v1/admin/top merges them)")
	fs.StringVar(&f.decisionLog, "decision-log", "", "append one JSON line per decision to `file` (\"-\" for standard output; default server.decision_log)")
	if code, done := parseFlags(fs, serveUsage, args, e); done {
		return code
	}
	fs.Visit(func(fl *flag.Flag) { f.grpcReflectionSet = f.grpcReflectionSet || fl.Name == "grpc-reflection" })
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	if err := runServer(ctx, &f, e, log); err != nil {
		startFailed(log, e.stderr, "admit serve", err)
		return 2
	}
	return 0
}

// emptyConfig is a configuration without tenants, rules or settings.
var emptyConfig = []byte("version: 1\n")

// loadServeConfig loads the --config file, or the demo configuration.
func loadServeConfig(file string) (*Config, []byte, error) {
	if file == "" {
		cfg, err := ParseConfig("(built-in demo configuration)", demoConfig)
		return cfg, demoConfig, err
	}
	data, err := yamlconf.ReadFile(file, MaxConfigSize)
	if err != nil {
		return nil, nil, yamlconf.Errors{{File: file, Msg: err.Error()}}
	}
	cfg, err := ParseConfig(file, data)
	return cfg, data, err
}

// backend is what serve and proxy share: the configuration, the store and
// the tenant catalog, kept up to date with other servers.
type backend struct {
	cfg     *Config
	data    []byte // the configuration file as loaded
	st      *openedStore
	catalog *catalog.Catalog
	// bans are the bans every front end of this process enforces,
	// followed in the store (each server's Decider enforces them).
	bans *policy.Bans
	stop context.CancelFunc // ends the catalog watch
	// check, if set, is what a reloaded configuration must also pass
	// (admit proxy's actions).
	check func(*Config) error
	// loadedAs, if set, is told the content of each configuration applied
	// after the first.
	loadedAs func([]byte)
}

// serverName names this server among those of one store: its host, its
// process and a random part (a restarted process is another).
func serverName() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// protectedFromBans returns the networks no escalation rule bans: the
// trusted proxies, whose own address a request they forward without
// naming its client comes from.
func protectedFromBans(cfg *Config) []netip.Prefix {
	p, _ := httplimit.ParseProxies(cfg.Server.TrustedProxies) // checked with the configuration
	return p
}

// configVersion names a configuration by its content.
func configVersion(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:6])
}

// openBackend loads the configuration, opens the store and the catalog,
// and follows the shared catalog's changes until ctx ends.
func openBackend(ctx context.Context, f *backendFlags, log *slog.Logger) (*backend, error) {
	cfg, data, err := loadServeConfig(f.config)
	if f.config == "" && f.empty {
		data = emptyConfig
		cfg, err = ParseConfig("(empty configuration)", data)
	}
	if err != nil {
		return nil, fmt.Errorf("the configuration is invalid, not starting:\n%w", err)
	}
	if err := regionFlags(f, cfg); err != nil {
		return nil, err
	}
	st, err := openStore(ctx, f.store, cfg, f.dataDir, !f.readsDataDir, log)
	if err != nil {
		return nil, err
	}
	catalog, err := catalog.New(ctx, st.spec(cfg), st.changes)
	if err != nil {
		st.close()
		return nil, err
	}
	if catalog.Pending() {
		log.Warn("the shared tenant catalog could not be loaded at start; serving the configuration's tenants until it can")
	}
	catalog.OnRestore(func(entries int, revision int64) {
		log.Warn("the shared tenant catalog had lost acknowledged changes (a Redis that came back empty or older); restored them from this server's copy",
			"entries", entries, "revision", revision)
	})
	ctx, stop := context.WithCancel(ctx)
	if st.watch != nil {
		// Another server's admin change reaches this one within a
		// moment: on its message, or at the latest at the next poll.
		var health refreshHealth
		go st.watch(ctx, catalogPoll, func() error {
			err := catalog.Refresh(ctx)
			if ctx.Err() == nil {
				health.record(err, log)
			}
			return err
		})
	}
	bans := policy.NewBans(st.bans)
	bans.SetProtected(protectedFromBans(cfg))
	if err := bans.SetEscalations(cfg.Escalations()); err != nil {
		stop()
		st.close()
		return nil, err // checked with the configuration
	}
	if err := bans.Start(ctx, st.store); err != nil {
		if admit.ErrorCode(err) != admit.CodeUnavailable {
			// A journal or a Redis hash that is not one: serving
			// without the bans it holds would admit every banned
			// caller, silently.
			stop()
			st.close()
			return nil, fmt.Errorf("the bans cannot be read, not starting: %w", err)
		}
		log.Warn("the bans could not be loaded at start; enforcing none until they can (retried each second)", "err", err)
	}
	return &backend{cfg: cfg, data: data, st: st, catalog: catalog, stop: stop, bans: bans}, nil
}

// regionFlags applies --region and --home over the file's store section,
// and refuses, with their places in the file, the rules a home cannot hold
// across regions.
func regionFlags(f *backendFlags, cfg *Config) error {
	regionName, homeName := "--region", "--home"
	if f.regionEnv {
		regionName, homeName = "ADMIT_REGION", "ADMIT_HOME"
	}
	if f.region != "" {
		if err := checkRegionName(f.region); err != nil {
			return fmt.Errorf("%s %w", regionName, err)
		}
		cfg.Store.Region = f.region
	}
	if f.home != "" {
		if _, err := redisstore.ParseURL(f.home); err != nil || !strings.HasPrefix(f.home, "redis") {
			return fmt.Errorf("%s %q: want a Redis URL as --store takes (redis://host:port/db, rediss://…, redis+sentinel://…, redis+cluster://…)", homeName, redisstore.Redact(f.home))
		}
		cfg.Store.Home = f.home
	}
	if cfg.Store.Home == "" {
		if cfg.Store.Region != "" {
			return fmt.Errorf("%s needs %s (or store.home), the Redis the regions share", regionName, homeName)
		}
		return nil
	}
	if cfg.Store.Region == "" {
		return fmt.Errorf("a home (%s or store.home) needs a region: %s NAME or store.region", homeName, regionName)
	}
	if err := cfg.CheckRegions(); err != nil {
		return fmt.Errorf("the configuration cannot be held across regions, not starting:\n%w", err)
	}
	return nil
}

// refreshHealth logs the shared catalog's outages once each way: the first
// refresh that fails, and the first that succeeds after it, with how long
// the catalog could not be loaded. Refreshes come from more than one
// goroutine.
type refreshHealth struct {
	mu    sync.Mutex
	since time.Time // zero while refreshes succeed
}

func (h *refreshHealth) record(err error, log *slog.Logger) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err != nil && h.since.IsZero():
		h.since = time.Now()
		log.Warn("the shared tenant catalog could not be loaded; keeping the current one until it can", "err", err)
	case err == nil && !h.since.IsZero():
		log.Info("the shared tenant catalog is loaded again", "outage", time.Since(h.since).Round(time.Millisecond).String())
		h.since = time.Time{}
	}
}

// catalogPoll is how often a server reads the shared catalog's revision
// to find a change whose message it missed (or a Redis that lost it).
const catalogPoll = 500 * time.Millisecond

// close stops following the shared catalog, then closes the store.
func (b *backend) close() {
	b.stop()
	b.st.close()
}

// runServer runs admit serve until ctx ends: it opens the store and the
// catalog, wires the decision, usage and admin APIs, the WebSocket
// gateway and the Envoy rate limit service over one Decider, serves the
// HTTP and gRPC ports (and the metrics address) and reloads the
// configuration as it changes. Everything it starts is stopped, in
// reverse order, before it returns.
func runServer(ctx context.Context, f *serveFlags, e *env, log *slog.Logger) error {
	tp, stopTracing, err := startTracing(ctx, e, log)
	if err != nil {
		return err
	}
	// Last, after the servers drained: their last spans are sent.
	defer stopTracing()
	b, err := openBackend(ctx, &f.backendFlags, log)
	if err != nil {
		if dir := f.envoyConfig; dir != "" {
			// Every error of the files given in one run: the Envoy
			// directory's too.
			if _, eerr := envoyrls.LoadDir(dir); eerr != nil {
				err = fmt.Errorf("%w\n%w", err, eerr)
			}
		}
		return err
	}
	defer b.close()
	cfg, st, catalog := b.cfg, b.st, b.catalog
	httpAddr := first(f.http, cfg.Server.HTTP, ":8080")
	grpcAddr := first(f.grpc, cfg.Server.GRPC, ":8081")
	token := first(cfg.Server.AdminToken, e.getenv("ADMIT_ADMIN_TOKEN"))
	serviceTokens := cfg.Server.ServiceTokens
	if t := e.getenv("ADMIT_SERVICE_TOKEN"); t != "" {
		serviceTokens = append(slices.Clone(serviceTokens), t)
	}
	decisionLog, closeDecisionLog, err := openDecisionLog(first(f.decisionLog, cfg.Server.DecisionLog), e.stdout)
	if err != nil {
		return err
	}
	defer closeDecisionLog()
	hopts, err := httpOptions(cfg)
	if err != nil {
		return err // validated with the configuration
	}
	// One decider for HTTP and gRPC: a rule that fails local shares one
	// in-process limiter whichever way it is asked.
	dec := policy.NewDecider(st.store, cfg.Store.Instances)
	dec.EnforceBans(b.bans)
	defer dec.Close()
	callers := top.New(serverName(), st.top)
	dec.Observe(callers)
	go callers.Publish(ctx, max(f.topEvery, 100*time.Millisecond))
	dec.Trace(tp, st.kind())
	meter := usage.NewMeter(st.usage, time.Second)
	dec.MeterUsage(meter)
	defer func() {
		// After the servers stopped (deferred after this): the last
		// second of usage is written before the store closes.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := meter.Close(ctx); err != nil {
			log.Warn("shutdown: the last usage records were not written", "err", err)
		}
	}()
	gwOpts := gatewayOptions(&cfg.Gateway, &hopts, st, catalog, dec, log)
	gwOpts.TracerProvider = tp
	gw, err := wsgateway.New(gwOpts)
	if err != nil {
		return err // validated with the configuration
	}
	defer func() {
		// Hijacked WebSocket connections are not the HTTP server's to
		// drain: close them (1001) and release their slots.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := gw.Close(ctx); err != nil {
			log.Warn("shutdown: WebSocket connections still open", "err", err)
		}
	}()
	envoyDir := first(f.envoyConfig, cfg.Envoy.ConfigDir)
	if envoyDir != "" && f.envoyXDS != "" {
		return errors.New("envoyproxy/ratelimit files (--envoy-config or envoy.config_dir) and --envoy-xds: pick one")
	}
	configured := new(atomic.Bool)
	waiting, ready := xdsReadiness(f.envoyXDS != "" && f.waitForXDS, configured, st.ready)
	upstreamStats, registry, stopStats := startUpstreamStats(ctx, f.upstreamStats, log)
	defer stopStats()
	var lim *limitadorService
	var limHTTP http.Handler
	var srv *server.Server
	if file := first(f.limitadorConfig, cfg.Limitador.LimitsFile); file != "" {
		if lim, err = startLimitador(file, cfg.Limitador, dec, st.check, st.counters); err != nil {
			return err
		}
		defer lim.lim.Close()
		// srv is set below, before the first request.
		limHTTP = lim.handler(func(r *http.Request) bool { return srv.Trusted(r) })
	}
	srv, err = server.New(server.Options{
		Store: st.store, Catalog: catalog, AdminToken: token, AdminLoopback: f.adminLoopback,
		ServiceTokens: serviceTokens, ForwardAuth: cfg.HTTP.ForwardAuth, Logger: log,
		DecisionLog: decisionLog, TenantMetrics: cfg.Server.TenantMetrics,
		Instances: cfg.Store.Instances, Stats: st.stats, Ready: st.ready, Waiting: waiting, Health: st.health,
		HTTP: hopts, Decider: dec, Gateway: gw, Demo: cfg.Gateway.Demo == nil || *cfg.Gateway.Demo,
		Usage: st.usage, Registry: registry, MetricsElsewhere: f.metrics != "",
		Idempotency: st.idem, AnonymousIdempotency: st.anonIdem, Callers: callers, IdempotencyWindow: idempotencyWindow(cfg.Server.IdempotencyWindow),
		TracerProvider: tp, Limitador: limHTTP,
	})
	if err != nil {
		return err
	}
	defer srv.Close()
	var grpcOpts []grpc.ServerOption
	if f.grpcTLS.set() {
		tc, err := f.grpcTLS.serverConfig(f.grpcClientSAN)
		if err != nil {
			return fmt.Errorf("gRPC: %w", err)
		}
		grpcOpts = append(grpcOpts, envoyrls.TLS(tc))
	}
	charge, err := parseCharge(f.envoyCharge)
	if err != nil {
		return err
	}
	quota, err := envoyrls.ParseQuotaAnswers(f.envoyQuota)
	if err != nil {
		return err
	}
	es, err := startEnvoy(envoyServing{addr: grpcAddr, dir: envoyDir, charge: charge, ready: ready, reflection: f.reflection(), opts: grpcOpts, stats: upstreamStats,
		limitHeaders: f.limitHeaders, dynamicMetadata: f.dynamicMetadata, trustedPeers: hopts.TrustedProxies,
		quota: quota, quotaAll: f.quotaAll, globalShadow: f.globalShadow, tracer: tp, limitador: lim}, b, dec, srv)
	if err != nil {
		return fmt.Errorf("the Envoy rate limit service: %w", err)
	}
	defer es.stop(log)
	srv.SetEnvoyDomains(func() []string { return es.svc.Config().Domains() })
	srv.SetQuotaShares(es.quota.Shares)
	if err := srv.RegisterMetrics(append(es.srv.Collectors(), append(es.quota.Collectors(), b.bans.Collector())...)...); err != nil {
		return err
	}
	if e.listeningGRPC != nil {
		e.listeningGRPC(es.ln.Addr().String())
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	switch {
	case envoyDir != "":
		go es.watch(watchCtx, reloading{every: f.reloadEvery, settle: f.reloadSettle, setErr: srv.SetEnvoyConfigError, log: log}, e.reloadEnvoy)
	case f.envoyXDS != "":
		stopXDS, err := es.followXDS(watchCtx, f, configured, srv.SetEnvoyConfigError, log)
		if err != nil {
			return fmt.Errorf("xDS: %w", err)
		}
		defer stopXDS()
	}
	if lim != nil {
		if err := srv.RegisterMetrics(lim.metrics); err != nil {
			return err
		}
		for _, w := range lim.lim.Limits().Warnings {
			log.Warn("limitador limits", "warning", w)
		}
		go lim.watch(watchCtx, reloading{every: f.reloadEvery, settle: f.reloadSettle, log: log})
	}
	var handler http.Handler = srv
	if f.healthPath != "" {
		handler = withHealthPath(srv, f.healthPath)
	}
	if f.metrics != "" {
		stopMetrics, err := serveMetrics(f.metrics, first(f.metricsPath, "/metrics"), srv.MetricsHandler(), log)
		if err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		defer stopMetrics()
	}

	tcp, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return err
	}
	ln := httpListener(tcp, &cfg.Server, hopts.TrustedProxies)
	if err := srv.RegisterMetrics(httpConnMetrics(ln)...); err != nil {
		return err
	}
	warnServeSettings(log, cfg, f, token)
	log.Info("admit serving", "http", "http://"+ln.Addr().String(), "grpc", es.ln.Addr().String(), "config", f.configName(), "store", st.name,
		"tenants", len(catalog.Policy().Tenants()), "envoy_domains", strings.Join(es.svc.Config().Domains(), ","), "data_dir", f.dataDir)
	srv.SetConfigVersion(configVersion(b.data))
	b.loadedAs = func(data []byte) { srv.SetConfigVersion(configVersion(data)) }
	return b.run(ctx, server.HTTPServer(handler, log), ln, e, reloading{file: f.config, every: f.reloadEvery, settle: f.reloadSettle, setErr: srv.SetConfigError, log: log})
}

// openDecisionLog opens the decision log named: none for "", stdout for
// "-", else the file, appended to.
func openDecisionLog(name string, stdout io.Writer) (io.Writer, func(), error) {
	switch name {
	case "":
		return nil, func() {}, nil
	case "-":
		return stdout, func() {}, nil
	}
	// Read too: a line a crash cut short is cut off at start.
	file, err := os.OpenFile(name, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("decision log: %w", err)
	}
	return file, func() { file.Close() }, nil
}

// xdsReadiness returns, when the server waits for its first xDS
// configuration, what says it waits (for /readyz) and the gRPC health
// check that fails until it has come, then asks storeReady; otherwise
// nil and storeReady.
func xdsReadiness(wait bool, configured *atomic.Bool, storeReady func(context.Context) error) (waiting func() error, ready func(context.Context) error) {
	if !wait {
		return nil, storeReady
	}
	waiting = func() error {
		if !configured.Load() {
			return errors.New("waiting for the first configuration from the xDS server")
		}
		return nil
	}
	return waiting, func(ctx context.Context) error {
		if err := waiting(); err != nil {
			return err
		}
		if storeReady == nil {
			return nil
		}
		return storeReady(ctx)
	}
}

// startUpstreamStats starts envoyproxy/ratelimit's statistics where u
// sends them: nil when it sends them nowhere; a registry of their
// metrics in its Prometheus mode; a statsd sink until stop.
func startUpstreamStats(ctx context.Context, u upstreamStatsFlags, log *slog.Logger) (stats *envoyrls.UpstreamStats, reg *prometheus.Registry, stop func()) {
	if !u.on() {
		return nil, nil, func() {}
	}
	stats = envoyrls.NewUpstreamStats(u.nearLimit)
	if u.prometheus {
		reg = prometheus.NewRegistry()
		reg.MustRegister(stats.Collector(u.mapperFile, log))
	}
	if u.statsd == "" {
		return stats, reg, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { stats.SendStatsd(ctx, u.statsd, u.every, log); close(done) }()
	return stats, reg, func() { cancel(); <-done }
}

// warnServeSettings warns of settings that do less than they seem to.
func warnServeSettings(log *slog.Logger, cfg *Config, f *serveFlags, token string) {
	if cfg.HTTP.UserHeader != "" && cfg.HTTP.ForwardAuth == "" {
		log.Warn("/v1/authz reads no http.user_header until http.forward_auth names the proxy that asks it, whose configuration sets or clears that header (docs/http.md)",
			"user_header", cfg.HTTP.UserHeader)
	}
	if cfg.Server.TenantMetrics && f.metrics == "" {
		log.Warn("server.tenant_metrics: the tenant series are served only on the metrics address, never on the API's, and none is set (--metrics)")
	}
	switch {
	case f.adminLoopback:
		log.Warn("--admin-loopback: the admin API answers, without a token, any client on this host that connects to it directly; never use it where a proxy, TLS terminator or sidecar on this host forwards other clients")
	case token == "":
		log.Warn("no admin token (ADMIT_ADMIN_TOKEN or server.admin_token): the admin API is closed; set a token, or start with --admin-loopback on a host of your own")
	}
}

// reflection reports whether the gRPC port serves reflection: as
// --grpc-reflection says, or, without it, for the built-in demo alone, so
// that the walk-through's grpcurl lines run as written.
func (f *serveFlags) reflection() bool {
	if f.grpcReflectionSet {
		return f.grpcReflection
	}
	return f.config == "" && !f.empty
}

// configName names the configuration served, for the log.
func (f *serveFlags) configName() string {
	switch {
	case f.config != "":
		return f.config
	case f.empty:
		return "none"
	}
	return "built-in demo"
}

// gatewayOptions are the WebSocket gateway's options from the gateway
// section (validated with the configuration); h says which proxies are
// believed about a client's address.
func gatewayOptions(g *GatewayConfig, h *httplimit.Options, st *openedStore, catalog *catalog.Catalog, dec *policy.Decider, log *slog.Logger) wsgateway.Options {
	dur := func(s string) time.Duration {
		d, _ := time.ParseDuration(s)
		return d
	}
	return wsgateway.Options{
		Store: st.store, Policy: catalog.Policy, Decider: dec, Sessions: st.sessions, Logger: log,
		OriginPatterns: g.AllowedOrigins, LeaseTTL: dur(g.LeaseTTL), PingInterval: dur(g.PingInterval),
		SendBytes: int(g.SendBufferBytes), SendFrames: int(g.SendBufferFrames),
		MaxMessageBytes: g.MaxMessageBytes, PoolWorkers: int(g.PoolWorkers),
		FrameBudget: int(g.FrameBudget), FrameBudgetPerSecond: int(g.FrameBudgetPerSecond),
		MaxMessageFrames: int(g.MessageFrames), MessageTimeout: dur(g.MessageTimeout),
		// The anonymous callers share their part of the global rules
		// by the address Admit sees, as the HTTP API shares it.
		ClientAddr: func(r *http.Request) string {
			if a := httplimit.ClientIP(r, h.TrustedProxies, h.ForwardedHeader); a.IsValid() {
				return a.String()
			}
			return ""
		},
	}
}

// reloading says where a server's configuration file is, how often it is
// read for changes, how long a change must settle, and who hears of them.
type reloading struct {
	file   string        // "" for none: nothing to reload
	every  time.Duration // how often the file is read
	settle time.Duration // how long a change must stay the same (see settling)
	setErr func(error)   // told the outcome of every reload
	log    *slog.Logger
}

// settling holds back a change to a watched file until the file has
// stayed the same for a period. A file written in place, in several
// writes (a copy, an editor, scp), is caught in between now and then, and
// a half that parses is a configuration of its own: cut before its
// tenants, it has none and refuses every key. Renaming a complete file
// over the old one (as the kubelet swaps a ConfigMap) is never caught
// half-way, and is applied one period after it is seen.
type settling struct {
	period  time.Duration
	pending [sha256.Size]byte // the content waiting, while since is set
	since   time.Time         // when it was first read; zero: none waits
}

// stable reports whether content whose digest is d, read at now, has been
// read the same for the period; new content starts the period again.
// first says that d was not waiting already.
func (s *settling) stable(d [sha256.Size]byte, now time.Time) (ok, first bool) {
	if s.since.IsZero() || d != s.pending {
		s.pending, s.since = d, now
		return s.period <= 0, true
	}
	return now.Sub(s.since) >= s.period, false
}

// reset forgets the content waiting: it was applied, or the file went
// back to what is running.
func (s *settling) reset() { s.since = time.Time{} }

// run serves hs on ln until ctx ends, reloading the configuration file (if
// any) meanwhile, then drains the connections.
func (b *backend) run(ctx context.Context, hs *http.Server, ln net.Listener, e *env, rl reloading) error {
	log := rl.log
	if e.listening != nil {
		e.listening(ln.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	reloadDone := make(chan struct{})
	reloadCtx, stopReload := context.WithCancel(ctx)
	go func() {
		defer close(reloadDone)
		if rl.file != "" {
			b.watchConfig(reloadCtx, rl, e.reload)
		}
	}()

	select {
	case err := <-errc:
		stopReload()
		<-reloadDone
		return err
	case <-ctx.Done():
	}
	stopReload()
	<-reloadDone
	log.Info("shutting down: draining connections")
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(shutCtx); err != nil {
		log.Warn("shutdown: connections still open were closed", "err", err)
	}
	return nil
}

// watchConfig reloads b's configuration file when its content changes
// and has settled (see settling), on SIGHUP, and when reload says so, into
// b's catalog. A bad file is refused; the running configuration stays.
// b.loadedAs, if not nil, is told the content of every configuration
// applied.
func (b *backend) watchConfig(ctx context.Context, rl reloading, reload <-chan struct{}) {
	file, setErr, log, catalog := rl.file, rl.setErr, rl.log, b.catalog
	last := b.data
	wait := settling{period: rl.settle}
	onReloadSignal(ctx, rl.every, reload, func(forced bool) {
		data, err := yamlconf.ReadFile(file, MaxConfigSize)
		if err != nil {
			wait.reset()
			if forced || last != nil { // log a vanished file once, not every tick
				log.Error("configuration reload refused; keeping the running configuration", "err", err)
				setErr(err)
				last = nil
			}
			return
		}
		if !forced && bytes.Equal(data, last) {
			wait.reset()
			return
		}
		if !forced {
			ok, first := wait.stable(sha256.Sum256(data), time.Now())
			if first && !ok {
				log.Info("the configuration file changed; applying it once it has stayed the same", "config", file, "settle", rl.settle.String())
			}
			if !ok {
				return
			}
		}
		wait.reset()
		last = data
		cfg, err := ParseConfig(file, data)
		if err == nil && b.st.home {
			err = cfg.CheckRegions()
		}
		if err == nil && b.check != nil {
			err = b.check(cfg)
		}
		if err == nil {
			err = catalog.SetBase(b.st.spec(cfg))
		}
		if err == nil {
			err = b.bans.SetEscalations(cfg.Escalations())
			b.bans.SetProtected(protectedFromBans(cfg))
		}
		if err != nil {
			log.Error("configuration reload refused; keeping the running configuration", "err", strings.ReplaceAll(err.Error(), "\n", "; "))
			setErr(err)
			return
		}
		setErr(nil)
		if b.loadedAs != nil {
			b.loadedAs(data)
		}
		log.Info("configuration reloaded", "config", file, "tenants", len(catalog.Policy().Tenants()))
	})
}

// onReloadSignal calls check every interval (forced false), and on SIGHUP
// or a message on reload (forced true), until ctx ends: the rhythm every
// file watcher of serve follows.
func onReloadSignal(ctx context.Context, every time.Duration, reload <-chan struct{}, check func(forced bool)) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		forced := false
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-hup:
			forced = true
		case <-reload:
			forced = true
		}
		check(forced)
	}
}

// parseFlags parses a verb's flags. done says the command ends here: with
// exit 0 after --help (the usage goes to standard output), 2 on a bad flag
// or a stray argument.
func parseFlags(fs *flag.FlagSet, usage string, args []string, e *env) (code int, done bool) {
	fs.SetOutput(e.stderr)
	// Parse prints the usage itself, for -h and for a bad flag: the
	// former to stdout, once.
	help := false
	fs.Usage = func() {
		if help {
			fs.SetOutput(e.stdout)
		}
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	for _, a := range args {
		if a == "--" {
			break
		}
		help = help || a == "-h" || a == "-help" || a == "--help" || a == "--h"
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, true
		}
		return 2, true
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return 2, true
	}
	return 0, false
}

func first(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// idempotencyWindow is server.idempotency_window, validated with the
// configuration: 0 (the default) when unset.
func idempotencyWindow(s string) time.Duration {
	d, _ := time.ParseDuration(s)
	return d
}

// startFailed reports err, which stopped command from starting: one line
// logged, or, for a list of errors (a configuration's, each file:line:
// reason), a logged summary and the errors written as they are, a line
// each, so that they read as the docs show them.
func startFailed(log *slog.Logger, w io.Writer, command string, err error) {
	msg := err.Error()
	if !strings.Contains(msg, "\n") {
		log.Error(command + ": " + msg)
		return
	}
	lines := strings.Split(strings.TrimRight(msg, "\n"), "\n")
	n := len(lines)
	if strings.HasSuffix(lines[0], ":") {
		n-- // a heading, such as "the configuration is invalid, not starting:"
	}
	log.Error(command+": not started", "errors", n)
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}
