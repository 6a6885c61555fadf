package main

import "time"

// upstreamStatsFlags say where envoyproxy/ratelimit's statistics go, as
// its settings say: to a statsd server over TCP (USE_STATSD, the
// default of envoyproxy/ratelimit), or onto the Prometheus metrics
// (USE_PROMETHEUS) under the names its default mapping gives them.
type upstreamStatsFlags struct {
	statsd     string        // host:port, if set
	every      time.Duration // between two flushes to statsd
	prometheus bool
	mapperFile string  // PROMETHEUS_MAPPER_YAML, statsd_exporter's mapping file
	nearLimit  float64 // NEAR_LIMIT_RATIO
}

func (u upstreamStatsFlags) on() bool { return u.statsd != "" || u.prometheus }
