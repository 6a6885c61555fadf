package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/internal/server"
)

const proxyUsage = `Usage: admit proxy --upstream URL [flags]

A rate limiting reverse proxy: every request is identified (API key, JWT or
user header, client IP behind server.trusted_proxies), decided against the
configuration's rules, and forwarded to the upstream only when admitted.
Refusals are 429 with RateLimit headers and Retry-After, and never reach
the upstream. Streaming responses and WebSocket upgrades pass through.
With a shedding section, admitted requests then pass an adaptive
concurrency limit that protects the upstream: past it they wait briefly,
then are answered 503 with Retry-After, sheddable ones first.

An API key (X-API-Key or Authorization: Bearer) is required unless
--keys-optional is given; then requests without one are anonymous and are
charged the global rules only. The configuration is reloaded like admit
serve's (the http and server sections take effect at the next start).

Flags:
`

type proxyFlags struct {
	backendFlags
	upstream, listen string
	metrics          string
	keysOptional     bool
	bodyTimeout      time.Duration
}

func proxy(ctx context.Context, args []string, e *env) int {
	fs := flag.NewFlagSet("admit proxy", flag.ContinueOnError)
	var f proxyFlags
	fs.StringVar(&f.upstream, "upstream", "", "the upstream `URL` requests are forwarded to (required)")
	fs.StringVar(&f.listen, "listen", ":8090", "listen `address`")
	f.register(fs)
	fs.BoolVar(&f.keysOptional, "keys-optional", false, "admit requests without an API key as anonymous (global rules only)")
	fs.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics (the shedding groups') at this `address`'s /metrics")
	fs.DurationVar(&f.bodyTimeout, "body-timeout", 30*time.Second, "the longest a request body may go without sending data (0: no bound)")
	if code, done := parseFlags(fs, proxyUsage, args, e); done {
		return code
	}
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	if err := runProxy(ctx, &f, e, log); err != nil {
		log.Error("admit proxy: " + err.Error())
		return 2
	}
	return 0
}

// parseUpstream checks an upstream URL: http or https, with a host.
func parseUpstream(s string) (*url.URL, error) {
	if s == "" {
		return nil, fmt.Errorf("--upstream is required")
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--upstream %q: want an http:// or https:// URL with a host", s)
	}
	return u, nil
}

func runProxy(ctx context.Context, f *proxyFlags, e *env, log *slog.Logger) error {
	upstream, err := parseUpstream(f.upstream)
	if err != nil {
		return err
	}
	b, err := openBackend(ctx, &f.backendFlags, log)
	if err != nil {
		return err
	}
	defer b.close()
	unreachable, err := b.cfg.CheckProxyActions()
	if err != nil {
		return fmt.Errorf("the configuration is invalid for admit proxy, not starting:\n%w", err)
	}
	if len(unreachable) > 0 {
		log.Warn("admit proxy: no http.actions route produces the actions of these rules, so the proxy never applies them", "rules", unreachable)
	}
	b.check = func(c *Config) error { _, err := c.CheckProxyActions(); return err }
	opts, err := httpOptions(b.cfg)
	if err != nil {
		return err // validated with the configuration
	}
	opts.Store, opts.Instances, opts.Policy, opts.Logger = b.st.store, b.cfg.Store.Instances, b.catalog.Policy, log
	opts.RequireKey = !f.keysOptional
	lim, err := httplimit.New(opts)
	if err != nil {
		return err
	}
	defer lim.Close()
	if f.metrics != "" {
		stop, err := serveMetrics(f.metrics, "/metrics", shedMetrics(lim), log)
		if err != nil {
			return fmt.Errorf("--metrics: %w", err)
		}
		defer stop()
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	hs := &http.Server{
		Handler: httplimit.BodyTimeout(lim.Handler(httplimit.ReverseProxy(upstream, opts.TrustedProxies, opts.ForwardedHeader, log)), f.bodyTimeout),
		// No read or write deadline: streams and WebSockets last as long
		// as they last. Headers must arrive promptly, bodies without
		// pauses longer than --body-timeout.
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    server.MaxHeaderBytes,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("admit proxy serving", "listen", "http://"+ln.Addr().String(), "upstream", upstream.String(),
		"store", b.st.name, "keys_required", opts.RequireKey)
	return b.run(ctx, hs, ln, e, reloading{file: f.config, every: f.reloadEvery, setErr: func(error) {}, log: log})
}
