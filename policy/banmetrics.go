package policy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// banCollector reports the bans in force and what Bans did.
type banCollector struct {
	b                                                                             *Bans
	inForce, refused, escalated, dropped, full, failed, loaded, restored, evicted *prometheus.Desc
}

// Collector returns the Prometheus collector of b: the bans in force by
// scope (admit_bans_in_force), the requests they refused, the bans
// escalation rules made, and the refusals and bans lost to the bounds or
// to store failures. No series is labelled by identifier.
func (b *Bans) Collector() prometheus.Collector {
	return &banCollector{b: b,
		inForce:   prometheus.NewDesc("admit_bans_in_force", "Bans in force, by scope.", []string{"scope"}, nil),
		refused:   prometheus.NewDesc("admit_ban_refusals_total", "Requests a ban refused (no store call).", nil, nil),
		escalated: prometheus.NewDesc("admit_bans_escalated_total", "Bans escalation rules made on this server.", nil, nil),
		dropped:   prometheus.NewDesc("admit_ban_refusals_uncounted_total", "Refusals escalation rules did not count: the queue was full.", nil, nil),
		full:      prometheus.NewDesc("admit_bans_full_total", "Bans escalation rules did not make: a tenant's users or a network held their part, or the most bans there may be were in force.", nil, nil),
		failed:    prometheus.NewDesc("admit_ban_store_failures_total", "Calls to the store of bans or of escalation counts that failed.", nil, nil),
		evicted:   prometheus.NewDesc("admit_bans_evicted_total", "Escalations' bans replaced by newer ones, past the escalations' part of the bans.", nil, nil),
		restored:  prometheus.NewDesc("admit_bans_restored_total", "Bans this server saved back into a store that had lost them (a Redis that came back empty).", nil, nil),
		loaded:    prometheus.NewDesc("admit_bans_loaded", "1 when the last load of the bans from the store succeeded; 0 while this server enforces what it loaded last (none, if it never loaded them).", nil, nil),
	}
}

func (c *banCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.inForce, c.refused, c.escalated, c.dropped, c.full, c.failed, c.loaded, c.restored, c.evicted} {
		ch <- d
	}
}

func (c *banCollector) Collect(ch chan<- prometheus.Metric) {
	by := map[string]int{BanIP: 0, BanAPIKey: 0, BanUser: 0, BanTenant: 0}
	for _, b := range c.b.List() {
		by[b.Scope]++
	}
	for scope, n := range by {
		ch <- prometheus.MustNewConstMetric(c.inForce, prometheus.GaugeValue, float64(n), scope)
	}
	loaded := 0.0
	if c.b.Loaded() {
		loaded = 1
	}
	ch <- prometheus.MustNewConstMetric(c.loaded, prometheus.GaugeValue, loaded)
	st := &c.b.stats
	for _, m := range []struct {
		d *prometheus.Desc
		v int64
	}{{c.refused, st.Refused.Load()}, {c.escalated, st.Escalated.Load()}, {c.dropped, st.Dropped.Load()}, {c.full, st.Full.Load()}, {c.failed, st.Failures.Load()}, {c.restored, st.Restored.Load()}, {c.evicted, st.Evicted.Load()}} {
		ch <- prometheus.MustNewConstMetric(m.d, prometheus.CounterValue, float64(m.v))
	}
}
