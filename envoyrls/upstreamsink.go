package envoyrls

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	kitlog "github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/statsd_exporter/pkg/mapper"
)

// SendStatsd sends stats to the statsd server at addr over TCP every
// interval until ctx ends, as envoyproxy/ratelimit's statsd sink does:
// each counter's increase since the last flush as "name:n|c", each call's
// response time as "ratelimit_server.ShouldRateLimit.response_time:ms|ms".
// A flush the server does not take is dropped, and the connection made
// again at the next. It returns when ctx ends, after a last flush.
func (s *UpstreamStats) SendStatsd(ctx context.Context, addr string, every time.Duration, log *slog.Logger) {
	var conn net.Conn
	last := map[string]uint64{}
	failing := false
	flush := func() {
		var b bytes.Buffer
		for _, c := range s.Counters() {
			if d := c.Value - last[c.Name]; d > 0 {
				b.WriteString(c.Name)
				b.WriteByte(':')
				b.WriteString(strconv.FormatUint(d, 10))
				b.WriteString("|c\n")
			}
			last[c.Name] = c.Value
		}
		for _, t := range s.TakeResponseTimes() {
			b.WriteString("ratelimit_server.ShouldRateLimit.response_time:")
			b.WriteString(strconv.FormatInt(t.Milliseconds(), 10))
			b.WriteString("|ms\n")
		}
		if b.Len() == 0 {
			return
		}
		var err error
		if conn == nil {
			conn, err = net.DialTimeout("tcp", addr, time.Second)
		}
		if err == nil {
			_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
			_, err = conn.Write(b.Bytes())
		}
		if err != nil {
			if conn != nil {
				conn.Close()
				conn = nil
			}
			if !failing {
				log.Warn("statsd: statistics dropped until the server takes them", "addr", addr, "err", err)
			}
			failing = true
			return
		}
		failing = false
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			flush()
			if conn != nil {
				conn.Close()
			}
			return
		case <-t.C:
			flush()
		}
	}
}

// upstreamCollector exposes stats as envoyproxy/ratelimit's Prometheus
// mode names them: its statsd names through a statsd_exporter mapping
// file (PROMETHEUS_MAPPER_YAML), or else through its default mapping: a
// limit's counters as ratelimit_service_rate_limit_<stat> with the labels
// domain, key1 and, for a limit two levels down or deeper, key2; the
// should_rate_limit errors as ratelimit_service_should_rate_limit_error
// by err_type; calls as ratelimit_service_total_requests and
// ratelimit_service_response_time_seconds by grpc_method. A name no
// mapping matches keeps its statsd name, every character but letters,
// digits and '_' made '_'.
type upstreamCollector struct {
	stats  *UpstreamStats
	mapper *mapper.MetricMapper // nil: the default mapping

	mu      sync.Mutex // the response times' histogram
	count   uint64
	sum     float64
	buckets []uint64 // cumulative, over prometheus.DefBuckets
}

// responseTimeName is the statsd name of a call's response time.
const responseTimeName = "ratelimit_server.ShouldRateLimit.response_time"

// Collector returns a prometheus.Collector of stats under the names
// envoyproxy/ratelimit's Prometheus mode (USE_PROMETHEUS) gives them,
// mapped by the statsd_exporter mapping file mapperFile if set. As
// envoyproxy/ratelimit, a mapping file that cannot be read maps nothing;
// the warning logged says why.
func (s *UpstreamStats) Collector(mapperFile string, log *slog.Logger) prometheus.Collector {
	u := &upstreamCollector{stats: s, buckets: make([]uint64, len(prometheus.DefBuckets))}
	if mapperFile != "" {
		u.mapper = &mapper.MetricMapper{Registerer: prometheus.NewRegistry(), Logger: kitlog.NewNopLogger()}
		if err := u.mapper.InitFromFile(mapperFile); err != nil {
			log.Warn("PROMETHEUS_MAPPER_YAML: statistics keep their statsd names", "err", err)
			u.mapper = &mapper.MetricMapper{Registerer: prometheus.NewRegistry(), Logger: kitlog.NewNopLogger()}
		}
	}
	return u
}

// Describe describes nothing: the metrics are as many as the counters.
func (u *upstreamCollector) Describe(chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector.
func (u *upstreamCollector) Collect(ch chan<- prometheus.Metric) {
	u.mu.Lock()
	for _, t := range u.stats.TakeResponseTimes() {
		u.count++
		u.sum += t.Seconds()
		for i, b := range prometheus.DefBuckets {
			if t.Seconds() <= b {
				u.buckets[i]++
			}
		}
	}
	if u.count > 0 {
		if name, labels, values, ok := u.metric(responseTimeName, mapper.MetricTypeObserver); ok {
			bs := make(map[float64]uint64, len(u.buckets))
			for i, b := range prometheus.DefBuckets {
				bs[b] = u.buckets[i]
			}
			if m, err := prometheus.NewConstHistogram(u.desc(name, labels), u.count, u.sum, bs, values...); err == nil {
				ch <- m
			}
		}
	}
	u.mu.Unlock()
	for _, c := range u.stats.Counters() {
		name, labels, values, ok := u.metric(c.Name, mapper.MetricTypeCounter)
		if !ok {
			continue
		}
		if m, err := prometheus.NewConstMetric(u.desc(name, labels), prometheus.CounterValue, float64(c.Value), values...); err == nil {
			ch <- m
		}
	}
}

// desc describes a metric; one help text per name, as a family's metrics
// must agree on it.
func (u *upstreamCollector) desc(name string, labels []string) *prometheus.Desc {
	return prometheus.NewDesc(name, "envoyproxy/ratelimit's statistic "+name+", under the name its Prometheus mode gives it.", labels, nil)
}

// metric returns the Prometheus name and labels of a statsd name of type
// kind, or false when a mapping drops it.
func (u *upstreamCollector) metric(statsd string, kind mapper.MetricType) (name string, labels, values []string, ok bool) {
	if u.mapper == nil {
		if statsd == responseTimeName {
			return "ratelimit_service_response_time_seconds", []string{"grpc_method"}, []string{"ShouldRateLimit"}, true
		}
		name, labels, values = upstreamMetric(statsd)
		return name, labels, values, true
	}
	m, ls, found := u.mapper.GetMapping(statsd, kind)
	if !found {
		return mapper.EscapeMetricName(statsd), nil, nil, true
	}
	if m.Action == mapper.ActionTypeDrop {
		return "", nil, nil, false
	}
	labels = slices.Sorted(maps.Keys(ls))
	for _, l := range labels {
		values = append(values, ls[l])
	}
	return m.Name, labels, values, true
}

// upstreamStat are the statistics of a limit that carry labels.
var upstreamStat = map[string]bool{"total_hits": true, "over_limit": true, "near_limit": true, "within_limit": true, "shadow_mode": true}

// upstreamMetric returns the Prometheus name and labels of a statsd name.
func upstreamMetric(statsd string) (name string, labels, values []string) {
	if rest, ok := strings.CutPrefix(statsd, "ratelimit.service.rate_limit."); ok {
		i := strings.LastIndexByte(rest, '.')
		if parts := strings.Split(rest[:max(i, 0)], "."); i > 0 && upstreamStat[rest[i+1:]] && len(parts) >= 2 {
			labels, values = []string{"domain", "key1"}, parts[:2]
			if len(parts) >= 3 {
				labels, values = append(labels, "key2"), parts[:3]
			}
			return "ratelimit_service_rate_limit_" + rest[i+1:], labels, values
		}
	}
	if err, ok := strings.CutPrefix(statsd, "ratelimit.service.call.should_rate_limit."); ok {
		return "ratelimit_service_should_rate_limit_error", []string{"err_type"}, []string{err}
	}
	if rest, ok := strings.CutPrefix(statsd, "ratelimit_server."); ok {
		if method, ok := strings.CutSuffix(rest, ".total_requests"); ok {
			return "ratelimit_service_total_requests", []string{"grpc_method"}, []string{method}
		}
	}
	return mapper.EscapeMetricName(statsd), nil, nil
}
