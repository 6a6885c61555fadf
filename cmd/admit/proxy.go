package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/internal/server"
	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/policy"
)

const proxyUsage = `Usage: admit proxy [--upstream URL] [flags]

A rate limiting reverse proxy: every request is identified (API key, JWT or
user header, client IP behind server.trusted_proxies), decided against the
configuration's rules, and forwarded to the upstream only when admitted.
Refusals are 429 with RateLimit headers and Retry-After, and never reach
the upstream. Streaming responses and WebSocket upgrades pass through.
With a shedding section, admitted requests then pass an adaptive
concurrency limit that protects the upstream: past it they wait briefly,
then are answered 503 with Retry-After, sheddable ones first.

With an llm section naming providers, the proxy meters LLM calls: OpenAI's
/v1/chat/completions, /v1/responses, /v1/completions and /v1/embeddings,
Anthropic's /v1/messages and Gemini's generateContent and
streamGenerateContent go to their provider with the tenant's key replaced
by the platform's, within the rules in tokens and money (reserved before,
settled to the reported usage after); --upstream is then optional and
serves every other path. --metrics then also serves /v1/llm/usage (every
tenant and model's tokens by kind and cost; with ?tenant=, by day, from
the store every proxy adds to; only with the admin token, ADMIT_ADMIN_TOKEN,
as Authorization: Bearer, or without one to callers on this host) and
/dashboard (a page of it).

An API key (X-API-Key or Authorization: Bearer) is required unless
--keys-optional is given; then requests without one are anonymous and are
charged the global rules only. The configuration is reloaded like admit
serve's (the http and server sections take effect at the next start).
Decisions are traced over OTLP as admit serve's are (OTEL_* variables,
docs/traces.md).

Flags:
`

type proxyFlags struct {
	backendFlags
	upstream, listen string
	metrics          string
	keysOptional     bool
	bodyTimeout      time.Duration
	bodyDeadline     time.Duration
	writeTimeout     time.Duration
	llmRecords       string
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
	fs.DurationVar(&f.bodyDeadline, "body-deadline", 2*time.Minute, "the longest a request body may take in all, from the request's headers (0: no bound)")
	fs.DurationVar(&f.writeTimeout, "write-timeout", time.Minute, "the longest a write of a response may wait for the client to take it (0: no bound)")
	fs.StringVar(&f.llmRecords, "llm-records", "", "append a JSON line per settled LLM call (a billing record) to this `file`")
	if code, done := parseFlags(fs, proxyUsage, args, e); done {
		return code
	}
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	if err := runProxy(ctx, &f, e, log); err != nil {
		startFailed(log, e.stderr, "admit proxy", err)
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
	if f.bodyTimeout < 0 || f.bodyDeadline < 0 || f.writeTimeout < 0 {
		return fmt.Errorf("--body-timeout, --body-deadline and --write-timeout must not be negative (0: no bound)")
	}
	f.readsDataDir = true
	tp, stopTracing, err := startTracing(ctx, e, log)
	if err != nil {
		return err
	}
	defer stopTracing() // last, after the server drained
	b, err := openBackend(ctx, &f.backendFlags, log)
	if err != nil {
		return err
	}
	defer b.close()
	llmOn := len(b.cfg.LLM.Providers) > 0
	var upstream *url.URL
	if f.upstream != "" || !llmOn {
		if upstream, err = parseUpstream(f.upstream); err != nil {
			return err
		}
	}
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
	decider := policy.NewDecider(b.st.store, b.cfg.Store.Instances)
	decider.EnforceBans(b.bans)
	defer decider.Close()
	decider.Trace(tp, b.st.kind())
	opts.Decider, opts.Instances, opts.Policy, opts.Logger = decider, b.cfg.Store.Instances, b.catalog.Policy, log
	opts.TracerProvider, opts.FrontEnd = tp, "proxy"
	opts.RequireKey = !f.keysOptional
	lim, err := httplimit.New(opts)
	if err != nil {
		return err
	}
	defer lim.Close()
	var handler http.Handler
	if upstream != nil {
		handler = lim.Handler(httplimit.ReverseProxy(upstream, opts.TrustedProxies, opts.ForwardedHeader, log))
	}
	metrics, metricsReg := http.NewServeMux(), prometheus.NewRegistry()
	metricsReg.MustRegister(lim.ShedCollector(), b.bans.Collector())
	metrics.Handle("GET /metrics", promhttp.HandlerFor(metricsReg, promhttp.HandlerOpts{}))
	if llmOn {
		h, meter, closeRecords, err := llmHandler(&b.cfg.LLM, f.llmRecords, decider, b.catalog.Policy, lim, handler, b.st.llmUsage, log)
		if err != nil {
			return err
		}
		defer closeRecords()
		flushCtx, stopFlush := context.WithCancel(context.WithoutCancel(ctx))
		flushed := make(chan struct{})
		go func() { meter.FlushEvery(flushCtx, time.Second); close(flushed) }()
		defer func() { stopFlush(); <-flushed }()
		handler = h
		metricsReg.MustRegister(meter)
		token := first(b.cfg.Server.AdminToken, e.getenv("ADMIT_ADMIN_TOKEN"))
		metrics.Handle("GET /v1/llm/usage", meter.UsageHandler(token))
		metrics.Handle("GET /dashboard", llm.DashboardHandler())
	}
	if f.metrics != "" {
		stop, err := serveMetrics(f.metrics, "/", metrics, log)
		if err != nil {
			return fmt.Errorf("--metrics: %w", err)
		}
		defer stop()
	}
	tcp, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	ln := httpListener(tcp, &b.cfg.Server, opts.TrustedProxies)
	metricsReg.MustRegister(httpConnMetrics(ln)...)
	hs := &http.Server{
		Handler: httplimit.Forwardable(httplimit.WriteTimeout(httplimit.BodyTimeout(handler, f.bodyTimeout, f.bodyDeadline), f.writeTimeout)),
		// No read or write deadline: streams and WebSockets last as long
		// as they last. Headers must arrive promptly, bodies without
		// pauses longer than --body-timeout and within --body-deadline,
		// and each write of a response must be taken within
		// --write-timeout.
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    server.MaxHeaderBytes,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	up := ""
	if upstream != nil {
		up = upstream.String()
	}
	log.Info("admit proxy serving", "listen", "http://"+ln.Addr().String(), "upstream", up, "llm", llmOn,
		"store", b.st.name, "keys_required", opts.RequireKey)
	return b.run(ctx, hs, ln, e, reloading{file: f.config, every: f.reloadEvery, settle: f.reloadSettle, setErr: func(error) {}, log: log})
}

// llmHandler builds the LLM front end of admit proxy from the llm
// section: next serves the other paths (nil: 404).
func llmHandler(c *LLMConfig, recordsFile string, decider *policy.Decider, pol func() *policy.Policy, lim *httplimit.Limiter,
	next http.Handler, usage llm.UsageStore, log *slog.Logger) (http.Handler, *llm.Meter, func(), error) {
	ups, err := c.upstreams()
	if err != nil {
		return nil, nil, nil, err // validated with the configuration
	}
	prices, err := c.prices()
	if err != nil {
		return nil, nil, nil, err
	}
	closeRecords := func() {}
	var records io.Writer
	if recordsFile != "" {
		fh, err := os.OpenFile(recordsFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--llm-records: %w", err)
		}
		records, closeRecords = fh, func() { fh.Close() }
	}
	meter := llm.NewMeter(llm.MeterOptions{Currency: c.Currency, Records: records, Store: usage, Logger: log})
	gate, err := llm.NewGate(llm.GateOptions{
		Decider: decider, Policy: pol, Prices: prices,
		DefaultMaxOutput: c.DefaultMaxOutput, MinOutput: c.MinOutput, LowerMaxOutput: c.LowerMaxOutput,
		Record: meter.Record, Logger: log,
	})
	if err != nil {
		closeRecords()
		return nil, nil, nil, err
	}
	drain, _ := c.drain() // validated with the configuration
	h := llm.NewHandler(llm.HandlerOptions{
		Gate: gate, Upstreams: ups, Identify: lim.Identify, Next: next, MaxBody: c.MaxBody, Drain: drain, Logger: log,
	})
	return h, meter, closeRecords, nil
}
