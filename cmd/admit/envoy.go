package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/internal/server"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/yamlconf"
)

// envoyService is the running Envoy rate limit service and what reloads its
// envoyproxy/ratelimit configuration.
type envoyService struct {
	svc   *envoyrls.Service
	quota *envoyrls.QuotaService
	srv   *envoyrls.Server
	ln    net.Listener
	dir   string
	rules func(*admit.Rule) error // the store's check of a rule, if any
	stats *envoyrls.UpstreamStats // envoyproxy/ratelimit's statistics, if kept
	done  chan error
}

// loaded counts a load of the configuration in envoyproxy/ratelimit's
// statistics, if they are kept.
func (es *envoyService) loaded(err error) {
	if es.stats != nil {
		es.stats.ConfigLoaded(err)
	}
}

// envoyServing is how the Envoy rate limit service is served.
type envoyServing struct {
	addr       string
	dir        string          // envoyproxy/ratelimit files, if any
	charge     envoyrls.Charge // how domains whose file does not say count
	ready      func(context.Context) error
	reflection bool                // serve gRPC server reflection
	opts       []grpc.ServerOption // more options (TLS)
	stats      *envoyrls.UpstreamStats
	// limitHeaders and dynamicMetadata: as envoyproxy/ratelimit's
	// settings ask, besides the configuration's envoy section.
	limitHeaders    *envoyrls.LimitHeaderNames
	dynamicMetadata bool
	// quota says how quota_mode descriptors answer; quotaAll and
	// globalShadow are envoyproxy/ratelimit's QUOTA_MODE and SHADOW_MODE.
	quota                  envoyrls.QuotaAnswers
	quotaAll, globalShadow bool
	// trustedPeers are server.trusted_proxies: the peers whose
	// remote_address entries name their clients.
	trustedPeers []netip.Prefix
	// tracer traces the decisions; nil for none.
	tracer trace.TracerProvider
	// limitador, if set, answers its namespaces' requests and serves
	// Kuadrant's RPCs on the port.
	limitador *limitadorService
}

// startEnvoy loads the envoyproxy/ratelimit files of sv.dir (if any), then
// serves the Envoy rate limit service on sv.addr, its health service
// following sv.ready.
func startEnvoy(sv envoyServing, b *backend, dec *policy.Decider, srv *server.Server) (*envoyService, error) {
	addr, dir, ready, reflection, opts := sv.addr, sv.dir, sv.ready, sv.reflection, sv.opts
	es := &envoyService{dir: dir, rules: b.st.check, stats: sv.stats, done: make(chan error, 1)}
	var cfg *envoyrls.Config
	if dir != "" {
		c, err := es.load()
		if err != nil {
			return nil, err
		}
		es.loaded(nil)
		cfg = c
	}
	var domains envoyrls.DomainDecider
	if sv.limitador != nil {
		domains = sv.limitador.svc
	}
	svc, err := envoyrls.New(envoyrls.Options{
		Domains: domains,
		Decider: dec, Policy: b.catalog.Policy, CatalogDomain: b.cfg.Envoy.Domain, Config: cfg,
		ResponseHeaders: b.cfg.Envoy.ResponseHeaders, DynamicMetadata: b.cfg.Envoy.DynamicMetadata || sv.dynamicMetadata, Charge: sv.charge,
		LimitHeaders: sv.limitHeaders, Observe: func(ev envoyrls.Event) { srv.ObserveGRPC(ev.Allowed, ev.Outcome, ev.Err, ev.Took) },
		Stats: sv.stats, TrustedPeers: sv.trustedPeers, QuotaAnswers: sv.quota, QuotaAll: sv.quotaAll, GlobalShadow: sv.globalShadow,
		TracerProvider: sv.tracer,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	quota, err := envoyrls.NewQuotaService(envoyrls.QuotaOptions{Service: svc, Ledger: b.st.quota})
	if err != nil {
		ln.Close()
		return nil, err
	}
	es.svc, es.quota, es.ln = svc, quota, ln
	es.srv = envoyrls.NewServer(svc, ready, opts...)
	es.srv.ServeQuota(quota)
	if sv.limitador != nil {
		sv.limitador.registerKuadrant(es.srv)
	}
	es.srv.SetMaxConnections(b.cfg.Server.GRPCMaxConnections, b.cfg.Server.GRPCMaxConnectionsPerIP)
	if reflection {
		es.srv.EnableReflection()
	}
	go func() { es.done <- es.srv.Serve(ln) }()
	return es, nil
}

// load loads and checks the files of es.dir.
func (es *envoyService) load() (*envoyrls.Config, error) {
	c, err := envoyrls.LoadDir(es.dir)
	if err == nil && es.rules != nil {
		err = c.Check(es.rules)
	}
	return c, err
}

// stop drains the calls in flight (for at most 10 s) and stops serving.
func (es *envoyService) stop(log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	es.srv.Stop(ctx)
	if err := <-es.done; err != nil {
		log.Warn("the Envoy rate limit service stopped", "err", err)
	}
}

// watch reloads the envoyproxy/ratelimit files when any of them changes
// (checked every rl.every) and the change has settled (see settling), on
// SIGHUP, and when reload says so. A set of files with an error is refused
// and the running configuration kept, like Admit's own configuration.
func (es *envoyService) watch(ctx context.Context, rl reloading, reload <-chan struct{}) {
	setErr, log := rl.setErr, rl.log
	onSettledChange(ctx, rl, reload, func() [sha256.Size]byte { return dirDigest(es.dir) }, func() {
		c, err := es.load()
		es.loaded(err)
		if err != nil {
			log.Error("envoy configuration reload refused; keeping the running one", "dir", es.dir, "err", strings.ReplaceAll(err.Error(), "\n", "; "))
			setErr(err)
			return
		}
		es.svc.SetConfig(c)
		setErr(nil)
		log.Info("envoy configuration reloaded", "dir", es.dir, "domains", strings.Join(c.Domains(), ","))
	})
}

// onSettledChange calls apply when what digest reads changed and has
// settled (see settling), checked every rl.every, and at once on SIGHUP or
// when reload says so, until ctx ends.
func onSettledChange(ctx context.Context, rl reloading, reload <-chan struct{}, digest func() [sha256.Size]byte, apply func()) {
	last := digest()
	wait := settling{period: rl.settle}
	onReloadSignal(ctx, rl.every, reload, func(forced bool) {
		d := digest()
		if !forced && d == last {
			wait.reset()
			return
		}
		if !forced {
			if ok, _ := wait.stable(d, time.Now()); !ok {
				return
			}
		}
		wait.reset()
		last = d
		apply()
	})
}

// dirDigest hashes the names and contents of dir's YAML files, so that any
// change to them (an edit, a new file, a removal) is seen.
func dirDigest(dir string) [sha256.Size]byte {
	h := sha256.New()
	names, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	sort.Strings(names)
	for _, n := range names {
		data, err := yamlconf.ReadFile(n, envoyrls.MaxFileSize)
		h.Write([]byte(n))
		h.Write([]byte{0})
		if fi, err := os.Stat(n); err == nil {
			// Two writes caught at the same cut read the same: their
			// times tell them apart (fileDigest).
			h.Write([]byte(fi.ModTime().Format(time.RFC3339Nano)))
		}
		if err != nil {
			h.Write([]byte(err.Error()))
		}
		h.Write(data)
		h.Write([]byte{0})
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// followXDS takes the envoyproxy/ratelimit configuration from the xDS
// server of f until ctx ends or stop is called: each configuration
// received is checked like the files' and applied, or refused (the server
// is told why) with the running one kept. configured is set at the first
// configuration applied.
func (es *envoyService) followXDS(ctx context.Context, f *serveFlags, configured *atomic.Bool, setErr func(error), log *slog.Logger) (stop func(), err error) {
	creds := insecure.NewCredentials()
	if !f.xdsPlaintext {
		tc, err := f.xdsTLS.clientConfig(f.xdsSAN)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(f.envoyXDS, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		envoyrls.WatchXDS(ctx, envoyrls.XDSOptions{
			Conn: conn, Node: &corev3.Node{Id: f.xdsNode}, Logger: log.With("xds", f.envoyXDS),
			Refused: func(_ string, err error) { es.loaded(err); setErr(err) },
			Apply: func(c *envoyrls.Config) error {
				if es.rules != nil {
					if err := c.Check(es.rules); err != nil {
						return err
					}
				}
				es.svc.SetConfig(c)
				es.loaded(nil)
				configured.Store(true)
				setErr(nil)
				return nil
			},
		})
	}()
	log.Info("following the envoyproxy/ratelimit configuration over xDS", "server", f.envoyXDS, "node", f.xdsNode)
	return func() {
		cancel()
		<-done
		conn.Close()
	}, nil
}

// withHealthPath answers GET path as envoyproxy/ratelimit answers
// /healthcheck: "OK" while /readyz is ready, its answer otherwise.
func withHealthPath(h http.Handler, path string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		r2 := r.Clone(r.Context())
		r2.URL.Path, r2.RequestURI = "/readyz", "/readyz"
		h.ServeHTTP(rec, r2)
		if rec.Code == http.StatusOK {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			io.WriteString(w, "OK")
			return
		}
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	})
}

// serveMetrics serves the metrics handler h on addr, at path, until stop.
func serveMetrics(addr, path string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+path, h)
	hs := server.HTTPServer(mux, log)
	go hs.Serve(ln)
	log.Info("serving metrics", "listen", "http://"+ln.Addr().String()+path)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		hs.Shutdown(ctx)
	}, nil
}

// parseCharge parses --envoy-charge (and ADMIT_CHARGE).
func parseCharge(s string) (envoyrls.Charge, error) {
	switch s {
	case "all":
		return envoyrls.ChargeAll, nil
	case "each":
		return envoyrls.ChargeEach, nil
	}
	return 0, fmt.Errorf("--envoy-charge %q: want all (a request's counters all charged or none) or each (every descriptor counted on its own, as envoyproxy/ratelimit does)", s)
}
