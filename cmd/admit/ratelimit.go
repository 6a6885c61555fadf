package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/internal/redishook"
)

const ratelimitUsage = `Usage: admit ratelimit

Runs admit serve configured as envoyproxy/ratelimit is: by its environment
variables, so that Admit replaces it where a platform starts it (Envoy
Gateway runs /bin/ratelimit with these variables; the image links
/bin/ratelimit to admit, and admit started under the name "ratelimit" runs
this command).

  PORT, HOST                      HTTP: /healthcheck, the API, and /metrics
                                  unless USE_PROMETHEUS serves them (8080)
  GRPC_PORT, GRPC_HOST            the rate limit service (8081)
  GRPC_SERVER_USE_TLS             serve gRPC over TLS with GRPC_SERVER_TLS_CERT
                                  and GRPC_SERVER_TLS_KEY; with
                                  GRPC_SERVER_TLS_CA_CERT, mutual TLS (clients
                                  named GRPC_CLIENT_TLS_SAN, if set)
  CONFIG_TYPE                     FILE: the YAML files of RUNTIME_ROOT/
                                  RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY;
                                  GRPC_XDS_SOTW: RateLimitConfig resources from
                                  CONFIG_GRPC_XDS_SERVER_URL as node
                                  CONFIG_GRPC_XDS_NODE_ID, over TLS when
                                  CONFIG_GRPC_XDS_SERVER_USE_TLS (client
                                  certificate CONFIG_GRPC_XDS_CLIENT_TLS_CERT
                                  and _KEY, CA CONFIG_GRPC_XDS_SERVER_TLS_CACERT,
                                  name CONFIG_GRPC_XDS_SERVER_TLS_SAN)
  FORCE_START_WITHOUT_INITIAL_CONFIG
                                  false: not ready until the first xDS
                                  configuration
  BACKEND_TYPE                    redis (memcache is refused)
  REDIS_TYPE, REDIS_URL, REDIS_AUTH
                                  SINGLE host:port, SENTINEL master,host:port,...
                                  or CLUSTER host:port,...; REDIS_AUTH is the
                                  password or user:password. Without REDIS_URL,
                                  the memory store (one server)
  REDIS_TLS                       reach Redis over TLS, checked with
                                  REDIS_TLS_CACERT (default the system's roots),
                                  with the client certificate
                                  REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY,
                                  and without the name check when
                                  REDIS_TLS_SKIP_HOSTNAME_VERIFICATION
  USE_STATSD, STATSD_HOST, STATSD_PORT, STATS_FLUSH_INTERVAL
                                  envoyproxy/ratelimit's statistics, under its
                                  names, to statsd over TCP (true,
                                  localhost:8125, every 10s: its defaults)
  USE_PROMETHEUS, PROMETHEUS_ADDR, PROMETHEUS_PATH
                                  instead, envoyproxy/ratelimit's statistics,
                                  named as its Prometheus mode names them, and
                                  Admit's own metrics, served there only,
                                  named by PROMETHEUS_MAPPER_YAML if set
  NEAR_LIMIT_RATIO                what near_limit counts (0.8)
  LIMIT_RESPONSE_HEADERS_ENABLED  add the limit, remaining and reset of the
                                  descriptor nearest its limit, as headers
                                  named LIMIT_LIMIT_HEADER,
                                  LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER
                                  (RateLimit-Limit, -Remaining, -Reset)
  RESPONSE_DYNAMIC_METADATA       the request, and the metadata of the
                                  descriptors it passed, in the response's
                                  dynamic metadata
  QUOTA_MODE                      every descriptor is a quota descriptor
                                  (domains counted each hit; a file's
                                  charge: all keeps its quota_mode lines)
  SHADOW_MODE                     answer OK to every request, counting those
                                  let through in global_shadow_mode
  LOG_LEVEL, LOG_FORMAT           debug, info, warn, error; text or json
  ADMIT_CONFIG                    an Admit configuration file (tenants, on_error,
                                  timeouts); default none
  ADMIT_ADMIN_TOKEN               the admin API's token
  ADMIT_DATA_DIR                  with the memory store, the directory that
                                  keeps the admin API's catalog changes and
                                  the usage records (locked: one server's);
                                  unset, ./admit-data is only read
  ADMIT_CHARGE                    each (the default): every descriptor's hits
                                  counted on its own, past its limit too, as
                                  envoyproxy/ratelimit counts; all: a request's
                                  counters all charged or none (admit serve's
                                  default); a file's charge: line wins
  ADMIT_REGION, ADMIT_HOME        this region's name and the URL of the home
                                  Redis the regions share: every limit then
                                  holds across the regions (admit serve
                                  --region, --home)
  ADMIT_QUOTA_ANSWERS             groups (the default): quota_mode answers as
                                  envoyproxy/ratelimit's main since spring
                                  2026 (a quota over answers OVER_LIMIT; the
                                  request is refused when every group of
                                  quotas, one per backend_name and
                                  model_name_override, is over); reported: as
                                  its main of 2026-01-22 (a quota over answers
                                  OK and never refuses)

Settings of envoyproxy/ratelimit's own implementation (pool sizes, local
caches, pipelining, jitter, the debug port) are accepted and not used.
 What Admit cannot do the same way is refused at start with the
variable's name: unix sockets, a separate per-second Redis, memcache.
`

// ratelimitCmd runs serve configured by envoyproxy/ratelimit's
// environment.
func ratelimitCmd(ctx context.Context, args []string, e *env) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
			fmt.Fprint(e.stdout, ratelimitUsage)
			return 0
		}
		fmt.Fprintf(e.stderr, "admit ratelimit takes no arguments; it is configured by environment variables\n\n%s", ratelimitUsage)
		return 2
	}
	f, log, err := ratelimitFlags(e.getenv, e.stderr)
	if err != nil {
		fmt.Fprintf(e.stderr, "admit ratelimit: %v\n", err)
		return 2
	}
	if err := runServer(ctx, f, e, log); err != nil {
		startFailed(log, e.stderr, "admit ratelimit", err)
		return 2
	}
	return 0
}

// ratelimitFlags turns envoyproxy/ratelimit's environment into serve's
// settings.
func ratelimitFlags(getenv func(string) string, stderr io.Writer) (*serveFlags, *slog.Logger, error) {
	get := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	boolean := func(name string, def bool) (bool, error) {
		v := getenv(name)
		if v == "" {
			return def, nil
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, fmt.Errorf("%s=%q: want true or false", name, v)
		}
		return b, nil
	}
	log, err := ratelimitLogger(get("LOG_LEVEL", "warn"), get("LOG_FORMAT", "text"), stderr)
	if err != nil {
		return nil, nil, err
	}
	f := &serveFlags{healthPath: "/healthcheck", xdsNode: getenv("CONFIG_GRPC_XDS_NODE_ID")}
	f.empty, f.config, f.dataDir = true, getenv("ADMIT_CONFIG"), get("ADMIT_DATA_DIR", "./admit-data")
	// As envoyproxy/ratelimit, the drop-in keeps nothing on disk unless
	// told where (it runs as nobody, in a directory it may not write).
	f.readsDataDir = getenv("ADMIT_DATA_DIR") == ""
	f.reloadEvery, f.reloadSettle = time.Second, time.Second
	// Counted as envoyproxy/ratelimit counts, unless asked for Admit's
	// all or nothing; a file's own charge: line wins.
	f.envoyCharge = get("ADMIT_CHARGE", "each")
	if _, err := parseCharge(f.envoyCharge); err != nil {
		return nil, nil, fmt.Errorf("ADMIT_CHARGE=%q: want each (as envoyproxy/ratelimit counts, the default) or all (a request's counters all charged or none)", f.envoyCharge)
	}
	f.http = net.JoinHostPort(get("HOST", "0.0.0.0"), get("PORT", "8080"))
	f.grpc = net.JoinHostPort(get("GRPC_HOST", "0.0.0.0"), get("GRPC_PORT", "8081"))

	if useTLS, err := boolean("GRPC_SERVER_USE_TLS", false); err != nil {
		return nil, nil, err
	} else if useTLS {
		f.grpcTLS.cert, f.grpcTLS.key, f.grpcTLS.ca = getenv("GRPC_SERVER_TLS_CERT"), getenv("GRPC_SERVER_TLS_KEY"), getenv("GRPC_SERVER_TLS_CA_CERT")
		f.grpcClientSAN = getenv("GRPC_CLIENT_TLS_SAN")
		if f.grpcTLS.cert == "" || f.grpcTLS.key == "" {
			return nil, nil, fmt.Errorf("GRPC_SERVER_USE_TLS needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
		}
	}

	switch ct := strings.ToUpper(get("CONFIG_TYPE", "FILE")); ct {
	case "FILE":
		f.envoyConfig = filepath.Join(get("RUNTIME_ROOT", "/srv/runtime_data/current"), getenv("RUNTIME_SUBDIRECTORY"), get("RUNTIME_APPDIRECTORY", "config"))
	case "GRPC_XDS_SOTW":
		f.envoyXDS = getenv("CONFIG_GRPC_XDS_SERVER_URL")
		if f.envoyXDS == "" {
			return nil, nil, fmt.Errorf("CONFIG_TYPE=GRPC_XDS_SOTW needs CONFIG_GRPC_XDS_SERVER_URL")
		}
		useTLS, err := boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)
		if err != nil {
			return nil, nil, err
		}
		f.xdsPlaintext = !useTLS
		f.xdsTLS.cert, f.xdsTLS.key, f.xdsTLS.ca = getenv("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"), getenv("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"), getenv("CONFIG_GRPC_XDS_SERVER_TLS_CACERT")
		f.xdsSAN = getenv("CONFIG_GRPC_XDS_SERVER_TLS_SAN")
		force, err := boolean("FORCE_START_WITHOUT_INITIAL_CONFIG", false)
		if err != nil {
			return nil, nil, err
		}
		f.waitForXDS = !force
	default:
		return nil, nil, fmt.Errorf("CONFIG_TYPE=%q: want FILE or GRPC_XDS_SOTW", ct)
	}

	if bt := strings.ToLower(get("BACKEND_TYPE", "redis")); bt != "redis" {
		return nil, nil, fmt.Errorf("BACKEND_TYPE=%q: Admit keeps its counters in Redis (or in memory, without REDIS_URL)", bt)
	}
	if on, err := boolean("REDIS_PERSECOND", false); err != nil {
		return nil, nil, err
	} else if on {
		return nil, nil, fmt.Errorf("REDIS_PERSECOND=true is not supported: Admit keeps every limit in one Redis")
	}
	redisTLS, err := boolean("REDIS_TLS", false)
	if err != nil {
		return nil, nil, err
	}
	skipHostname, err := boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false)
	if err != nil {
		return nil, nil, err
	}
	if st := strings.ToLower(get("REDIS_SOCKET_TYPE", "tcp")); st != "tcp" {
		return nil, nil, fmt.Errorf("REDIS_SOCKET_TYPE=%q: only tcp is supported", st)
	}
	if f.store, err = ratelimitStoreURL(getenv("REDIS_TYPE"), getenv("REDIS_URL"), getenv("REDIS_AUTH")); err != nil {
		return nil, nil, err
	}
	if redisTLS && f.store != "memory" {
		f.store = withTLS(f.store, url.Values{
			"tls_ca_file": {getenv("REDIS_TLS_CACERT")}, "tls_cert_file": {getenv("REDIS_TLS_CLIENT_CERT")},
			"tls_key_file": {getenv("REDIS_TLS_CLIENT_KEY")}, "tls_skip_hostname_verification": {strconv.FormatBool(skipHostname)},
		})
	}

	// Admit's own: limits held across regions (see admit serve --home).
	f.region, f.home, f.regionEnv = getenv("ADMIT_REGION"), getenv("ADMIT_HOME"), true
	if err := ratelimitStats(f, get, boolean); err != nil {
		return nil, nil, err
	}
	if on, err := boolean("LIMIT_RESPONSE_HEADERS_ENABLED", false); err != nil {
		return nil, nil, err
	} else if on {
		f.limitHeaders = &envoyrls.LimitHeaderNames{Limit: get("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
			Remaining: get("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"), Reset: get("LIMIT_RESET_HEADER", "RateLimit-Reset")}
	}
	if f.dynamicMetadata, err = boolean("RESPONSE_DYNAMIC_METADATA", false); err != nil {
		return nil, nil, err
	}
	if f.quotaAll, err = boolean("QUOTA_MODE", false); err != nil {
		return nil, nil, err
	}
	if f.globalShadow, err = boolean("SHADOW_MODE", false); err != nil {
		return nil, nil, err
	}
	f.envoyQuota = get("ADMIT_QUOTA_ANSWERS", "groups")
	if _, err := envoyrls.ParseQuotaAnswers(f.envoyQuota); err != nil {
		return nil, nil, fmt.Errorf("ADMIT_QUOTA_ANSWERS: %w", err)
	}
	return f, log, nil
}

// ratelimitStats sets where envoyproxy/ratelimit's statistics go, from
// its settings: statsd over TCP (its default), or Prometheus, which also
// serves Admit's own metrics.
func ratelimitStats(f *serveFlags, get func(name, def string) string, boolean func(name string, def bool) (bool, error)) error {
	statsd, err := boolean("USE_STATSD", true)
	if err != nil {
		return err
	}
	prom, err := boolean("USE_PROMETHEUS", false)
	if err != nil {
		return err
	}
	dog, err := boolean("USE_DOG_STATSD", false)
	if err != nil {
		return err
	}
	switch {
	case dog:
		return fmt.Errorf("USE_DOG_STATSD=true is not supported: use USE_STATSD (statsd over TCP) or USE_PROMETHEUS")
	case statsd && prom:
		return fmt.Errorf("USE_STATSD and USE_PROMETHEUS are both true: set one of them (as envoyproxy/ratelimit asks)")
	}
	u := &f.upstreamStats
	if u.nearLimit, err = strconv.ParseFloat(get("NEAR_LIMIT_RATIO", "0.8"), 64); err != nil || u.nearLimit < 0 || u.nearLimit > 1 {
		return fmt.Errorf("NEAR_LIMIT_RATIO=%q: want a number from 0 to 1", get("NEAR_LIMIT_RATIO", ""))
	}
	if statsd {
		port, err := strconv.Atoi(get("STATSD_PORT", "8125"))
		if err != nil || port <= 0 || port > 65535 {
			return fmt.Errorf("STATSD_PORT=%q: want a port number", get("STATSD_PORT", ""))
		}
		u.statsd = net.JoinHostPort(get("STATSD_HOST", "localhost"), strconv.Itoa(port))
		if u.every, err = time.ParseDuration(get("STATS_FLUSH_INTERVAL", "10s")); err != nil || u.every <= 0 {
			return fmt.Errorf("STATS_FLUSH_INTERVAL=%q: want a duration such as 10s", get("STATS_FLUSH_INTERVAL", ""))
		}
	}
	if prom {
		u.prometheus, u.mapperFile = true, get("PROMETHEUS_MAPPER_YAML", "")
		f.metrics, f.metricsPath = get("PROMETHEUS_ADDR", ":9090"), get("PROMETHEUS_PATH", "/metrics")
	}
	return nil
}

// ratelimitStoreURL is the --store URL of envoyproxy/ratelimit's Redis
// settings: "memory" without a URL.
func ratelimitStoreURL(kind, addrs, auth string) (string, error) {
	if addrs == "" {
		return "memory", nil
	}
	if strings.Contains(addrs, "://") {
		return addrs, nil // already a store URL
	}
	user := ""
	if auth != "" {
		if name, pass, ok := strings.Cut(auth, ":"); ok {
			user = url.UserPassword(name, pass).String() + "@"
		} else {
			user = url.UserPassword("", auth).String() + "@"
		}
	}
	switch strings.ToUpper(kind) {
	case "", "SINGLE":
		if strings.Contains(addrs, ",") {
			return "", fmt.Errorf("REDIS_URL=%q: REDIS_TYPE=SINGLE takes one host:port", redactAddrs(addrs, false))
		}
		return "redis://" + user + addrs, nil
	case "SENTINEL":
		master, sentinels, ok := strings.Cut(addrs, ",")
		if !ok || master == "" || sentinels == "" {
			return "", fmt.Errorf("REDIS_URL=%q: REDIS_TYPE=SENTINEL wants master-name,host:port[,host:port...]", redactAddrs(addrs, true))
		}
		if strings.Contains(master, ":") {
			return "", fmt.Errorf("REDIS_URL=%q: the master's name holds a \":\", as a password would: give the password in REDIS_AUTH", redactAddrs(addrs, true))
		}
		return "redis+sentinel://" + user + master + "@" + sentinels, nil
	case "CLUSTER":
		return "redis+cluster://" + user + addrs, nil
	}
	return "", fmt.Errorf("REDIS_TYPE=%q: want SINGLE, SENTINEL or CLUSTER", kind)
}

// redactAddrs returns envoyproxy/ratelimit's REDIS_URL, a list of
// host:port (after the master's name, for Sentinel), for an error
// message: an element that is not a host, host:port or (first, for
// Sentinel) a plain master's name — "mymaster:secret", "user:pw@host" —
// is "***".
func redactAddrs(addrs string, sentinel bool) string {
	parts := strings.Split(addrs, ",")
	for i, p := range parts {
		host, port, err := net.SplitHostPort(p)
		_, perr := strconv.Atoi(port)
		switch {
		case i == 0 && sentinel:
			if !redishook.PlainName(p) {
				parts[i] = "***"
			}
		case err == nil && perr == nil && redishook.PlainName(strings.NewReplacer(":", "", "[", "", "]", "").Replace(host)):
		case err != nil && redishook.PlainName(p):
		default:
			parts[i] = "***"
		}
	}
	return strings.Join(parts, ",")
}

// withTLS turns a redis… store URL into its rediss… form with the TLS
// settings of q that are set.
func withTLS(store string, q url.Values) string {
	for k, v := range q {
		if v[0] == "" || v[0] == "false" {
			delete(q, k)
		}
	}
	store = "rediss" + strings.TrimPrefix(store, "redis")
	if len(q) > 0 {
		store += "?" + q.Encode()
	}
	return store
}

// ratelimitLogger logs at LOG_LEVEL in LOG_FORMAT.
func ratelimitLogger(level, format string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	switch strings.ToLower(level) {
	case "trace", "debug":
		lv = slog.LevelDebug
	case "info":
		lv = slog.LevelInfo
	case "warn", "warning":
		lv = slog.LevelWarn
	case "error", "fatal", "panic":
		lv = slog.LevelError
	default:
		return nil, fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("LOG_FORMAT=%q: want text or json", format)
}
