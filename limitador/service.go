package limitador

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/limitador/kuadrantpb"
	"github.com/admitdev/admit/policy"
)

// Bounds on one request's descriptors, as Envoy's rate limit service
// bounds them in Admit.
const (
	MaxDescriptors = 64   // descriptors of a request
	MaxEntries     = 32   // entries of a descriptor, or values of an HTTP request
	MaxEntryLen    = 1024 // bytes of an entry's key or value
)

// Headers says which rate limit headers the answers carry.
type Headers uint8

const (
	// HeadersNone adds none, Limitador's default.
	HeadersNone Headers = 0
	// HeadersDraft03 adds X-RateLimit-Limit, -Remaining and -Reset as
	// Limitador's DRAFT_VERSION_03 writes them: the most restrictive
	// counter's limit, then every counter's "max;w=seconds" (and
	// ;name="…"), what that counter has left, and the seconds to its
	// reset.
	HeadersDraft03 Headers = 1 << iota
	// HeadersIETF adds the IETF RateLimit-Policy and RateLimit fields,
	// one item per counter.
	HeadersIETF
)

// ParseHeaders reads a header setting: NONE, DRAFT_VERSION_03 (as
// Limitador's --rate-limit-headers takes them), IETF, or
// DRAFT_VERSION_03,IETF for both.
func ParseHeaders(s string) (Headers, error) {
	var h Headers
	for _, part := range strings.Split(s, ",") {
		switch strings.ToUpper(strings.TrimSpace(part)) {
		case "", "NONE":
		case "DRAFT_VERSION_03", "DRAFTVERSION03":
			h |= HeadersDraft03
		case "IETF":
			h |= HeadersIETF
		default:
			return 0, admit.Errorf(admit.CodeInvalid, "rate limit headers %q: want NONE, DRAFT_VERSION_03, IETF or DRAFT_VERSION_03,IETF", part)
		}
	}
	return h, nil
}

// Service answers the Envoy rate limit service's ShouldRateLimit, and
// Kuadrant's CheckRateLimit and Report, for the namespaces of a Limiter's
// limits, as limitador-server answers them.
type Service struct {
	kuadrantpb.UnimplementedRateLimitServiceServer

	lim     *Limiter
	headers Headers
}

// NewService returns a Service over lim, whose ShouldRateLimit answers
// carry headers.
func NewService(lim *Limiter, headers Headers) *Service {
	return &Service{lim: lim, headers: headers}
}

var _ kuadrantpb.RateLimitServiceServer = (*Service)(nil)

// Owns reports whether domain is a namespace of the limits in force: its
// requests are the Service's. So is a request without a domain, which
// Limitador answers UNKNOWN (Envoy lets it through).
func (s *Service) Owns(domain string) bool { return domain == "" || s.lim.Owns(domain) }

// ShouldRateLimit decides req as Limitador does: every limit of its
// domain that applies is counted hits_addend (1 when it is 0, as Envoy
// leaves it unset) if all of them can take it, and the answer is
// OVER_LIMIT otherwise, with no descriptor statuses. A store failure is
// UNAVAILABLE, for Envoy's failure_mode_deny to decide.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.answer(ctx, CheckAndReport, req)
}

// CheckRateLimit answers whether req's limits could count 1, counting
// nothing.
func (s *Service) CheckRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.answer(ctx, Check, req)
}

// Report counts req's hits_addend (1 when it is 0) on every limit that
// applies, within it or not, and answers OK.
func (s *Service) Report(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.answer(ctx, Report, req)
}

func (s *Service) answer(ctx context.Context, mode Mode, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ns := req.GetDomain()
	if ns == "" {
		// Limitador answers a request without a domain UNKNOWN.
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_UNKNOWN}, nil
	}
	ds, err := descriptorsOf(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	delta := uint64(req.GetHitsAddend())
	if delta == 0 {
		delta = 1
	}
	if mode == Check {
		delta = 1 // Kuadrant's check asks whether one more fits
	}
	headers := mode == CheckAndReport && s.headers != HeadersNone
	res, err := s.lim.Decide(ctx, mode, ns, ds, delta, headers)
	if err != nil {
		if admit.ErrorCode(err) == admit.CodeUnavailable {
			s.lim.opts.Metrics.SetPartitioned(true)
		}
		if admit.ErrorCode(err) == admit.CodeInvalid {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, status.Error(codes.Unavailable, "Service unavailable")
	}
	s.lim.opts.Metrics.SetPartitioned(res.Outcome != policy.Stored)
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	m := s.lim.opts.Metrics
	switch {
	case mode == Report:
		m.authorized(ns, false, delta)
	case res.Limited:
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		m.limited(ns, res.LimitName)
	case mode == Check:
		m.authorized(ns, true, 0)
	default:
		m.authorized(ns, true, delta)
	}
	if headers {
		// Sorted by name, as Limitador sorts them.
		h := http.Header{}
		setHeaders(h, s.headers, res.Counters)
		keys := make([]string, 0, len(h))
		for k := range h {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: k, Value: h[k][0]})
		}
	}
	return resp, nil
}

// descriptorsOf returns req's descriptors as maps of their entries (a
// key given twice keeps its last value, as Limitador keeps it), within
// the bounds.
func descriptorsOf(req *rlsv3.RateLimitRequest) ([]map[string]string, error) {
	in := req.GetDescriptors()
	if len(in) > MaxDescriptors {
		return nil, admit.Errorf(admit.CodeInvalid, "%d descriptors; a request has at most %d", len(in), MaxDescriptors)
	}
	out := make([]map[string]string, len(in))
	for i, d := range in {
		es := d.GetEntries()
		if len(es) > MaxEntries {
			return nil, admit.Errorf(admit.CodeInvalid, "descriptor %d has %d entries; at most %d", i, len(es), MaxEntries)
		}
		m := make(map[string]string, len(es))
		for _, e := range es {
			if len(e.GetKey()) > MaxEntryLen || len(e.GetValue()) > MaxEntryLen {
				return nil, admit.Errorf(admit.CodeInvalid, "descriptor %d: an entry's key or value is longer than %d bytes", i, MaxEntryLen)
			}
			m[e.GetKey()] = e.GetValue()
		}
		out[i] = m
	}
	return out, nil
}

// setHeaders sets the rate limit headers of counters on h, under the
// names Limitador writes (X-RateLimit-Limit, not Go's canonical
// X-Ratelimit-Limit: Envoy passes the name on as it is given).
func setHeaders(h http.Header, which Headers, counters []Counter) {
	if len(counters) == 0 {
		return
	}
	sorted := slices.Clone(counters)
	// By what is left, least first, as Limitador sorts them (stably).
	slices.SortStableFunc(sorted, func(a, b Counter) int {
		switch {
		case a.Remaining < b.Remaining:
			return -1
		case a.Remaining > b.Remaining:
			return 1
		}
		return 0
	})
	if which&HeadersDraft03 != 0 {
		first := sorted[0]
		var b strings.Builder
		b.WriteString(strconv.FormatInt(first.Limit.MaxValue, 10))
		for _, c := range sorted {
			b.WriteString(", ")
			b.WriteString(strconv.FormatInt(c.Limit.MaxValue, 10))
			b.WriteString(";w=")
			b.WriteString(strconv.FormatInt(c.Limit.windowSeconds(), 10))
			if c.Limit.Name != "" {
				b.WriteString(`;name="`)
				b.WriteString(strings.ReplaceAll(c.Limit.Name, `"`, "'"))
				b.WriteString(`"`)
			}
		}
		h["X-RateLimit-Limit"] = []string{b.String()}
		h["X-RateLimit-Remaining"] = []string{strconv.FormatInt(first.Remaining, 10)}
		h["X-RateLimit-Reset"] = []string{strconv.FormatInt(resetSeconds(first.ExpiresIn), 10)}
	}
	if which&HeadersIETF != 0 {
		rules := make([]*policy.Rule, len(sorted))
		charges := make([]admit.Charge, len(sorted))
		results := make([]admit.Result, len(sorted))
		for i, c := range sorted {
			rules[i] = c.Limit.rule
			charges[i] = admit.Charge{Key: c.key}
			results[i] = admit.Result{Limit: c.Limit.MaxValue, Remaining: c.Remaining, ResetAfter: c.ExpiresIn}
		}
		h["RateLimit-Policy"] = []string{string(httpx.AppendPolicy(nil, rules, charges, results))}
		h["RateLimit"] = []string{string(httpx.AppendLimit(nil, rules, charges, results))}
	}
}

// resetSeconds is the whole seconds to a counter's reset, as Limitador
// reports them: rounded down from a time it measured a moment after the
// counter was read, so a window of 60 s that just began says 59.
func resetSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d - 1) / time.Second)
}

// windowSeconds is the w of the limit's counters: its seconds, or a
// quota's nominal period.
func (l *Limit) windowSeconds() int64 {
	if l.Algorithm == Quota {
		switch l.Period {
		case "day":
			return 86400
		case "week":
			return 7 * 86400
		case "month":
			return 30 * 86400
		}
		return 365 * 86400
	}
	return l.Seconds
}
