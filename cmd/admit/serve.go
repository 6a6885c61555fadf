package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/admitdev/admit/internal/server"
	"github.com/admitdev/admit/policy"
)

const serveUsage = `Usage: admit serve [flags]

Runs the decision API, the admin API, /healthz, /readyz and /metrics on one
HTTP address. Without --config it runs the built-in demo configuration
(admit config example prints it). Flags override the file. The admin token
comes from the configuration's server.admin_token or ADMIT_ADMIN_TOKEN;
without one the admin API answers loopback clients only.

The configuration file is reloaded when it changes (checked every
--reload-interval) and on SIGHUP; a file with errors is refused, the running
configuration kept, and the error logged and shown by /readyz.

Flags:
`

type serveFlags struct {
	config, http, grpc, store, dataDir, decisionLog string
	reloadEvery                                     time.Duration
}

func serve(ctx context.Context, args []string, e *env) int {
	fs := flag.NewFlagSet("admit serve", flag.ContinueOnError)
	var f serveFlags
	fs.StringVar(&f.config, "config", "", "configuration `file` (default: the built-in demo configuration)")
	fs.StringVar(&f.http, "http", "", "HTTP listen `address` (default :8080, or server.http)")
	fs.StringVar(&f.grpc, "grpc", "", "gRPC listen `address` for the Envoy rate limit service (default :8081, or server.grpc)")
	fs.StringVar(&f.store, "store", "", "store `URL`: memory, redis://host:port/db, redis+sentinel://master@h1:p,h2:p or redis+cluster://h1:p,h2:p (default: store.backend)")
	fs.StringVar(&f.dataDir, "data-dir", "./admit-data", "`directory` that keeps the tenant catalog's changes across restarts")
	fs.StringVar(&f.decisionLog, "decision-log", "", "append one JSON line per decision to `file` (\"-\" for standard output; default server.decision_log)")
	fs.DurationVar(&f.reloadEvery, "reload-interval", time.Second, "how often to check the configuration file for changes")
	if code, done := parseFlags(fs, serveUsage, args, e); done {
		return code
	}
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	if err := runServer(ctx, &f, e, log); err != nil {
		log.Error("admit serve: " + err.Error())
		return 2
	}
	return 0
}

// loadServeConfig loads the --config file, or the demo configuration.
func loadServeConfig(file string) (*Config, []byte, error) {
	if file == "" {
		cfg, err := ParseConfig("(built-in demo configuration)", demoConfig)
		return cfg, demoConfig, err
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := ParseConfig(file, data)
	return cfg, data, err
}

func runServer(ctx context.Context, f *serveFlags, e *env, log *slog.Logger) error {
	cfg, data, err := loadServeConfig(f.config)
	if err != nil {
		return fmt.Errorf("the configuration is invalid, not starting:\n%w", err)
	}
	httpAddr := first(f.http, cfg.Server.HTTP, ":8080")
	if g := first(f.grpc, cfg.Server.GRPC); g != "" {
		log.Warn("the Envoy rate limit service (gRPC) is not part of this build yet; not listening", "grpc", g)
	}
	st, err := openStore(ctx, f.store, cfg, f.dataDir)
	if err != nil {
		return err
	}
	defer st.close()
	backend := st.name

	catalog, err := policy.NewCatalog(ctx, cfg.Spec(), st.changes)
	if err != nil {
		return err
	}
	if st.check != nil {
		for _, r := range catalog.Policy().Rules() {
			if err := st.check(&r.Rule); err != nil {
				return fmt.Errorf("store %s: %w", st.name, err)
			}
		}
	}
	if st.watch != nil {
		// Another server's admin change reaches this one within a
		// moment: on its message, or at the latest at the next poll.
		go st.watch(ctx, 5*time.Second, func() {
			if err := catalog.Refresh(ctx); err != nil && ctx.Err() == nil {
				log.Warn("the shared tenant catalog could not be loaded; keeping the current one", "err", err)
			}
		})
	}
	token := first(cfg.Server.AdminToken, e.getenv("ADMIT_ADMIN_TOKEN"))
	var decisionLog io.Writer
	switch dl := first(f.decisionLog, cfg.Server.DecisionLog); dl {
	case "":
	case "-":
		decisionLog = e.stdout
	default:
		file, err := os.OpenFile(dl, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return fmt.Errorf("decision log: %w", err)
		}
		defer file.Close()
		decisionLog = file
	}
	srv := server.New(server.Options{
		Store: st.store, Catalog: catalog, AdminToken: token, Logger: log,
		DecisionLog: decisionLog, TenantMetrics: cfg.Server.TenantMetrics,
		Instances: cfg.Store.Instances, Stats: st.stats, Ready: st.ready, Health: st.health,
	})
	defer srv.Close()

	ln, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return err
	}
	hs := server.HTTPServer(srv, log)
	if token == "" {
		log.Warn("no admin token (ADMIT_ADMIN_TOKEN): the admin API answers loopback clients only")
	}
	cfgName := f.config
	if cfgName == "" {
		cfgName = "built-in demo"
	}
	log.Info("admit serving", "http", "http://"+ln.Addr().String(), "config", cfgName, "store", backend,
		"tenants", len(catalog.Policy().Tenants()), "data_dir", f.dataDir)
	if e.listening != nil {
		e.listening(ln.Addr().String())
	}

	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	reloadDone := make(chan struct{})
	reloadCtx, stopReload := context.WithCancel(ctx)
	go func() {
		defer close(reloadDone)
		if f.config != "" {
			watchConfig(reloadCtx, f, data, e.reload, catalog, srv, log)
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

// watchConfig reloads the configuration file when its content changes, on
// SIGHUP, and when reload says so. A bad file is refused; the running
// configuration stays.
func watchConfig(ctx context.Context, f *serveFlags, loaded []byte, reload <-chan struct{}, catalog *policy.Catalog, srv *server.Server, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	tick := time.NewTicker(f.reloadEvery)
	defer tick.Stop()
	last := loaded
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
		data, err := os.ReadFile(f.config)
		if err != nil {
			if forced || last != nil { // log a vanished file once, not every tick
				log.Error("configuration reload refused; keeping the running configuration", "err", err)
				srv.SetConfigError(err)
				last = nil
			}
			continue
		}
		if !forced && bytes.Equal(data, last) {
			continue
		}
		last = data
		cfg, err := ParseConfig(f.config, data)
		if err == nil {
			err = catalog.SetBase(cfg.Spec())
		}
		if err != nil {
			log.Error("configuration reload refused; keeping the running configuration", "err", strings.ReplaceAll(err.Error(), "\n", "; "))
			srv.SetConfigError(err)
			continue
		}
		srv.SetConfigError(nil)
		log.Info("configuration reloaded", "config", f.config, "tenants", len(catalog.Policy().Tenants()))
	}
}

// parseFlags parses a verb's flags. done says the command ends here: with
// exit 0 after --help (the usage goes to standard output), 2 on a bad flag
// or a stray argument.
func parseFlags(fs *flag.FlagSet, usage string, args []string, e *env) (code int, done bool) {
	fs.SetOutput(e.stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(e.stdout)
			fs.Usage()
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
