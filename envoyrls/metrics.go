package envoyrls

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns the gRPC port's connection counts as Prometheus
// metrics: admit_grpc_connections (served now),
// admit_grpc_connections_refused_total (closed at once) and
// admit_grpc_connections_uncalled_total (closed for rapid resets).
func (s *Server) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "admit_grpc_connections", Help: "Connections to the gRPC port served now."},
			func() float64 { return float64(s.Connections().Open) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "admit_grpc_connections_refused_total",
			Help: "Connections to the gRPC port closed at once: past server.grpc_max_connections or _per_ip, or from an address refused for a while."},
			func() float64 { return float64(s.Connections().Refused) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "admit_grpc_connections_uncalled_total",
			Help: "Connections to the gRPC port closed because most of their streams ended before they were calls (rapid resets); their address is refused connections for 10 s."},
			func() float64 { return float64(s.uncalled.Load()) }),
	}
}
