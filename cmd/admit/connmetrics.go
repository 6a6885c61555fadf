package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/internal/connlimit"
)

// grpcConnCollectors export the gRPC port's connection counts.
func grpcConnCollectors(stats func() envoyrls.ConnStats) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "admit_grpc_connections", Help: "Connections to the gRPC port served now."},
			func() float64 { return float64(stats().Open) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "admit_grpc_connections_refused_total",
			Help: "Connections to the gRPC port closed at once: past server.grpc_max_connections or _per_ip, or from an address refused for a while."},
			func() float64 { return float64(stats().Refused) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "admit_grpc_connections_uncalled_total",
			Help: "Connections to the gRPC port closed because most of their streams ended before they were calls (rapid resets); their address is refused connections for 10 s."},
			func() float64 { return float64(stats().Uncalled) }),
	}
}

// httpConnCollectors export the HTTP port's connection counts.
func httpConnCollectors(stats func() connlimit.Stats) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "admit_http_connections", Help: "Connections to the HTTP port served now."},
			func() float64 { return float64(stats().Open) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "admit_http_connections_refused_total",
			Help: "Connections to the HTTP port closed at once: past server.http_max_connections, or server.http_max_connections_per_ip from an address that is not a trusted proxy."},
			func() float64 { return float64(stats().Refused) }),
	}
}
