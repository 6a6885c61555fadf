package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/envoyrls/redisquota"
	"github.com/admitdev/admit/idempotency"
	"github.com/admitdev/admit/idempotency/redisidem"
	"github.com/admitdev/admit/internal/server"
	"github.com/admitdev/admit/limitador"
	"github.com/admitdev/admit/limitador/rediscounters"
	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/llm/redisllm"
	"github.com/admitdev/admit/memstore"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/catalog"
	"github.com/admitdev/admit/policy/catalog/redischanges"
	"github.com/admitdev/admit/policy/redisbans"
	"github.com/admitdev/admit/policy/top"
	"github.com/admitdev/admit/policy/top/redistop"
	"github.com/admitdev/admit/policy/usage"
	"github.com/admitdev/admit/policy/usage/redisusage"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/wsgateway"
	"github.com/admitdev/admit/wsgateway/redissessions"
)

// openedStore is the store a server decides against, with what the server
// reports about it and where the tenant catalog's changes are kept.
type openedStore struct {
	name    string
	store   admit.Store
	changes catalog.Store
	stats   func() server.StoreStats
	ready   func(context.Context) error
	health  func() server.StoreHealth
	watch   func(ctx context.Context, poll time.Duration, changed func() error)
	check   func(*admit.Rule) error // whether the store can decide a rule
	// sessions keeps the WebSocket gateway's sessions: in this process
	// with the memory store, shared in Redis with the Redis store.
	sessions wsgateway.Sessions
	// usage keeps the quotas' usage records, the same way; llmUsage the
	// LLM calls' usage by tenant, model and day.
	usage    usage.Store
	llmUsage llm.UsageStore
	// idem keeps the idempotency keys of the decision API: nil (this
	// process) with the memory store, shared in Redis with Redis.
	idem idempotency.Store
	// anonIdem keeps anonymous callers' keys, per address.
	anonIdem idempotency.Store
	// quota keeps the Envoy quota service's ledgers: in this process with
	// the memory store, shared in Redis with Redis.
	quota envoyrls.QuotaLedger
	// bans keeps the bans: in this process (and dataDir) with the memory
	// store, shared in Redis with Redis.
	bans policy.BanStore
	// top keeps every server's sketches of the heaviest callers: nil
	// (this server's alone) with the memory store, Redis with Redis.
	top top.Shared
	// counters lists the Limitador counters every server charged: nil
	// with the memory store, whose counters are this process's.
	counters limitador.SharedIndex
	close    func()
	// home says the store is one region of limits held across regions.
	home bool
}

// kind names the store in traces: "memory" or "redis".
func (st *openedStore) kind() string {
	if st.name == "memory" {
		return "memory"
	}
	return "redis"
}

// spec returns cfg's policy as the store decides it: a rule the store
// cannot decide is the policy's error, whether it comes from cfg, a reload
// or the admin API.
func (st *openedStore) spec(cfg *Config) *policy.Spec {
	spec := cfg.Spec()
	spec.CheckRule = func(r *admit.Rule, fair bool) error {
		if st.check != nil {
			if err := st.check(r); err != nil {
				return err
			}
		}
		if st.home && fair {
			err := admit.Errorf(admit.CodeInvalid, "rule %q: fair shares of a limit tenants share are not held across regions yet; set fair_share: false", r.Name)
			err.Field = "fair_share"
			return err
		}
		return nil
	}
	return spec
}

// openStore opens the store that --store (url) or the config's store
// section names: the memory store, with the catalog's changes and the
// usage records in files under dataDir (which it locks, if it owns it:
// otherwise it only reads the catalog there), or Redis, which then also
// holds the catalog and the records.
// memoryBans returns the memory store's bans: journaled in dataDir when
// the server owns it, so that they and their history survive a restart.
func memoryBans(dataDir string, owns bool) *policy.MemoryBans {
	if !owns {
		return &policy.MemoryBans{}
	}
	return &policy.MemoryBans{Path: filepath.Join(dataDir, "bans.jsonl")}
}

// anonymousKeys is the bound of an anonymous address's idempotency keys:
// a tenth of a tenant's (server.idempotency_keys_per_tenant), at least 1.
func anonymousKeys(cfg *Config) int {
	n := cfg.Server.IdempotencyKeysPerTenant
	if n == 0 {
		n = idempotency.DefaultKeysPerScope
	}
	return max(n/10, 1)
}

func openStore(ctx context.Context, url string, cfg *Config, dataDir string, ownsDataDir bool, log *slog.Logger) (*openedStore, error) {
	rc, isRedis, err := redisConfig(url, cfg)
	if err != nil {
		return nil, err
	}
	if !isRedis && cfg.Store.Home != "" {
		return nil, fmt.Errorf("a home (--home or store.home) needs the region's own Redis as the store: --store redis://… or store.backend: redis")
	}
	if !isRedis {
		var records usage.Store = usage.NewMemory(cfg.Usage.KeepPeriods, cfg.Usage.MaxRecords)
		release := func() {}
		if ownsDataDir {
			// The catalog's changes and the usage records are saved in
			// dataDir: one server's.
			unlock, err := lockDataDir(dataDir)
			if err != nil {
				return nil, err
			}
			fu, err := usage.OpenFile(filepath.Join(dataDir, "usage.jsonl"), cfg.Usage.KeepPeriods, cfg.Usage.MaxRecords)
			if err != nil {
				unlock()
				return nil, err
			}
			records, release = fu, func() { fu.Close(); unlock() }
		}
		m := memstore.New(&memstore.Options{MaxKeys: int(cfg.Store.MaxKeys)})
		sessions := wsgateway.NewMemorySessions(nil)
		sessions.SetMaxSessions(int(cfg.Gateway.MaxSessions))
		return &openedStore{
			name: "memory", store: m,
			changes: &catalog.FileStore{Path: filepath.Join(dataDir, "catalog.json")},
			bans:    memoryBans(dataDir, ownsDataDir),
			stats: func() server.StoreStats {
				st := m.Stats()
				return server.StoreStats{Keys: st.Keys, Evictions: st.Evictions, Expirations: st.Expirations, Leases: st.Leases}
			},
			sessions: sessions,
			usage:    records,
			llmUsage: llm.NewMemoryUsage(0, cfg.Usage.MaxRecords),
			idem:     idempotency.NewMemory(cfg.Server.IdempotencyKeysPerTenant, 0),
			anonIdem: idempotency.NewMemory(anonymousKeys(cfg), idempotency.MaxKeys/10),
			close:    func() { m.Close(); release() },
		}, nil
	}
	timeout := 50 * time.Millisecond
	if cfg.Store.Redis.Timeout != "" {
		timeout, _ = time.ParseDuration(cfg.Store.Redis.Timeout) // validated with the config
	}
	dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// Every decision of a server is one tenant's (policy.Request has
	// one), so a lease or reservation id names at most that tenant's
	// group and the global one: an id naming more is made up, and is
	// refused without a command.
	opts := &redisstore.Options{Timeout: timeout, TenantsPerDecision: 1}
	var home *redisstore.Store
	if cfg.Store.Home != "" {
		hc, err := redisstore.ParseURL(cfg.Store.Home)
		if err != nil {
			return nil, fmt.Errorf("store.home: %w", err)
		}
		// Calls to the home are made in the background and cross
		// regions: they get the time a round trip across the world
		// takes, not a decision's.
		if home, err = redisstore.DialLazy(hc, &redisstore.Options{Timeout: 2 * time.Second}); err != nil {
			return nil, fmt.Errorf("store.home %s: %w", hc, err)
		}
		opts.Home, opts.Region = home, cfg.Store.Region
		if cfg.Store.WhenCut == "on_error" {
			opts.Cut = redisstore.FailWhenCut
		}
	}
	closeHome := func() {
		if home != nil {
			home.Close()
		}
	}
	r, err := redisstore.Dial(dialCtx, rc, opts)
	if err != nil && admit.ErrorCode(err) == admit.CodeUnavailable {
		// Start anyway: decide by on_error until Redis answers, rather
		// than stay down with it.
		var openErr error
		if r, openErr = redisstore.DialLazy(rc, opts); openErr == nil {
			log.Error("Redis does not answer at start; serving anyway, deciding by on_error until it does", "store", rc.String(), "err", err)
			err = nil
		}
	}
	if err != nil {
		closeHome()
		return nil, fmt.Errorf("store %s: %w", rc, err)
	}
	if p := r.Health().Evicts; p != "" {
		log.Warn("Redis may evict keys (maxmemory-policy "+p+"): an evicted key resets its limit and forgets its idempotency answers; set maxmemory-policy noeviction, or maxmemory 0", "store", rc.String())
	}
	check := redisstore.CheckRule
	name := "redis " + rc.String()
	stopWatch := func() {}
	if home != nil {
		check = redisstore.CheckRegionRule
		name += ", region " + cfg.Store.Region + " of home " + home.String()
		stopWatch = watchHome(r, log)
	}
	catalog := redischanges.New(r)
	sessions := redissessions.New(r)
	return &openedStore{
		name: name, store: r, home: home != nil,
		changes: catalog, watch: catalog.Watch, check: check,
		ready: r.Ping,
		health: func() server.StoreHealth {
			h := r.Health()
			sh := server.StoreHealth{
				Breaker: h.Breaker, Calls: h.Calls, Failures: h.Failures, UndoFailures: h.UndoFailures,
				Decisions: h.Decisions, LocalDecisions: h.LocalDecisions, LocalRefusals: h.LocalRefusals, Withdrawals: h.Withdrawals,
				Withdrawn: h.Withdrawn, Refunded: h.Refunded, Expired: h.Expired, Lost: h.Lost,
			}
			if rg, ok := r.Region(); ok {
				sh.Region = &server.RegionHealth{Name: rg.Region, Held: rg.Held, Share: rg.Share, HomeCalls: rg.HomeCalls,
					HomeFailures: rg.HomeFailures, Granted: rg.Granted, GivenBack: rg.GivenBack,
					RoundTripMS: float64(rg.RTT.Microseconds()) / 1000, Cut: rg.Cut, LastError: rg.LastError}
			}
			return sh
		},
		sessions: sessions,
		quota:    redisquota.New(r),
		bans:     redisbans.New(r),
		top:      redistop.New(r),
		counters: rediscounters.New(r),
		usage:    redisusage.New(r, cfg.Usage.KeepPeriods),
		llmUsage: redisllm.New(r, 0),
		idem:     redisidem.New(r, cfg.Server.IdempotencyKeysPerTenant),
		anonIdem: redisidem.New(r, anonymousKeys(cfg)),
		close:    func() { stopWatch(); sessions.Close(); r.Close(); closeHome() },
	}, nil
}

// watchHome logs the errors of a region's calls to its home when they
// change (a home that evicts keys is refused, every call, until fixed),
// and when they stop; it returns the function that stops it.
func watchHome(r *redisstore.Store, log *slog.Logger) (stop func()) {
	done := make(chan struct{})
	go func() {
		last := ""
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			h, _ := r.Region()
			switch {
			case h.LastError != "" && h.LastError != last:
				log.Error("the region cannot get its limits from the home Redis; it refuses (or applies on_error) once it has spent what it holds", "region", h.Region, "err", h.LastError)
			case h.LastError == "" && last != "":
				log.Info("the home Redis answers the region again", "region", h.Region)
			}
			last = h.LastError
		}
	}()
	return func() { close(done) }
}

// redisConfig returns the Redis deployment --store or the config names, and
// whether it names one at all.
func redisConfig(url string, cfg *Config) (redisstore.Config, bool, error) {
	switch {
	case url == "memory" || (url == "" && cfg.Store.Backend != "redis"):
		return redisstore.Config{}, false, nil
	case url != "":
		if !strings.HasPrefix(url, "redis") {
			return redisstore.Config{}, false, fmt.Errorf("--store %q: want memory, redis://host:port/db, redis+sentinel://master@h1:p,h2:p or redis+cluster://h1:p,h2:p (rediss… for TLS)", redisstore.Redact(url))
		}
		c, err := redisstore.ParseURL(url)
		return c, true, err
	}
	r := cfg.Store.Redis
	c := redisstore.Config{Mode: redisstore.Mode(first(r.Mode, "standalone")), Addrs: r.Addrs, MasterName: r.MasterName,
		Username: r.Username, Password: r.Password}
	if t := r.TLS; t != nil && t.Enabled {
		c.TLS = &redisstore.TLS{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName, SkipHostnameVerification: t.SkipHostnameVerification}
	}
	if len(c.Addrs) == 0 {
		c.Addrs = []string{"127.0.0.1:6379"}
	}
	return c, true, nil
}
