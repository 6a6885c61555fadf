package main

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/internal/server"
	"github.com/admitdev/admit/policy"
)

// envoyService is the running Envoy rate limit service and what reloads its
// envoyproxy/ratelimit configuration.
type envoyService struct {
	svc   *envoyrls.Service
	srv   *envoyrls.Server
	ln    net.Listener
	dir   string
	rules func(*admit.Rule) error // the store's check of a rule, if any
	done  chan error
}

// startEnvoy loads the envoyproxy/ratelimit files of dir (if any), then
// serves the Envoy rate limit service on addr.
func startEnvoy(addr, dir string, b *backend, dec *policy.Decider, srv *server.Server) (*envoyService, error) {
	es := &envoyService{dir: dir, rules: b.st.check, done: make(chan error, 1)}
	var cfg *envoyrls.Config
	if dir != "" {
		c, err := es.load()
		if err != nil {
			return nil, err
		}
		cfg = c
	}
	svc, err := envoyrls.New(envoyrls.Options{
		Decider: dec, Policy: b.catalog.Policy, CatalogDomain: b.cfg.Envoy.Domain, Config: cfg,
		ResponseHeaders: b.cfg.Envoy.ResponseHeaders, DynamicMetadata: b.cfg.Envoy.DynamicMetadata, Observe: func(ev envoyrls.Event) { srv.ObserveGRPC(ev.Allowed, ev.Outcome, ev.Err, ev.Took) },
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	es.svc, es.ln = svc, ln
	es.srv = envoyrls.NewServer(svc, b.st.ready)
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
// (checked every interval), on SIGHUP, and when reload says so. A set of
// files with an error is refused and the running configuration kept, like
// Admit's own configuration.
func (es *envoyService) watch(ctx context.Context, every time.Duration, reload <-chan struct{}, setErr func(error), log *slog.Logger) {
	last := dirDigest(es.dir)
	onReloadSignal(ctx, every, reload, func(forced bool) {
		d := dirDigest(es.dir)
		if !forced && d == last {
			return
		}
		last = d
		c, err := es.load()
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

// dirDigest hashes the names and contents of dir's YAML files, so that any
// change to them (an edit, a new file, a removal) is seen.
func dirDigest(dir string) [sha256.Size]byte {
	h := sha256.New()
	names, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	sort.Strings(names)
	for _, n := range names {
		data, err := os.ReadFile(n)
		h.Write([]byte(n))
		h.Write([]byte{0})
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
