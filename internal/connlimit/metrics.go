package connlimit

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns the listener's counts as Prometheus metrics:
// prefix+"_connections", those served now, and
// prefix+"_connections_refused_total", those closed as they were accepted.
// port names the listener in their help ("the HTTP port") and bounds
// what refuses a connection (the settings of its Limits).
func (l *Listener) Collectors(prefix, port, bounds string) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: prefix + "_connections", Help: "Connections to " + port + " served now."},
			func() float64 { return float64(l.open.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: prefix + "_connections_refused_total",
			Help: "Connections to " + port + " closed at once: " + bounds + "."},
			func() float64 { return float64(l.refused.Load()) }),
	}
}
