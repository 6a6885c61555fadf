package envoyrls

import (
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/admitdev/admit/policy"
)

// MaxUpstreamCounters bounds the names an UpstreamStats counts. Names come
// from configured descriptors, but also from what clients send (a domain
// nobody configured, a limit override): past the bound, new names are not
// counted, so that a client cannot grow a server's memory with names.
const MaxUpstreamCounters = 10000

// maxResponseTimes bounds the response times kept between two reads.
const maxResponseTimes = 10000

// UpstreamStats counts what envoyproxy/ratelimit's statistics count, under
// its statsd names, so that dashboards and alerts built on them keep
// working (names with what a statsd line cannot carry in them made '_'):
// for each descriptor with a limit,
// ratelimit.service.rate_limit.<key>.total_hits, within_limit, near_limit,
// over_limit and shadow_mode, where <key> is the limit's path in its file
// (Limit.FullKey); ratelimit.service.rate_limit.<domain>.domain_not_found;
// ratelimit.service.config_load_success and config_load_error;
// ratelimit.service.call.should_rate_limit.redis_error and service_error;
// ratelimit_server.ShouldRateLimit.total_requests; and each call's
// response time. A sink (statsd, Prometheus) reads them. It is safe for
// concurrent use; the zero value is not: use NewUpstreamStats.
type UpstreamStats struct {
	nearLimitRatio float64

	mu       sync.RWMutex
	counters map[string]*atomic.Uint64
	limits   map[string]*limitCounters // by key, so that a hit builds no names
	dropped  atomic.Uint64

	timesMu sync.Mutex
	times   []time.Duration
}

// NewUpstreamStats returns counters that count a hit as near its limit
// past nearLimitRatio of it (envoyproxy/ratelimit's NEAR_LIMIT_RATIO,
// 0.8 by default).
func NewUpstreamStats(nearLimitRatio float64) *UpstreamStats {
	return &UpstreamStats{nearLimitRatio: nearLimitRatio, counters: map[string]*atomic.Uint64{}, limits: map[string]*limitCounters{}}
}

// Add adds n to the counter name, in which every byte a statsd line
// cannot carry in a name (control characters, space, ':' and '|') is
// made '_'.
func (s *UpstreamStats) Add(name string, n uint64) {
	if n == 0 {
		return
	}
	name = statName(name)
	s.mu.RLock()
	c := s.counters[name]
	s.mu.RUnlock()
	if c == nil {
		s.mu.Lock()
		c = s.counter(name)
		s.mu.Unlock()
	}
	s.add(c, n)
}

// statName returns name as a sink can write it: with every byte that
// would end a statsd line or split it into fields (control characters,
// space, ':' and '|') made '_'. Names carry what clients send (a domain
// nobody configured, the entries of a limit override), and a domain of
// "x\nforged:1|c" must not become a line of its own. A name without such
// bytes is returned as it is, without a copy.
func statName(name string) string {
	for i := 0; i < len(name); i++ {
		if unsafeInStat(name[i]) {
			b := []byte(name)
			for j := i; j < len(b); j++ {
				if unsafeInStat(b[j]) {
					b[j] = '_'
				}
			}
			return string(b)
		}
	}
	return name
}

func unsafeInStat(c byte) bool { return c <= ' ' || c == 0x7f || c == ':' || c == '|' }

// counter returns the counter name, made if need be, or nil past the
// bound. s.mu is held.
func (s *UpstreamStats) counter(name string) *atomic.Uint64 {
	c := s.counters[name]
	if c == nil && len(s.counters) < MaxUpstreamCounters {
		c = new(atomic.Uint64)
		s.counters[name] = c
	}
	return c
}

func (s *UpstreamStats) add(c *atomic.Uint64, n uint64) {
	if c == nil {
		s.dropped.Add(n)
		return
	}
	c.Add(n)
}

// limitCounters are the counters of one limit.
type limitCounters struct {
	totalHits, withinLimit, nearLimit, overLimit, shadowMode *atomic.Uint64
}

// limit returns the counters of the limit whose statistics key is key
// (see Limit.FullKey).
func (s *UpstreamStats) limit(key string) *limitCounters {
	s.mu.RLock()
	lc := s.limits[key]
	s.mu.RUnlock()
	if lc != nil {
		return lc
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if lc = s.limits[key]; lc == nil && len(s.limits) < MaxUpstreamCounters {
		p := "ratelimit.service.rate_limit." + statName(key) + "."
		lc = &limitCounters{s.counter(p + "total_hits"), s.counter(p + "within_limit"), s.counter(p + "near_limit"),
			s.counter(p + "over_limit"), s.counter(p + "shadow_mode")}
		s.limits[key] = lc
	}
	if lc == nil {
		lc = &limitCounters{}
	}
	return lc
}

// ConfigLoaded counts a load of the configuration files, as
// envoyproxy/ratelimit does: config_load_success or config_load_error.
func (s *UpstreamStats) ConfigLoaded(err error) {
	if err != nil {
		s.Add("ratelimit.service.config_load_error", 1)
		return
	}
	s.Add("ratelimit.service.config_load_success", 1)
}

// UpstreamCounter is one counter of an UpstreamStats.
type UpstreamCounter struct {
	Name  string
	Value uint64
}

// Counters returns every counter that counted something, sorted by name.
func (s *UpstreamStats) Counters() []UpstreamCounter {
	s.mu.RLock()
	out := make([]UpstreamCounter, 0, len(s.counters))
	for name, c := range s.counters {
		if v := c.Load(); v > 0 {
			out = append(out, UpstreamCounter{name, v})
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b UpstreamCounter) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Dropped returns how many counts went to names past MaxUpstreamCounters.
func (s *UpstreamStats) Dropped() uint64 { return s.dropped.Load() }

// TakeResponseTimes returns the calls' response times since the last time
// it was called (at most 10,000 of them; the rest are not kept).
func (s *UpstreamStats) TakeResponseTimes() []time.Duration {
	s.timesMu.Lock()
	defer s.timesMu.Unlock()
	t := s.times
	s.times = nil
	return t
}

// call counts a call of ShouldRateLimit and how long it took.
func (s *UpstreamStats) call(took time.Duration) {
	s.Add("ratelimit_server.ShouldRateLimit.total_requests", 1)
	s.timesMu.Lock()
	if len(s.times) < maxResponseTimes {
		s.times = append(s.times, took)
	}
	s.timesMu.Unlock()
}

// hit counts hits of a limit of limit requests per unit whose counter went
// from before to after (after = before + hits when the hits were counted;
// before = -1 when only after is known), as envoyproxy/ratelimit's base
// limiter counts them: within the limit, near it, over it, and over it in
// shadow mode.
func (s *UpstreamStats) hit(key string, limit, before, after, hits uint64, beforeKnown, shadow bool) {
	lc := s.limit(key)
	s.add(lc.totalHits, hits)
	near := uint64(math.Floor(float64(float32(limit) * float32(s.nearLimitRatio))))
	if after > limit {
		over := hits
		if beforeKnown && before < limit {
			over = after - limit
			s.add(lc.nearLimit, limit-max(near, before))
		}
		s.add(lc.overLimit, over)
		if shadow {
			s.add(lc.shadowMode, over)
		}
		return
	}
	s.add(lc.withinLimit, hits)
	if after > near {
		if before >= near {
			s.add(lc.nearLimit, hits)
		} else {
			s.add(lc.nearLimit, after-near)
		}
	}
}

// overrideStatsKey is the statistics key of a limit override: the domain and
// each entry's key_value, joined by dots, as envoyproxy/ratelimit names
// it.
func overrideStatsKey(domain string, d *rlext.RateLimitDescriptor) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range d.GetEntries() {
		b.WriteByte('.')
		b.WriteString(e.GetKey())
		if e.GetValue() != "" {
			b.WriteByte('_')
			b.WriteString(e.GetValue())
		}
	}
	return b.String()
}

// countStats counts descriptor i of call c, decided with outcome out, in
// s.opts.Stats as envoyproxy/ratelimit counts it.
func (s *Service) countStats(req *rlsv3.RateLimitRequest, c *call, i int, out policy.Outcome) {
	st := &c.descs[i]
	l := st.limit
	if l == nil || l.Unlimited || st.kind == kindNone || st.kind == kindUnlimited {
		return
	}
	d := req.GetDescriptors()[i]
	key := l.FullKey
	if key == overrideFullKey {
		key = overrideStatsKey(req.GetDomain(), d)
	}
	n, _ := hits(req, d)
	h, limit := uint64(n), int64(l.RequestsPerUnit)
	stats := s.opts.Stats
	switch {
	case st.kind == kindRefuseAll:
		stats.hit(key, 0, 0, h, h, true, l.Shadow)
		return
	case out == policy.FailedOpen || len(c.dec.Results) != len(c.all.Charges) || st.from >= st.to:
		// Admitted without a decision (the store is down): a hit, as
		// envoyproxy/ratelimit counts it before it asks Redis.
		stats.add(stats.limit(key).totalHits, h)
		return
	}
	j := c.refs[st.from]
	r := &c.dec.Results[j]
	var before, after int64
	known := true
	switch {
	case c.all.Charges[j].Debit && !r.Allowed && r.Over > 0:
		// Counted past the limit, by r.Over.
		after = limit + r.Over
		before = after - n
	case c.all.Charges[j].Debit && !r.Allowed:
		// Counted past the limit by a rule that does not say how far
		// (an Admit extension's): over, as it was before.
		after, known = limit+1, false
	case r.Allowed && (c.dec.Allowed || c.all.Charges[j].Debit):
		after = limit - r.Remaining
		before = after - n
	default:
		// Not counted (another descriptor refused, or this one): what it
		// reports is the count before.
		before = limit - r.Remaining
		after = before + n
	}
	stats.hit(key, uint64(limit), uint64(max(before, 0)), uint64(max(after, 0)), h, known, l.Shadow)
}
