package envoyrls

import (
	"maps"
	"math"
	"slices"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/policy"
)

// respond writes into resp each descriptor's status, the overall code, and
// the headers and metadata the options ask for.
func (s *Service) respond(resp *rlsv3.RateLimitResponse, req *rlsv3.RateLimitRequest, c *call, out policy.Outcome, quotas int) {
	now := s.opts.Now()
	groups := s.opts.QuotaAnswers == QuotaGroups
	best, bestRemaining := -1, int64(math.MaxInt64)
	// violations are the quota descriptors over their limit; passed, the
	// descriptors with a limit that passed it (QuotaGroups' metadata).
	var violations, passed []int
	// The descriptor envoyproxy/ratelimit's own headers describe: the last
	// over its limit (a quota's aside), else the first with the least
	// remaining.
	limited, limitedRemaining := -1, uint32(math.MaxUint32)
	for i := range c.descs {
		st, over := s.status(c, &c.descs[i], out, now)
		quota := c.isQuota(&c.descs[i])
		if l := c.descs[i].limit; l != nil && l.Shadow {
			over = false // reported OK, a shadow limit's quota is never over
		}
		if st.CurrentLimit != nil && st.LimitRemaining < limitedRemaining {
			limited, limitedRemaining = i, st.LimitRemaining
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && (!quota || !groups && !c.each) {
			limited, limitedRemaining = i, 0
		}
		if s.opts.Stats != nil {
			s.countStats(req, c, i, out)
		}
		switch {
		case over && quota && groups:
			// As envoyproxy/ratelimit answers a quota over its limit
			// since spring 2026: over, with its reset; whether the
			// request is depends on its group and the others.
			violations = append(violations, i)
			st.Code, st.LimitRemaining = rlsv3.RateLimitResponse_OVER_LIMIT, 0
		case over && quota:
			violations = append(violations, i)
			if c.each {
				// As its main of 2026-01-22 answers a quota over its
				// limit: reported (here and in the metadata), never
				// refusing.
				st = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: st.CurrentLimit, LimitRemaining: st.LimitRemaining}
			}
		case st.Code == rlsv3.RateLimitResponse_OK && c.descs[i].kind != kindUnlimited:
			passed = append(passed, i)
		}
		resp.Statuses[i] = st
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && !(quota && groups) {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if st.CurrentLimit != nil && int64(st.LimitRemaining) < bestRemaining {
			best, bestRemaining = i, int64(st.LimitRemaining)
		}
	}
	switch {
	case groups && quotas > 0 && c.groupsAllOver(violations):
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	case !groups && quotas > 0 && len(violations) == quotas && !c.each:
		// Every quota descriptor is over: the request is (Admit's
		// quota mode, with charge: all).
		for _, i := range violations {
			resp.Statuses[i].Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && s.opts.GlobalShadow {
		resp.OverallCode = rlsv3.RateLimitResponse_OK
		if s.opts.Stats != nil {
			s.opts.Stats.Add("ratelimit.service.global_shadow_mode", 1)
		}
	}
	if s.opts.ResponseHeaders && best >= 0 {
		resp.ResponseHeadersToAdd = rateLimitHeaders(resp.Statuses, best)
	}
	if h := s.opts.LimitHeaders; h != nil && limited >= 0 {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, limitHeaders(h, resp.Statuses[limited], now)...)
	}
	if s.opts.DynamicMetadata {
		f := requestMetadata(req)
		if groups {
			c.passedMetadata(f, req, passed, violations)
		} else {
			quotaViolations(f, violations, quotas > 0)
		}
		resp.DynamicMetadata = &structpb.Struct{Fields: f}
	}
}

// groupsAllOver reports whether every quota group has a descriptor among
// violations.
func (c *call) groupsAllOver(violations []int) bool {
	over := 0
	for n, i := range violations {
		if !slices.ContainsFunc(violations[:n], func(j int) bool { return c.group[j] == c.group[i] }) {
			over++
		}
	}
	return over == c.groups
}

// passedMetadata adds to f what envoyproxy/ratelimit's dynamic metadata
// says of the descriptors that passed since spring 2026: their limits'
// metadata blocks merged (the first descriptor's value kept where two
// say), and passedBackends, the backend and model pairs they name. A
// passed descriptor of an exhausted quota group is left out of both.
func (c *call) passedMetadata(f map[string]*structpb.Value, req *rlsv3.RateLimitRequest, passed, violations []int) {
	merged := map[string]*structpb.Value{}
	var backends []*structpb.Value
	var seen []string
	for _, i := range passed {
		if g := c.group[i]; g != "" && slices.ContainsFunc(violations, func(j int) bool { return c.group[j] == g }) {
			continue
		}
		if l := c.descs[i].limit; l != nil && l.Metadata != nil {
			mergeStruct(merged, l.Metadata.GetFields())
		}
		d := req.GetDescriptors()[i]
		backend, model, named := modelOf(d)
		if g := quotaGroup(d); named && !slices.Contains(seen, g) {
			seen = append(seen, g)
			backends = append(backends, structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				EntryBackendName: structpb.NewStringValue(backend), EntryModelNameOverride: structpb.NewStringValue(model),
			}}))
		}
	}
	if len(merged) > 0 {
		f["metadata"] = structpb.NewStructValue(&structpb.Struct{Fields: merged})
	}
	if c.groups > 0 && len(backends) > 0 {
		f["passedBackends"] = structpb.NewListValue(&structpb.ListValue{Values: backends})
	}
}

// mergeStruct adds src's fields to dst: a field dst lacks is src's (shared,
// never written through: it is a limit's), one both hold as structs is
// merged into a new struct, and dst keeps any other it has.
func mergeStruct(dst, src map[string]*structpb.Value) {
	for k, v := range src {
		d, ok := dst[k]
		if !ok {
			dst[k] = v
			continue
		}
		ds, ss := d.GetStructValue(), v.GetStructValue()
		if ds == nil || ss == nil {
			continue
		}
		m := maps.Clone(ds.GetFields())
		if m == nil {
			m = map[string]*structpb.Value{}
		}
		mergeStruct(m, ss.GetFields())
		dst[k] = structpb.NewStructValue(&structpb.Struct{Fields: m})
	}
}

// limitHeaders are envoyproxy/ratelimit's own headers for the status st:
// its limit, remaining, and the seconds left in the current period of its
// unit (the unit's multiplier aside, as upstream reckons it).
func limitHeaders(h *LimitHeaderNames, st *rlsv3.RateLimitResponse_DescriptorStatus, now time.Time) []*corev3.HeaderValue {
	per := int64(fromProtoUnit(st.CurrentLimit.Unit).Duration() / time.Second)
	reset := int64(0)
	if per > 0 {
		reset = per - now.Unix()%per
	}
	return []*corev3.HeaderValue{
		{Key: h.Limit, Value: strconv.FormatUint(uint64(st.CurrentLimit.RequestsPerUnit), 10)},
		{Key: h.Remaining, Value: strconv.FormatUint(uint64(st.LimitRemaining), 10)},
		{Key: h.Reset, Value: strconv.FormatInt(reset, 10)},
	}
}

// limitText writes a descriptor's limit override as envoyproxy/ratelimit's
// metadata shows it, "requests_per_unit:2 unit:MINUTE": by hand, since the
// protobuf text format (the peer's String) spaces its fields differently
// from one build to the next, on purpose, to keep callers from depending
// on its bytes; these are the same in every build.
func limitText(l *rlv3.RateLimitDescriptor_RateLimitOverride) string {
	return "requests_per_unit:" + strconv.FormatUint(uint64(l.GetRequestsPerUnit()), 10) + " unit:" + l.GetUnit().String()
}

// requestMetadata is what envoyproxy/ratelimit's dynamic metadata says of
// the request: the domain, the descriptors (entries as "key=value", limit
// and hitsAddend) and the request's hitsAddend.
func requestMetadata(req *rlsv3.RateLimitRequest) map[string]*structpb.Value {
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		entries := make([]*structpb.Value, len(d.GetEntries()))
		for i, e := range d.GetEntries() {
			entries[i] = structpb.NewStringValue(e.GetKey() + "=" + e.GetValue())
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if l := d.GetLimit(); l != nil {
			f["limit"] = structpb.NewStringValue(limitText(l))
		}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	f := map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(req.GetDomain()),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descs}),
	}
	if h := req.GetHitsAddend(); h != 0 {
		f["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	return f
}

// quotaViolations adds to f what envoyproxy/ratelimit's dynamic metadata
// said of quota descriptors at its main of 2026-01-22: quotaModeEnabled,
// and quotaModeViolations, the indexes of those over their limit.
func quotaViolations(f map[string]*structpb.Value, violations []int, quota bool) {
	f["quotaModeEnabled"] = structpb.NewBoolValue(quota)
	if len(violations) > 0 {
		vs := make([]*structpb.Value, len(violations))
		for i, v := range violations {
			vs[i] = structpb.NewNumberValue(float64(v))
		}
		f["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: vs})
	}
}

// status builds one descriptor's status from the decision, and says
// whether the descriptor is over its limit, refusing or not (a shadow or
// quota limit does not refuse).
func (s *Service) status(c *call, st *descState, out policy.Outcome, now time.Time) (*rlsv3.RateLimitResponse_DescriptorStatus, bool) {
	ok := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	switch st.kind {
	case kindNone:
		return ok, false
	case kindUnlimited:
		ok.LimitRemaining = math.MaxUint32
		return ok, false
	case kindRefuseAll:
		l := st.limit
		w := l.Window()
		code := rlsv3.RateLimitResponse_OVER_LIMIT
		if l.Shadow || l.Quota {
			code = rlsv3.RateLimitResponse_OK
		}
		return &rlsv3.RateLimitResponse_DescriptorStatus{
			Code: code, CurrentLimit: currentLimit(l.Name, 0, l.Unit, l.UnitMultiplier),
			DurationUntilReset: wholeSeconds(w - time.Duration(now.UnixNano())%w),
		}, true
	}
	if out == policy.FailedOpen || len(c.dec.Results) != len(c.all.Charges) {
		return ok, false // admitted without a decision: the store is down and the rules fail open
	}
	// As admit.Decision summarizes: the refusing charge that asks for the
	// longest wait, or when admitted the one with the fewest remaining.
	best, refused, over := -1, false, false
	for _, j := range c.refs[st.from:st.to] {
		r := &c.dec.Results[j]
		shadow := c.all.Charges[j].Rule.Shadow
		over = over || !r.Allowed || c.never[j]
		if (!r.Allowed || c.never[j]) && !shadow {
			if !refused || r.RetryAfter > c.dec.Results[best].RetryAfter {
				best = j
			}
			refused = true
			continue
		}
		if !refused && (best < 0 || !shadow && (c.all.Charges[best].Rule.Shadow || r.Remaining < c.dec.Results[best].Remaining)) {
			best = j
		}
	}
	r := &c.dec.Results[best]
	rule := c.all.Charges[best].Rule
	ds := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	if st.limit != nil {
		l := st.limit
		ds.CurrentLimit = currentLimit(l.Name, l.RequestsPerUnit, l.Unit, l.UnitMultiplier)
	} else {
		rpu, unit, mult := quota(rule)
		ds.CurrentLimit = currentLimit(rule.Name, rpu, unit, mult)
	}
	reset := r.ResetAfter
	if refused {
		ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		if r.RetryAfter > 0 {
			reset = r.RetryAfter
		}
	} else {
		remaining := r.Remaining
		if c.dry && !over {
			// A dry run reports what would remain after the request;
			// nothing was charged, so what remains is that and its cost.
			for _, j := range c.refs[st.from:st.to] {
				if &c.dec.Results[j] == r {
					remaining += c.all.Charges[j].Cost
				}
			}
		}
		ds.LimitRemaining = uint32(min(max(remaining, 0), math.MaxUint32))
	}
	ds.DurationUntilReset = wholeSeconds(reset)
	return ds, over
}

// banned makes resp the refusal of a request by ban: every descriptor
// over the limit until the ban ends, its limit named for the ban.
func banned(resp *rlsv3.RateLimitResponse, ban *policy.Ban, now time.Time) {
	resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{
			Code:               rlsv3.RateLimitResponse_OVER_LIMIT,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "ban:" + ban.ID, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
			DurationUntilReset: wholeSeconds(ban.Expires.Sub(now)),
		}
	}
}

// wholeSeconds is d rounded up to whole seconds, as envoyproxy/ratelimit
// sends duration_until_reset (never earlier than the reset).
func wholeSeconds(d time.Duration) *durationpb.Duration {
	return &durationpb.Duration{Seconds: int64((max(d, 0) + time.Second - 1) / time.Second)}
}

func currentLimit(name string, rpu uint32, unit Unit, mult uint32) *rlsv3.RateLimitResponse_RateLimit {
	l := &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: protoUnit(unit)}
	if mult > 1 {
		l.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	return l
}

// quota expresses an Admit rule as requests per unit: a window's limit per
// window, a bucket's burst per the time it takes to refill from empty, in
// the largest unit that divides that period.
func quota(r *admit.Rule) (uint32, Unit, uint32) {
	var n int64
	var per time.Duration
	switch r.Algorithm {
	case admit.TokenBucket, admit.GCRA, admit.Combination:
		n = r.Capacity()
		per = engine.SpanOf(r.Rate, r.Burst)
	default: // windows; concurrency rules never decide requests
		n, per = r.Limit, r.Window
	}
	n = min(n, math.MaxUint32)
	for u := Year; u > Second; u-- {
		if d := u.Duration(); per >= d && per%d == 0 {
			return uint32(n), u, uint32(min(int64(per/d), math.MaxUint32))
		}
	}
	secs := max(1, (per+time.Second-1)/time.Second)
	return uint32(n), Second, uint32(min(int64(secs), math.MaxUint32))
}

// rateLimitHeaders returns the X-RateLimit fields of draft 03 as Envoy
// writes them: the limit and remaining count of the status closest to its
// limit (best), and every limit's quota policy.
func rateLimitHeaders(sts []*rlsv3.RateLimitResponse_DescriptorStatus, best int) []*corev3.HeaderValue {
	b := sts[best]
	limit := strconv.AppendUint(nil, uint64(b.CurrentLimit.RequestsPerUnit), 10)
	for _, st := range sts {
		l := st.GetCurrentLimit()
		if l == nil {
			continue
		}
		w := unitSeconds(l)
		if w == 0 {
			continue
		}
		limit = append(limit, ", "...)
		limit = strconv.AppendUint(limit, uint64(l.RequestsPerUnit), 10)
		limit = append(limit, ";w="...)
		limit = strconv.AppendInt(limit, w, 10)
		if l.Name != "" {
			limit = append(limit, `;name="`...)
			limit = append(limit, l.Name...)
			limit = append(limit, '"')
		}
	}
	reset := int64(0)
	if d := b.GetDurationUntilReset(); d != nil {
		reset = d.GetSeconds()
		if d.GetNanos() > 0 {
			reset++ // whole seconds, never earlier than the reset
		}
	}
	return []*corev3.HeaderValue{
		{Key: "x-ratelimit-limit", Value: string(limit)},
		{Key: "x-ratelimit-remaining", Value: strconv.FormatUint(uint64(b.LimitRemaining), 10)},
		{Key: "x-ratelimit-reset", Value: strconv.FormatInt(reset, 10)},
	}
}

// unitSeconds returns a limit's period in seconds.
func unitSeconds(l *rlsv3.RateLimitResponse_RateLimit) int64 {
	u := fromProtoUnit(l.Unit)
	mult := int64(1)
	if m := l.GetUnitMultiplier(); m != nil && m.GetValue() > 0 {
		mult = int64(m.GetValue())
	}
	return int64(u.Duration()/time.Second) * mult
}

// protoUnits maps Unit to the protocol's unit, whose numbering differs
// (WEEK came last).
var protoUnits = [...]rlsv3.RateLimitResponse_RateLimit_Unit{
	rlsv3.RateLimitResponse_RateLimit_UNKNOWN, rlsv3.RateLimitResponse_RateLimit_SECOND,
	rlsv3.RateLimitResponse_RateLimit_MINUTE, rlsv3.RateLimitResponse_RateLimit_HOUR,
	rlsv3.RateLimitResponse_RateLimit_DAY, rlsv3.RateLimitResponse_RateLimit_WEEK,
	rlsv3.RateLimitResponse_RateLimit_MONTH, rlsv3.RateLimitResponse_RateLimit_YEAR,
}

func protoUnit(u Unit) rlsv3.RateLimitResponse_RateLimit_Unit {
	if int(u) < len(protoUnits) {
		return protoUnits[u]
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
}

// fromProtoUnit is protoUnit's inverse; UnitUnknown for other values.
func fromProtoUnit(p rlsv3.RateLimitResponse_RateLimit_Unit) Unit {
	for u, q := range protoUnits {
		if q == p {
			return Unit(u)
		}
	}
	return UnitUnknown
}
