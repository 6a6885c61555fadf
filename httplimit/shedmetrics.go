package httplimit

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/admitdev/admit/shed"
)

// shedCollector exports the shedding groups' state: the concurrency
// limit, what is in flight (and of it, held by upgraded connections) and
// queued, and the requests admitted and shed by class.
type shedCollector struct {
	stats                         func() []ShedStat
	limit, inFlight, held, queued *prometheus.Desc
	requests                      *prometheus.Desc
}

// ShedCollector returns a prometheus.Collector of l's shedding groups:
// admit_shed_limit, _in_flight, _held and _queued per group, and
// admit_shed_requests_total per group, class and result.
func (l *Limiter) ShedCollector() prometheus.Collector { return newShedCollector(l.ShedStats) }

func newShedCollector(stats func() []ShedStat) *shedCollector {
	g := []string{"group"}
	return &shedCollector{
		stats:    stats,
		limit:    prometheus.NewDesc("admit_shed_limit", "The concurrency limit of a shedding group, as it adapts.", g, nil),
		inFlight: prometheus.NewDesc("admit_shed_in_flight", "Requests of a shedding group being served.", g, nil),
		held:     prometheus.NewDesc("admit_shed_held", "Of admit_shed_in_flight, the connections upgraded (WebSockets) that hold their slot until they close.", g, nil),
		queued:   prometheus.NewDesc("admit_shed_queued", "Requests of a shedding group waiting for a slot.", g, nil),
		requests: prometheus.NewDesc("admit_shed_requests_total", "Requests of a shedding group, by class and result (admitted, shed).", []string{"group", "class", "result"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *shedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.limit
	ch <- c.inFlight
	ch <- c.held
	ch <- c.queued
	ch <- c.requests
}

// Collect implements prometheus.Collector.
func (c *shedCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.stats() {
		ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(s.Limit), s.Group)
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(s.InFlight), s.Group)
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(s.Held), s.Group)
		ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(s.Queued), s.Group)
		for _, cl := range shed.Classes() {
			ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(s.Admitted[cl]), s.Group, cl.String(), "admitted")
			ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(s.Shed[cl]), s.Group, cl.String(), "shed")
		}
	}
}
