// Package httpx holds what Admit's HTTP front ends (httplimit, the
// server, the LLM proxy) do alike: the RateLimit and RateLimit-Policy
// fields (draft-ietf-httpapi-ratelimit-headers), Retry-After's rounding,
// and the refusal of JSON bodies that hold a key twice.
package httpx

import (
	"net/http"
	"strconv"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/policy"
)

// AppendPolicy appends the RateLimit-Policy field value
// (draft-ietf-httpapi-ratelimit-headers) of a decision: one item per
// non-shadow charge, named by its rule, with the quota q and, for rate
// limits, the window w in seconds over which the quota is granted. rules
// and results are index by index, as in policy.Resolution and
// admit.Decision.
func AppendPolicy(b []byte, rules []*policy.Rule, results []admit.Result) []byte {
	return appendItems(b, rules, policyRule, results, policyParams)
}

// AppendLimit appends the RateLimit field value of a decision: per
// non-shadow charge, the remaining quota r and the seconds t until it is
// whole again.
func AppendLimit(b []byte, rules []*policy.Rule, results []admit.Result) []byte {
	return appendItems(b, rules, policyRule, results, limitParams)
}

// SetHeaders sets the RateLimit-Policy and RateLimit fields of a decision
// on h (neither when no charge is reported), and returns buf for reuse.
func SetHeaders(h http.Header, buf []byte, rules []*policy.Rule, results []admit.Result) []byte {
	return setHeaders(h, buf, rules, policyRule, results)
}

// SetLimiterHeaders is SetHeaders for a decision of an admit.Limiter,
// whose rules are its limits'.
func SetLimiterHeaders(h http.Header, buf []byte, rules []*admit.Rule, results []admit.Result) []byte {
	return setHeaders(h, buf, rules, sameRule, results)
}

// The rules of a decision come as policy rules or as admit rules; these
// read the admit rule of either. Plain functions, not closures, so that
// writing the fields allocates nothing but the fields' strings.
func policyRule(r *policy.Rule) *admit.Rule { return &r.Rule }
func sameRule(r *admit.Rule) *admit.Rule    { return r }

func setHeaders[R any](h http.Header, buf []byte, rules []R, rule func(R) *admit.Rule, results []admit.Result) []byte {
	buf = appendItems(buf[:0], rules, rule, results, policyParams)
	if len(buf) == 0 {
		return buf
	}
	h.Set("RateLimit-Policy", string(buf))
	buf = appendItems(buf[:0], rules, rule, results, limitParams)
	h.Set("RateLimit", string(buf))
	return buf
}

// appendItems appends one list item per non-shadow charge: its rule's name,
// quoted, then what params appends.
func appendItems[R any](b []byte, rules []R, rule func(R) *admit.Rule, results []admit.Result, params func([]byte, *admit.Rule, *admit.Result) []byte) []byte {
	for i := range min(len(rules), len(results)) {
		r := rule(rules[i])
		if r.Shadow {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = append(b, '"')
		b = append(b, r.Name...)
		b = append(b, '"')
		b = params(b, r, &results[i])
	}
	return b
}

// policyParams are a RateLimit-Policy item's parameters: the quota and,
// for rate limits, the window.
func policyParams(b []byte, r *admit.Rule, res *admit.Result) []byte {
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, res.Limit, 10)
	if w := window(r); w > 0 {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, w, 10)
	}
	return b
}

// limitParams are a RateLimit item's parameters: what remains, and when
// it is whole again.
func limitParams(b []byte, _ *admit.Rule, res *admit.Result) []byte {
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, max(0, res.Remaining), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, CeilDiv(res.ResetAfter, time.Second), 10)
}

// window returns the seconds over which a rule grants its quota: the time a
// bucket takes to refill from empty, the window, or a quota's period in
// progress (a month of 28 to 31 days); 0 for concurrency.
func window(r *admit.Rule) int64 {
	switch r.Algorithm {
	case admit.Quota:
		start, end := engine.PeriodAt(r, time.Now())
		return CeilDiv(end.Sub(start), time.Second)
	case admit.TokenBucket, admit.GCRA, admit.Combination:
		return CeilDiv(engine.SpanOf(r.Rate, r.Burst), time.Second)
	case admit.Concurrency:
		return 0
	}
	return CeilDiv(r.Window, time.Second)
}

// RetrySeconds rounds a wait up to whole seconds, at least 1: Retry-After
// takes integer seconds, and a client told 0 would retry at once.
func RetrySeconds(d time.Duration) int64 {
	return max(1, CeilDiv(d, time.Second))
}

// CeilDiv returns d ÷ unit rounded up; 0 for d ≤ 0.
func CeilDiv(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	q := d / unit // not (d + unit - 1) / unit, which overflows near the largest d
	if d%unit != 0 {
		q++
	}
	return int64(q)
}
