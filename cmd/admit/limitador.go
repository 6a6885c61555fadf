package main

import (
	"context"
	"crypto/sha256"
	"net/http"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/limitador"
	"github.com/admitdev/admit/limitador/kuadrantpb"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/yamlconf"
)

// limitadorService is the running Limitador drop-in: its limits,
// reloaded from their file, decided over the server's Decider.
type limitadorService struct {
	file    string
	check   func(*admit.Rule) error // the store's check of a rule, if any
	lim     *limitador.Limiter
	svc     *limitador.Service
	metrics *limitador.Metrics
	cfg     LimitadorConfig
}

// startLimitador loads the limits file and makes the limiter and the
// services over dec.
func startLimitador(file string, cfg LimitadorConfig, dec *policy.Decider, check func(*admit.Rule) error, shared limitador.SharedIndex) (*limitadorService, error) {
	ls := &limitadorService{file: file, check: check, cfg: cfg, metrics: limitador.NewMetrics(cfg.LimitNameInLabels)}
	limits, err := ls.load()
	if err != nil {
		return nil, err
	}
	headers, err := limitador.ParseHeaders(cfg.RateLimitHeaders)
	if err != nil {
		return nil, err // validated with the configuration
	}
	ls.lim, err = limitador.New(limitador.Options{Decider: dec, Limits: limits, Metrics: ls.metrics, Shared: shared})
	if err != nil {
		return nil, err
	}
	ls.svc = limitador.NewService(ls.lim, headers)
	return ls, nil
}

// load reads and checks the limits file: every rule must be one the
// store decides.
func (ls *limitadorService) load() (*limitador.Limits, error) {
	data, err := yamlconf.ReadFile(ls.file, limitador.MaxFileSize)
	if err != nil {
		return nil, yamlconf.Errors{{File: ls.file, Msg: err.Error()}}
	}
	limits, err := limitador.ParseWith(ls.file, data, limitador.ParseOptions{Distribution: ls.cfg.Distribution})
	if err != nil {
		return nil, err
	}
	if ls.check != nil {
		var errs yamlconf.Errors
		for _, l := range limits.All() {
			if !l.Stored() {
				continue
			}
			if err := ls.check(l.Rule()); err != nil {
				msg := err.Error()
				if i := strings.Index(msg, ": "); i >= 0 && strings.HasPrefix(msg, "rule ") {
					msg = msg[i+2:]
				}
				errs = append(errs, yamlconf.Error{File: ls.file, Line: l.Line, Col: 3, Msg: msg})
			}
		}
		if len(errs) > 0 {
			return nil, errs
		}
	}
	return limits, nil
}

// registerKuadrant serves Kuadrant's RPCs on r.
func (ls *limitadorService) registerKuadrant(r grpc.ServiceRegistrar) {
	kuadrantpb.RegisterRateLimitServiceServer(r, ls.svc)
}

// handler returns Limitador's HTTP API, or nil when it is off; trusted
// says whether a request comes from the platform (server.Server.Trusted).
func (ls *limitadorService) handler(trusted func(*http.Request) bool) http.Handler {
	opts := limitador.HandlerOptions{}
	switch ls.cfg.HTTPAPI {
	case "off":
		return nil
	case "open":
	default:
		opts.Authorize = trusted
		opts.Denied = "Limitador's HTTP API answers the platform only: send Authorization: Bearer <service or admin token>, or call it from this host directly; limitador.http_api: open opens it to anyone, as Limitador's own port is"
	}
	return limitador.Handler(ls.lim, opts)
}

// watch reloads the limits file when it changes and the change has
// settled, and on SIGHUP. A file with an error is refused and the limits
// in force kept; GET /status counts the refusals since the last load.
func (ls *limitadorService) watch(ctx context.Context, rl reloading) {
	log := rl.log
	onSettledChange(ctx, rl, nil, func() [sha256.Size]byte { return fileDigest(ls.file) }, func() {
		limits, err := ls.load()
		if err != nil {
			ls.lim.LoadFailed()
			log.Error("limitador limits reload refused; keeping the running limits", "file", ls.file, "err", strings.ReplaceAll(err.Error(), "\n", "; "))
			return
		}
		ls.lim.SetLimits(limits)
		for _, w := range limits.Warnings {
			log.Warn("limitador limits", "warning", w)
		}
		log.Info("limitador limits reloaded", "file", ls.file, "limits", len(limits.All()), "namespaces", strings.Join(limits.Namespaces(), ","))
	})
}

// fileDigest hashes a file's content and its modification time, or the
// error reading it. The time tells apart two writes caught at the same
// cut, which read the same: a file rewritten in place, in two writes,
// more often than the settle period would otherwise look settled on its
// first half.
func fileDigest(name string) [sha256.Size]byte {
	h := sha256.New()
	if fi, err := os.Stat(name); err == nil {
		h.Write([]byte(fi.ModTime().Format(time.RFC3339Nano)))
	}
	data, err := yamlconf.ReadFile(name, limitador.MaxFileSize)
	if err != nil {
		h.Write([]byte(err.Error()))
	}
	h.Write(data)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
