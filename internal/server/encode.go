package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/problem"
)

// The answers of the decision endpoints are written with append functions
// rather than encoding/json: they are on the hot path, and their shape is
// fixed.

func ms(d time.Duration) int64 { return httpx.CeilDiv(d, time.Millisecond) }

// appendDecision appends the JSON answer of a decision. A refusal's is a
// problem (RFC 9457) of type quota-exceeded as well, whose extension
// members are the decision's: its type, title, status, detail and
// violated-policies come first.
func appendDecision(b []byte, c *call, claim string, waited time.Duration, overLimit bool) []byte {
	d := &c.d
	if d.Allowed {
		b = append(b, `{"allowed":true`...)
	} else {
		b = appendRefusal(b, d)
		b = append(b, `,"allowed":false`...)
	}
	if overLimit {
		b = append(b, `,"over_limit":true`...)
	}
	b = appendIntField(b, "limit", d.Limit)
	b = appendIntField(b, "remaining", d.Remaining)
	b = appendIntField(b, "reset_after_ms", ms(d.ResetAfter))
	b = appendIntField(b, "retry_after_ms", ms(d.RetryAfter))
	b = append(b, `,"denied_by":`...)
	b = appendString(b, d.DeniedBy)
	if waited >= 0 {
		b = appendIntField(b, "waited_ms", ms(waited))
	}
	if f := failoverName(c.out); f != "" {
		b = append(b, `,"failover":"`...)
		b = append(b, f...)
		b = append(b, '"')
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
	first := true
	for r, res := range policy.RuleResults(c.res.Rules, d.Results) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendRule(b, r, res, !c.req.Untrusted)
	}
	return append(b, "]}\n"...)
}

// appendRefusal opens the problem of a refused decision with its
// standard members and violated-policies.
func appendRefusal(b []byte, d *admit.Decision) []byte {
	typ := problem.RefusalType(d.DeniedBy)
	b = append(b, `{"type":"`...)
	b = append(b, typ...)
	b = append(b, `","title":`...)
	b = appendString(b, problem.Title(typ, http.StatusTooManyRequests))
	b = append(b, `,"status":429,"detail":`...)
	b = appendString(b, "rate limited by "+strconv.Quote(d.DeniedBy)+"; retry after "+strconv.FormatInt(ms(d.RetryAfter), 10)+" ms")
	b = append(b, `,"violated-policies":[`...)
	for i, name := range problem.Violated(d) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, name)
	}
	return append(b, ']')
}

// appendRule appends one rule's entry. What a limit tenants share holds
// is shown to the platform's callers only (trusted): to anyone else it
// would tell how busy the other tenants are.
func appendRule(b []byte, r *policy.Rule, res *admit.Result, trusted bool) []byte {
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
	if r.Fair {
		// A limit tenants share: remaining is what the caller's class
		// may still take, shared_remaining what the limit holds.
		if res.Share != admit.ShareNone {
			b = append(b, `,"share":"`...)
			b = append(b, res.Share.String()...)
			b = append(b, '"')
		}
		if trusted {
			b = appendIntField(b, "shared_remaining", res.Shared)
		}
	}
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
