package limitador

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts calls under Limitador's own metric names, so that its
// dashboards and alerts read an Admit server unchanged: authorized_calls,
// authorized_hits and limited_calls by limitador_namespace (and
// limit_name, when NewMetrics is asked for it), datastore_latency,
// limitador_up and datastore_partitioned. Only the namespaces of the
// limits file are counted, so their number bounds the series.
type Metrics struct {
	authorizedCalls  *prometheus.CounterVec
	authorizedHits   *prometheus.CounterVec
	limitedCalls     *prometheus.CounterVec
	datastoreLatency prometheus.Histogram
	up, partitioned  prometheus.Gauge
	limitNames       bool
}

// NewMetrics returns Metrics; limitNames labels limited_calls with the
// name of the limit that refused (Limitador's --limit-name-in-labels).
func NewMetrics(limitNames bool) *Metrics {
	labels := []string{"limitador_namespace"}
	limited := labels
	if limitNames {
		limited = append([]string{}, "limitador_namespace", "limit_name")
	}
	m := &Metrics{
		authorizedCalls:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "authorized_calls", Help: "Authorized calls"}, labels),
		authorizedHits:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "authorized_hits", Help: "Authorized hits"}, labels),
		limitedCalls:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "limited_calls", Help: "Limited calls"}, limited),
		datastoreLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "datastore_latency", Help: "Latency to the underlying counter datastore", Buckets: []float64{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1}}),
		up:               prometheus.NewGauge(prometheus.GaugeOpts{Name: "limitador_up", Help: "Limitador is running"}),
		partitioned:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "datastore_partitioned", Help: "Limitador is partitioned from backing datastore"}),
		limitNames:       limitNames,
	}
	m.up.Set(1)
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.authorizedCalls, m.authorizedHits, m.limitedCalls, m.datastoreLatency, m.up, m.partitioned}
}

// SetPartitioned sets datastore_partitioned: 1 while the store does not
// answer.
func (m *Metrics) SetPartitioned(down bool) {
	if m == nil {
		return
	}
	v := 0.0
	if down {
		v = 1
	}
	m.partitioned.Set(v)
}

// authorized counts a call let through, and its hits.
func (m *Metrics) authorized(ns string, calls bool, hits uint64) {
	if m == nil {
		return
	}
	if calls {
		m.authorizedCalls.WithLabelValues(ns).Inc()
	}
	if hits > 0 {
		m.authorizedHits.WithLabelValues(ns).Add(float64(hits))
	}
}

// limited counts a call refused by limit name.
func (m *Metrics) limited(ns, name string) {
	if m == nil {
		return
	}
	if m.limitNames {
		m.limitedCalls.WithLabelValues(ns, name).Inc()
		return
	}
	m.limitedCalls.WithLabelValues(ns).Inc()
}

var _ prometheus.Collector = (*Metrics)(nil)
