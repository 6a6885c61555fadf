package server

import (
	"encoding/json"
	"math"
	"strconv"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/policy"
)

// The answers of the decision endpoints are written with append functions
// rather than encoding/json: they are on the hot path, and their shape is
// fixed.

// appendPolicyHeader appends the RateLimit-Policy field value
// (draft-ietf-httpapi-ratelimit-headers): one item per non-shadow charge,
// named by its rule, with the quota q and, for rate limits, the window w in
// seconds over which the quota is granted.
func appendPolicyHeader(b []byte, c *call) []byte {
	for i, r := range c.res.Rules {
		if r.Shadow {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = append(b, '"')
		b = append(b, r.Name...)
		b = append(b, `";q=`...)
		b = strconv.AppendInt(b, c.d.Results[i].Limit, 10)
		if w := window(&r.Rule); w > 0 {
			b = append(b, ";w="...)
			b = strconv.AppendInt(b, w, 10)
		}
	}
	return b
}

// appendLimitHeader appends the RateLimit field value: per non-shadow
// charge, the remaining quota r and the seconds t until it is whole again.
func appendLimitHeader(b []byte, c *call) []byte {
	for i, r := range c.res.Rules {
		if r.Shadow {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		res := &c.d.Results[i]
		b = append(b, '"')
		b = append(b, r.Name...)
		b = append(b, `";r=`...)
		b = strconv.AppendInt(b, max(0, res.Remaining), 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, ceilDiv(res.ResetAfter, time.Second), 10)
	}
	return b
}

// window returns the seconds over which a rule grants its quota: the time a
// bucket takes to refill from empty, or the window; 0 for concurrency.
func window(r *admit.Rule) int64 {
	switch r.Algorithm {
	case admit.TokenBucket, admit.GCRA, admit.Combination:
		// burst × Per / N in floating point: the product can pass 2^63,
		// and a header needs whole seconds only.
		return int64(math.Ceil(float64(r.Burst) * r.Rate.Per.Seconds() / float64(r.Rate.N)))
	case admit.Concurrency:
		return 0
	}
	return ceilDiv(r.Window, time.Second)
}

func ms(d time.Duration) int64 { return ceilDiv(d, time.Millisecond) }

// appendDecision appends the JSON answer of a decision.
func appendDecision(b []byte, c *call, claim string, waited time.Duration) []byte {
	d := &c.d
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	b = appendIntField(b, "limit", d.Limit)
	b = appendIntField(b, "remaining", d.Remaining)
	b = appendIntField(b, "reset_after_ms", ms(d.ResetAfter))
	b = appendIntField(b, "retry_after_ms", ms(d.RetryAfter))
	b = append(b, `,"denied_by":`...)
	b = appendString(b, d.DeniedBy)
	if waited >= 0 {
		b = appendIntField(b, "waited_ms", ms(waited))
	}
	if c.res.Tenant != nil {
		b = append(b, `,"tenant":`...)
		b = appendString(b, c.res.Tenant.ID)
		b = append(b, `,"tier":`...)
		b = appendString(b, c.res.Tenant.Tier.Name)
	}
	b = append(b, `,"claim_id":`...)
	b = appendString(b, claim)
	b = append(b, `,"rules":[`...)
	for i, r := range c.res.Rules {
		res := &d.Results[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = appendRule(b, r, res)
	}
	return append(b, "]}\n"...)
}

func appendRule(b []byte, r *policy.Rule, res *admit.Result) []byte {
	b = append(b, `{"name":`...)
	b = appendString(b, r.Name)
	b = append(b, `,"scope":`...)
	b = appendString(b, r.Scope)
	b = append(b, `,"algorithm":"`...)
	b = append(b, r.Algorithm.String()...)
	b = append(b, `","allowed":`...)
	b = strconv.AppendBool(b, res.Allowed)
	if res.Shadow {
		b = append(b, `,"shadow":true`...)
	}
	b = appendIntField(b, "limit", res.Limit)
	b = appendIntField(b, "remaining", res.Remaining)
	b = appendIntField(b, "reset_after_ms", ms(res.ResetAfter))
	b = appendIntField(b, "retry_after_ms", ms(res.RetryAfter))
	return append(b, '}')
}

func appendIntField(b []byte, name string, v int64) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return strconv.AppendInt(b, v, 10)
}

// appendString appends s as a JSON string. Plain printable ASCII, the
// usual case, is copied; anything else goes through encoding/json.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
