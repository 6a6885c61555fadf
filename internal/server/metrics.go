package server

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/policy"
)

// metrics are the server's Prometheus metrics. Label values come from the
// configuration (tiers, rules) or from small fixed sets, never from
// requests, so their cardinality is bounded; the tenant label is opt-in,
// and its series are kept apart from the others (see Server.MetricsHandler).
type metrics struct {
	decisions          *prometheus.CounterVec // per charge: tier, rule, result
	requests           *prometheus.CounterVec // per request: endpoint, result
	tenants            *prometheus.CounterVec // opt-in: tenant, result
	latency            *prometheus.HistogramVec
	errors             *prometheus.CounterVec
	reloads            *prometheus.CounterVec
	envoyReloads       *prometheus.CounterVec
	storeErrors        prometheus.Counter
	failOpen           prometheus.Counter
	failLocal          prometheus.Counter
	decisionLogDropped prometheus.Counter
	decisionLogFailing prometheus.Gauge
	outages            prometheus.Counter
	lastOutage         prometheus.Gauge

	// byRule caches the decision counters of the current policy's rules,
	// indexed by Rule.ID, and endpoints the series of each decision
	// endpoint, so that a decision does no label lookups.
	byRule    atomic.Pointer[ruleCounters]
	endpoints map[string]*endpointMetrics // read-only after newMetrics
}

type endpointMetrics struct {
	allowed, refused prometheus.Counter
	latency          prometheus.Observer
}

// The decision endpoints, as they appear in metric labels.
var decisionEndpoints = []string{"check", "report", "acquire", "lease", "authz", "grpc"}

type ruleCounters struct {
	policy *policy.Policy
	c      [][3]prometheus.Counter // allowed, refused, shadow_refused
}

// newMetrics registers the metrics in reg, but the tenant series, which
// go to private.
func newMetrics(reg, private *prometheus.Registry, stats func() StoreStats, tenantLabel bool) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "admit_decisions_total", Help: "Charges decided, by tier (\"global\" for global rules), rule and result (allowed, refused, shadow_refused).",
		}, []string{"tier", "rule", "result"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "admit_requests_total", Help: "Decision requests answered, by endpoint and result (allowed, refused).",
		}, []string{"endpoint", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "admit_decision_duration_seconds", Help: "Time to decide a request, from reading its body to writing the answer.",
			Buckets: []float64{5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 0.025, 0.1, 1},
		}, []string{"endpoint"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "admit_request_errors_total", Help: "Requests answered with an error, by endpoint and HTTP status.",
		}, []string{"endpoint", "status"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "admit_config_reloads_total", Help: "Configuration reloads, by result (ok, error).",
		}, []string{"result"}),
		envoyReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "admit_envoy_config_reloads_total", Help: "Reloads of the envoyproxy/ratelimit configuration (--envoy-config files, or a version from --envoy-xds), by result (ok, error).",
		}, []string{"result"}),
		storeErrors:        prometheus.NewCounter(prometheus.CounterOpts{Name: "admit_store_errors_total", Help: "Decisions the store could not answer."}),
		failOpen:           prometheus.NewCounter(prometheus.CounterOpts{Name: "admit_fail_open_total", Help: "Requests admitted because the store was unavailable (on_error: open)."}),
		failLocal:          prometheus.NewCounter(prometheus.CounterOpts{Name: "admit_fail_local_total", Help: "Requests decided by the local limiter because the store was unavailable (on_error: local)."}),
		decisionLogDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "admit_decision_log_dropped_total", Help: "Decision log lines dropped because the log could not keep up, or could not be written."}),
		decisionLogFailing: prometheus.NewGauge(prometheus.GaugeOpts{Name: "admit_decision_log_failing", Help: "1 while the decision log cannot be written (its lines are dropped), 0 otherwise."}),
		outages:            prometheus.NewCounter(prometheus.CounterOpts{Name: "admit_store_outages_total", Help: "Times decisions found the store unavailable after it had answered."}),
		lastOutage:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "admit_store_last_outage_seconds", Help: "How long the last store outage that ended lasted, as decisions saw it."}),
	}
	m.endpoints = map[string]*endpointMetrics{}
	for _, e := range decisionEndpoints {
		m.endpoints[e] = &endpointMetrics{
			allowed: m.requests.WithLabelValues(e, "allowed"),
			refused: m.requests.WithLabelValues(e, "refused"),
			latency: m.latency.WithLabelValues(e),
		}
	}
	// Reload counters start at 0, so that the first failed reload is an
	// increase an alert sees (a series born at 1 is not).
	for _, result := range []string{"ok", "error"} {
		m.reloads.WithLabelValues(result)
		m.envoyReloads.WithLabelValues(result)
	}
	reg.MustRegister(m.decisions, m.requests, m.latency, m.errors, m.reloads, m.envoyReloads, m.storeErrors, m.failOpen, m.failLocal, m.decisionLogDropped, m.decisionLogFailing,
		m.outages, m.lastOutage,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if tenantLabel {
		m.tenants = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "admit_tenant_decisions_total", Help: "Decision requests by tenant and result (enabled by server.tenant_metrics).",
		}, []string{"tenant", "result"})
		private.MustRegister(m.tenants)
	}
	if stats != nil {
		gauge := func(name, help string, pick func(StoreStats) int64) prometheus.Collector {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return float64(pick(stats())) })
		}
		counter := func(name, help string, pick func(StoreStats) int64) prometheus.Collector {
			return counterFunc(name, help, stats, pick)
		}
		reg.MustRegister(
			gauge("admit_store_keys", "Live keys in the memory store.", func(s StoreStats) int64 { return s.Keys }),
			gauge("admit_store_leases", "Live leases in the store.", func(s StoreStats) int64 { return s.Leases }),
			counter("admit_store_evictions_total", "Keys evicted because the store held max_keys.", func(s StoreStats) int64 { return s.Evictions }),
			counter("admit_store_expirations_total", "Idle keys dropped by the sweeper.", func(s StoreStats) int64 { return s.Expirations }),
		)
	}
	return m
}

// registerHealth adds a remote store's breaker state and call counters.
func (m *metrics) registerHealth(reg *prometheus.Registry, health func() StoreHealth) {
	for _, state := range []string{"closed", "open", "half-open"} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "admit_store_breaker_state", Help: "1 for the store circuit breaker's current state (closed, open, half-open), 0 for the others.",
			ConstLabels: prometheus.Labels{"state": state},
		}, func() float64 {
			if health().Breaker == state {
				return 1
			}
			return 0
		}))
	}
	reg.MustRegister(
		counterFunc("admit_store_calls_total", "Calls to the remote store.", health, func(h StoreHealth) int64 { return h.Calls }),
		counterFunc("admit_store_call_failures_total", "Calls to the remote store that failed or timed out.", health, func(h StoreHealth) int64 { return h.Failures }),
		counterFunc("admit_store_undo_failures_total", "Cluster decisions over two slots whose give-back failed.", health, func(h StoreHealth) int64 { return h.UndoFailures }),
		counterFunc("admit_store_decisions_total", "Decisions asked of the remote store.", health, func(h StoreHealth) int64 { return h.Decisions }),
		counterFunc("admit_store_local_decisions_total", "Decisions made without a call: from leased allowances, or refused until a time the store gave.", health, func(h StoreHealth) int64 { return h.LocalDecisions }),
		counterFunc("admit_store_local_refusals_total", "Decisions refused without a call, until the time the store said the key could admit their cost.", health, func(h StoreHealth) int64 { return h.LocalRefusals }),
		counterFunc("admit_store_withdrawals_total", "Calls withdrawing leased allowances.", health, func(h StoreHealth) int64 { return h.Withdrawals }),
		counterFunc("admit_store_allowance_withdrawn_units_total", "Units withdrawn in leased allowances.", health, func(h StoreHealth) int64 { return h.Withdrawn }),
		counterFunc("admit_store_allowance_refunded_units_total", "Units of leased allowances given back unused.", health, func(h StoreHealth) int64 { return h.Refunded }),
		counterFunc("admit_store_allowance_expired_units_total", "Units of leased allowances whose period ended unused.", health, func(h StoreHealth) int64 { return h.Expired }),
		counterFunc("admit_store_allowance_lost_units_total", "Units of leased allowances a failed give-back lost.", health, func(h StoreHealth) int64 { return h.Lost }),
	)
	if h := health(); h.Region != nil {
		labels := prometheus.Labels{"region": h.Region.Name}
		region := func(pick func(*RegionHealth) float64) func() float64 {
			return func() float64 {
				if h := health(); h.Region != nil {
					return pick(h.Region)
				}
				return 0
			}
		}
		gauge := func(name, help string, pick func(*RegionHealth) float64) prometheus.Collector {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, region(pick))
		}
		counter := func(name, help string, pick func(*RegionHealth) float64) prometheus.Collector {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, region(pick))
		}
		reg.MustRegister(
			gauge("admit_region_held_units", "Units the region's pool held when last looked at.", func(r *RegionHealth) float64 { return float64(r.Held) }),
			gauge("admit_region_share", "The region's share of the limit it was last granted, 0 to 1.", func(r *RegionHealth) float64 { return r.Share }),
			gauge("admit_region_cut", "1 while the region cannot reach its home (the last call failed).", func(r *RegionHealth) float64 {
				if r.Cut {
					return 1
				}
				return 0
			}),
			gauge("admit_region_home_round_trip_seconds", "Calls to the home: round trip, a moving average.", func(r *RegionHealth) float64 { return r.RoundTripMS / 1000 }),
			counter("admit_region_home_calls_total", "Calls to the home Redis.", func(r *RegionHealth) float64 { return float64(r.HomeCalls) }),
			counter("admit_region_home_failures_total", "Calls to the home Redis that failed or timed out.", func(r *RegionHealth) float64 { return float64(r.HomeFailures) }),
			counter("admit_region_granted_units_total", "Units the home granted the region.", func(r *RegionHealth) float64 { return float64(r.Granted) }),
			counter("admit_region_given_back_units_total", "Units the region gave back home.", func(r *RegionHealth) float64 { return float64(r.GivenBack) }),
		)
	}
}

// counterFunc is a counter read at scrape time: pick applied to what read
// returns.
func counterFunc[T any](name, help string, read func() T, pick func(T) int64) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(pick(read())) })
}

// counters returns the per-rule counters of p, building them on the first
// decision under a new policy.
func (m *metrics) counters(p *policy.Policy) *ruleCounters {
	rc := m.byRule.Load()
	if rc != nil && rc.policy == p {
		return rc
	}
	rules := p.Rules()
	rc = &ruleCounters{policy: p, c: make([][3]prometheus.Counter, len(rules))}
	for i, r := range rules {
		tier := r.Tier
		if tier == "" {
			tier = "global"
		}
		for j, result := range [...]string{"allowed", "refused", "shadow_refused"} {
			rc.c[i][j] = m.decisions.WithLabelValues(tier, r.Name, result)
		}
	}
	m.byRule.Store(rc)
	return rc
}

// defaultTierLabel is the tenant label of every tenant the catalog does
// not know (a default tier's): their ids come from requests, and a label
// per id would let any caller create series without bound.
const defaultTierLabel = "_default_tier"

// tenantLabel is t's value of the tenant label: its id if the catalog
// holds it (the admin API and the configuration bound those), else
// defaultTierLabel.
func tenantLabel(t *policy.Tenant) string {
	if t.Source == "default" {
		return defaultTierLabel
	}
	return t.ID
}

func (m *metrics) observe(c *call, endpoint string, took time.Duration) {
	m.observeDecision(&c.res, &c.d, endpoint, took)
}

func (m *metrics) observeDecision(res *policy.Resolution, d *admit.Decision, endpoint string, took time.Duration) {
	em := m.endpoints[endpoint]
	result := "allowed"
	if d.Allowed {
		em.allowed.Inc()
	} else {
		result = "refused"
		em.refused.Inc()
	}
	em.latency.Observe(took.Seconds())
	if m.tenants != nil && res.Tenant != nil {
		m.tenants.WithLabelValues(tenantLabel(res.Tenant), result).Inc()
	}
	if len(res.Rules) == 0 {
		return // admitted without charges
	}
	rc := m.counters(res.Policy)
	for r, x := range policy.RuleResults(res.Rules, d.Results) {
		k := 0
		switch {
		case x.Allowed:
		case x.Shadow:
			k = 2
		default:
			k = 1
		}
		rc.c[r.ID][k].Inc() // counters(p) covers every rule of p by ID
	}
}
