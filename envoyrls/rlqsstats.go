package envoyrls

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// quotaStats counts what the quota service does: for the whole service,
// and per rule for the rules a bucket's limits are of. Rules are the
// configuration's, so their number bounds the labels.
type quotaStats struct {
	streams, buckets, failed, failovers, full atomic.Int64

	mu       sync.Mutex
	rules    map[string]*quotaRuleStats
	reasons  map[string]int64 // buckets abandoned, by why
	refusals map[string]int64 // buckets denied all, by why
}

type quotaRuleStats struct {
	streams, buckets int64
	rate             float64 // tokens per second assigned to this server's buckets
	allowed, denied  uint64  // requests as reported
	changes          uint64  // assignments sent that changed a bucket's strategy
	unsupported      uint64  // buckets of a rule whose algorithm cannot be divided
}

func newQuotaStats() *quotaStats {
	return &quotaStats{rules: map[string]*quotaRuleStats{}, reasons: map[string]int64{}, refusals: map[string]int64{}}
}

func (s *quotaStats) rule(name string) *quotaRuleStats {
	r := s.rules[name]
	if r == nil {
		r = &quotaRuleStats{}
		s.rules[name] = r
	}
	return r
}

func (s *quotaStats) with(name string, f func(*quotaRuleStats)) {
	s.mu.Lock()
	f(s.rule(name))
	s.mu.Unlock()
}

func (s *quotaStats) ruleStreams(name string, d int) {
	s.with(name, func(r *quotaRuleStats) { r.streams += int64(d) })
}
func (s *quotaStats) ruleBuckets(name string, d int) {
	s.with(name, func(r *quotaRuleStats) { r.buckets += int64(d) })
}
func (s *quotaStats) ruleRate(name string, d float64) {
	s.with(name, func(r *quotaRuleStats) { r.rate = max(0, r.rate+d) })
}
func (s *quotaStats) unsupported(name string) {
	s.with(name, func(r *quotaRuleStats) { r.unsupported++ })
}

func (s *quotaStats) reported(b *quotaBucket, allowed, denied uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range b.limits {
		r := s.rule(l.rule.Name)
		r.allowed += allowed
		r.denied += denied
	}
}

func (s *quotaStats) changed(b *quotaBucket) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range b.limits {
		s.rule(l.rule.Name).changes++
	}
}

func (s *quotaStats) abandoned(why string) {
	s.mu.Lock()
	s.reasons[why]++
	s.mu.Unlock()
}

func (s *quotaStats) denied(why string) {
	s.mu.Lock()
	s.refusals[why]++
	s.mu.Unlock()
}

// QuotaRuleStats is what the quota service counts of one rule.
type QuotaRuleStats struct {
	Rule string `json:"rule"`
	// Streams and Buckets are this server's streams with a bucket the
	// rule limits, and those buckets; Rate is the tokens per second
	// assigned to them.
	Streams int64   `json:"streams"`
	Buckets int64   `json:"buckets"`
	Rate    float64 `json:"assigned_per_second"`
	// Allowed and Denied count requests as the Envoys reported them;
	// Changes the assignments that changed a bucket's strategy.
	Allowed uint64 `json:"allowed"`
	Denied  uint64 `json:"denied"`
	Changes uint64 `json:"share_changes"`
}

// RuleStats returns what the service counts of each rule.
func (q *QuotaService) RuleStats() []QuotaRuleStats {
	q.stats.mu.Lock()
	defer q.stats.mu.Unlock()
	out := make([]QuotaRuleStats, 0, len(q.stats.rules))
	for name, r := range q.stats.rules {
		out = append(out, QuotaRuleStats{Rule: name, Streams: r.streams, Buckets: r.buckets, Rate: r.rate,
			Allowed: r.allowed, Denied: r.denied, Changes: r.changes})
	}
	return out
}

var (
	quotaStreamsDesc  = prometheus.NewDesc("admit_rlqs_streams", "Envoy quota service streams open on this server.", nil, nil)
	quotaBucketsDesc  = prometheus.NewDesc("admit_rlqs_buckets", "Envoy buckets this server's quota streams hold.", nil, nil)
	quotaFailedDesc   = prometheus.NewDesc("admit_rlqs_ledger_failures_total", "Shares the quota ledger could not give (the store failed or was slow).", nil, nil)
	quotaFailoverDesc = prometheus.NewDesc("admit_rlqs_failovers_total", "Assignments made by the rules' on_error because the quota ledger could not be reached.", nil, nil)
	quotaFullDesc     = prometheus.NewDesc("admit_rlqs_limit_full_total", "Buckets that waited for a share because their limit was divided among 256 buckets already.", nil, nil)
	quotaAbandonDesc  = prometheus.NewDesc("admit_rlqs_abandoned_total", "Buckets abandoned: invalid (entries past the bounds), too_many (past the buckets of a stream), idle.", []string{"reason"}, nil)
	quotaRefusedDesc  = prometheus.NewDesc("admit_rlqs_denied_buckets_total", "Buckets assigned DENY_ALL by what refuses them (an unknown tenant, a key, a limit of 0).", []string{"reason"}, nil)
	quotaRStreamsDesc = prometheus.NewDesc("admit_rlqs_rule_streams", "Quota streams with a bucket the rule limits.", []string{"rule"}, nil)
	quotaRBucketsDesc = prometheus.NewDesc("admit_rlqs_rule_buckets", "Buckets the rule limits on this server's streams.", []string{"rule"}, nil)
	quotaRRateDesc    = prometheus.NewDesc("admit_rlqs_rule_assigned_per_second", "Tokens per second of the rule assigned to this server's buckets.", []string{"rule"}, nil)
	quotaRAllowedDesc = prometheus.NewDesc("admit_rlqs_rule_allowed_total", "Requests the Envoys reported they allowed under the rule's buckets.", []string{"rule"}, nil)
	quotaRDeniedDesc  = prometheus.NewDesc("admit_rlqs_rule_denied_total", "Requests the Envoys reported they denied under the rule's buckets.", []string{"rule"}, nil)
	quotaRChangesDesc = prometheus.NewDesc("admit_rlqs_rule_share_changes_total", "Assignments that changed a bucket's strategy (each rebuilds the Envoy's bucket).", []string{"rule"}, nil)
	quotaRUnsuppDesc  = prometheus.NewDesc("admit_rlqs_rule_unsupported_total", "Buckets of a rule whose algorithm quota assignments cannot hold (windows, logs, concurrency): not limited by it.", []string{"rule"}, nil)
)

type quotaCollector struct{ q *QuotaService }

// Collectors returns the quota service's metrics.
func (q *QuotaService) Collectors() []prometheus.Collector {
	return []prometheus.Collector{quotaCollector{q}}
}

func (c quotaCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{quotaStreamsDesc, quotaBucketsDesc, quotaFailedDesc, quotaFailoverDesc, quotaFullDesc, quotaAbandonDesc, quotaRefusedDesc,
		quotaRStreamsDesc, quotaRBucketsDesc, quotaRRateDesc, quotaRAllowedDesc, quotaRDeniedDesc, quotaRChangesDesc, quotaRUnsuppDesc} {
		ch <- d
	}
}

func (c quotaCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.q.stats
	ch <- prometheus.MustNewConstMetric(quotaStreamsDesc, prometheus.GaugeValue, float64(s.streams.Load()))
	ch <- prometheus.MustNewConstMetric(quotaBucketsDesc, prometheus.GaugeValue, float64(s.buckets.Load()))
	ch <- prometheus.MustNewConstMetric(quotaFailedDesc, prometheus.CounterValue, float64(s.failed.Load()))
	ch <- prometheus.MustNewConstMetric(quotaFailoverDesc, prometheus.CounterValue, float64(s.failovers.Load()))
	ch <- prometheus.MustNewConstMetric(quotaFullDesc, prometheus.CounterValue, float64(s.full.Load()))
	s.mu.Lock()
	defer s.mu.Unlock()
	for why, n := range s.reasons {
		ch <- prometheus.MustNewConstMetric(quotaAbandonDesc, prometheus.CounterValue, float64(n), why)
	}
	for why, n := range s.refusals {
		ch <- prometheus.MustNewConstMetric(quotaRefusedDesc, prometheus.CounterValue, float64(n), why)
	}
	for name, r := range s.rules {
		ch <- prometheus.MustNewConstMetric(quotaRStreamsDesc, prometheus.GaugeValue, float64(r.streams), name)
		ch <- prometheus.MustNewConstMetric(quotaRBucketsDesc, prometheus.GaugeValue, float64(r.buckets), name)
		ch <- prometheus.MustNewConstMetric(quotaRRateDesc, prometheus.GaugeValue, r.rate, name)
		ch <- prometheus.MustNewConstMetric(quotaRAllowedDesc, prometheus.CounterValue, float64(r.allowed), name)
		ch <- prometheus.MustNewConstMetric(quotaRDeniedDesc, prometheus.CounterValue, float64(r.denied), name)
		ch <- prometheus.MustNewConstMetric(quotaRChangesDesc, prometheus.CounterValue, float64(r.changes), name)
		ch <- prometheus.MustNewConstMetric(quotaRUnsuppDesc, prometheus.CounterValue, float64(r.unsupported), name)
	}
}
