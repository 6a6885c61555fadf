// Package httpx holds what Admit's HTTP front ends (httplimit, the
// server, the LLM proxy) do alike: the RateLimit and RateLimit-Policy
// fields (draft-ietf-httpapi-ratelimit-headers), Retry-After's rounding,
// and the refusal of JSON bodies that hold a key twice.
package httpx

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/units"
)

// The fields follow draft-ietf-httpapi-ratelimit-headers: each is a
// Structured Field List (RFC 9651) of one Item per non-shadow charge of
// the decision, the rule's name as a String, with Parameters:
//
//	RateLimit-Policy: "burst";q=100;w=60;pk=:...:, "slots";q=5;qu="concurrent-requests";pk=:...:
//	RateLimit: "burst";r=42;t=35;pk=:...:, "slots";r=4;t=0;pk=:...:
//
// RateLimit-Policy's q is the quota, qu its unit when it is not requests,
// w the seconds over which the quota is granted (none for concurrency);
// RateLimit's r is what remains, t the seconds until it is whole again.
// pk, in both, is the partition: a hash of the bucket's key (see
// appendPartition).

// Units of the qu parameter. "concurrent-requests" is the draft's own;
// LLM tokens and money have no unit in the draft's registry, so they are
// named as the draft asks of what is an implementation's own, prefixed
// with its vendor's name, rather than left out: a qu left out means
// requests, which they are not. Money counts millionths of the currency
// the LLM prices are in.
const (
	unitConcurrent = "concurrent-requests"
	unitTokens     = "admit-tokens"
	unitMoney      = "admit-money"
)

// maxInteger is the largest Integer of a structured field (RFC 9651
// allows 15 decimal digits); larger values are written as it.
const maxInteger = 999_999_999_999_999

// partitionBytes is how much of the SHA-256 of a key pk shows: 72 bits,
// twelve characters of base64 with no padding.
const partitionBytes = 9

// SetHeaders sets the RateLimit-Policy and RateLimit fields of a policy's
// decision on h (neither when no non-shadow charge is reported), and
// returns buf for reuse. rules, charges and results are index by index,
// as in policy.Resolution and admit.Decision; charges give the partitions
// (nil omits them).
func SetHeaders(h http.Header, buf []byte, rules []*policy.Rule, charges []admit.Charge, results []admit.Result) []byte {
	return setHeaders(h, buf, policyCharges{rules, charges}, results)
}

// SetLimiterHeaders is SetHeaders for d, a decision of an admit.Limiter
// whose limits are rules.
func SetLimiterHeaders(h http.Header, buf []byte, rules []*admit.Rule, d *admit.Decision) []byte {
	return setHeaders(h, buf, limiterCharges{rules, d}, d.Results)
}

// AppendPolicy appends the RateLimit-Policy field value of a policy's
// decision, as SetHeaders sets it.
func AppendPolicy(b []byte, rules []*policy.Rule, charges []admit.Charge, results []admit.Result) []byte {
	return appendPolicy(b, policyCharges{rules, charges}, results)
}

// AppendLimit appends the RateLimit field value of a policy's decision,
// as SetHeaders sets it.
func AppendLimit(b []byte, rules []*policy.Rule, charges []admit.Charge, results []admit.Result) []byte {
	return appendLimit(b, policyCharges{rules, charges}, results)
}

// charges are the charges of a decision as the fields need them: by
// index, the rule, its unit and the charge's key ("" for none).
type charges interface {
	len() int
	at(i int) (r *admit.Rule, u units.Unit, key string)
}

// policyCharges are a policy's: its rules carry their units.
type policyCharges struct {
	rules   []*policy.Rule
	charges []admit.Charge
}

func (c policyCharges) len() int { return len(c.rules) }

func (c policyCharges) at(i int) (*admit.Rule, units.Unit, string) {
	key := ""
	if i < len(c.charges) {
		key = c.charges[i].Key
	}
	r := c.rules[i]
	return &r.Rule, r.Unit, key
}

// limiterCharges are a Limiter's, whose limits count requests.
type limiterCharges struct {
	rules []*admit.Rule
	d     *admit.Decision
}

func (c limiterCharges) len() int { return len(c.rules) }

func (c limiterCharges) at(i int) (*admit.Rule, units.Unit, string) {
	return c.rules[i], units.UnitRequests, c.d.Key(i)
}

// setHeaders is generic over the kind of charges rather than taking the
// interface, so that each kind's calls are direct and nothing escapes:
// the fields' strings are all it allocates.
func setHeaders[C charges](h http.Header, buf []byte, c C, results []admit.Result) []byte {
	buf = appendPolicy(buf[:0], c, results)
	if len(buf) == 0 {
		return buf
	}
	h.Set("RateLimit-Policy", string(buf))
	buf = appendLimit(buf[:0], c, results)
	h.Set("RateLimit", string(buf))
	return buf
}

func appendPolicy[C charges](b []byte, c C, results []admit.Result) []byte {
	start := len(b)
	for i := range min(c.len(), len(results)) {
		r, unit, key := c.at(i)
		if r.Shadow {
			continue
		}
		b = appendName(b, start, r.Name)
		b = append(b, ";q="...)
		b = appendInteger(b, results[i].Limit)
		switch {
		case r.Algorithm == admit.Concurrency:
			b = append(b, `;qu="`+unitConcurrent+`"`...)
		case unit == units.UnitTokens:
			b = append(b, `;qu="`+unitTokens+`"`...)
		case unit == units.UnitMoney:
			b = append(b, `;qu="`+unitMoney+`"`...)
		}
		if w := window(r); w > 0 {
			b = append(b, ";w="...)
			b = appendInteger(b, w)
		}
		b = appendPartition(b, key)
	}
	return b
}

func appendLimit[C charges](b []byte, c C, results []admit.Result) []byte {
	start := len(b)
	for i := range min(c.len(), len(results)) {
		r, _, key := c.at(i)
		if r.Shadow {
			continue
		}
		res := &results[i]
		b = appendName(b, start, r.Name)
		b = append(b, ";r="...)
		b = appendInteger(b, res.Remaining)
		b = append(b, ";t="...)
		b = appendInteger(b, CeilDiv(res.ResetAfter, time.Second))
		b = appendPartition(b, key)
	}
	return b
}

// appendName appends an Item's String: the rule's name, quoted, after the
// list's separator unless it is the first (b holds nothing past start).
// Policy names are letters, digits and . _ : @ -; a Limiter's may be
// anything, so a quote or a backslash is escaped, and a byte a String
// cannot hold (a control or one past ASCII) is written as '?'.
func appendName(b []byte, start int, name string) []byte {
	if len(b) > start {
		b = append(b, ", "...)
	}
	b = append(b, '"')
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// appendInteger appends v as an Integer, from 0 to maxInteger: the fields'
// counts and seconds are never negative.
func appendInteger(b []byte, v int64) []byte {
	return strconv.AppendInt(b, min(max(v, 0), maxInteger), 10)
}

// appendPartition appends the pk parameter of a charge's key: a Byte
// Sequence of the first bytes of the key's SHA-256, or nothing when the
// charge has no key. The key names the caller (tenant, user, API key,
// address) and the rule; its hash shows none of it, yet is the same for
// the same bucket on every server and from one release to the next, so
// that a client can tell which of its requests share a quota. A hash does
// not hide a key from someone who can guess it whole, but every part of
// it is the caller's own or the rule's, which the field names anyway.
func appendPartition(b []byte, key string) []byte {
	if key == "" {
		return b
	}
	// The key is hashed from b's spare room, not from a []byte(key) that
	// would be allocated for each long key.
	n := len(b)
	b = append(b, key...)
	sum := sha256.Sum256(b[n:])
	b = append(b[:n], ";pk=:"...)
	b = base64.StdEncoding.AppendEncode(b, sum[:partitionBytes])
	return append(b, ':')
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
