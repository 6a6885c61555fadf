package main

import (
	"net"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/internal/connlimit"
)

// The HTTP port's bounds by default. An idle keep-alive connection holds
// about 20 kB; 1,000 from one address hold 20 MB. Half the process's file
// descriptors at most go to clients, so that its store's connections and
// its files always find one.
const (
	defaultHTTPMaxConnections      = 10_000
	defaultHTTPMaxConnectionsPerIP = 1_000
)

// httpListener bounds ln's connections by the server section, a trusted
// proxy's exempt from the bound per address.
func httpListener(ln net.Listener, s *ServerConfig, trusted httplimit.Proxies) *connlimit.Listener {
	l := connlimit.Limits{Max: s.HTTPMaxConnections, MaxPerIP: s.HTTPMaxConnectionsPerIP, Exempt: trusted.Contains}
	if l.Max == 0 {
		l.Max = defaultHTTPMaxConnections
		var lim syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur/2 < uint64(l.Max) {
			l.Max = max(int(lim.Cur/2), 1)
		}
	}
	if l.MaxPerIP == 0 {
		l.MaxPerIP = defaultHTTPMaxConnectionsPerIP
	}
	return connlimit.New(ln, l)
}

// httpConnMetrics are the HTTP port's connection counts.
func httpConnMetrics(ln *connlimit.Listener) []prometheus.Collector {
	return ln.Collectors("admit_http", "the HTTP port", "past server.http_max_connections, or server.http_max_connections_per_ip from an address that is not a trusted proxy")
}
