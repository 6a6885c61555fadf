// Package bounds holds the numbers every part of Admit checks rules,
// charges and requests against: package admit when it validates a rule,
// the stores when they decide, the configuration loaders when they read.
// One home for them keeps every layer refusing at the same place.
package bounds

import (
	"time"

	"github.com/admitdev/admit/internal/wide"
)

// Bounds on rates. A rate is at most one event per nanosecond (1e9/s) and
// at least one event per year, so that every interval is a whole number of
// nanoseconds or more and every product of a count and a period fits the
// 128-bit intermediate arithmetic the algorithms use.
const (
	MaxRatePeriod = 366 * 24 * time.Hour // the longest Per, and the longest window
	MaxCount      = 4_000_000_000        // the largest burst, limit, max or rate count
	MaxCost       = 1_000_000_000        // the largest cost of one charge
)

// Bounds on what one rule may hold.
const (
	// MaxSlidingLogLimit caps a sliding log's limit: the log keeps one
	// timestamp per admitted unit of cost, so memory grows with the limit.
	MaxSlidingLogLimit = 10_000
	// MaxConcurrency caps a concurrency rule's max, for the same reason.
	MaxConcurrency = 100_000
	// MaxLeaseCost caps the slots one lease takes. A shared store keeps
	// a slot per unit of cost (Redis: a member of a sorted set each), so
	// taking, renewing and releasing a lease costs the store in
	// proportion: 60,000 slots held Redis for 130 ms, stalling every
	// tenant's decisions.
	MaxLeaseCost = 1000
	// MaxSpan bounds burst × interval of a bucket, so that a bucket's
	// theoretical arrival time stays far from the int64 nanosecond horizon.
	MaxSpan = 100 * 366 * 24 * time.Hour
	// DefaultLeaseTTL is a concurrency rule's lease TTL when it names none.
	DefaultLeaseTTL = 30 * time.Second
	// RememberFull is how long a store keeps a full token bucket whose
	// initial balance is below its burst. Such a bucket can never look like
	// a new one again, so it is forgotten this long after it filled up: a
	// day after its last use.
	RememberFull = 24 * time.Hour
)

// Bounds on a request.
const (
	// MaxCharges bounds the charges of one decision. A request resolves
	// to a handful of charges (global, tenant, user, action…); the bound
	// keeps a decision's locks, script arguments and stack buffers small.
	MaxCharges = 32
	// MaxWhoLen bounds each field of a Who, in bytes: the fields become
	// keys in the store, and a caller may take them from what clients
	// send.
	MaxWhoLen = 256
	// MaxShareWeight bounds a fair-share class's weight.
	MaxShareWeight = 10_000
	// MaxShareName bounds a share's class and sub-class names, in bytes.
	MaxShareName = 512
)

// Bounds on a policy's names and lists, so that one configuration or
// admin call cannot grow a policy without limit.
const (
	MaxNameLen      = 128 // tenant ids, tier and rule names
	MaxRulesPerTier = 64
	MaxGlobalRules  = 64
	MaxAPIKeys      = 100 // per tenant
	MaxActions      = 256 // per rule
)

// Bounds on what one request may carry.
const (
	MaxValueLen   = 256 // user, action, ip, api key, session, attribute values
	MaxAttributes = 16
)

// DefaultLLMInFlight is a tier's llm_in_flight when it sets none.
const DefaultLLMInFlight = 100

// MostDebt returns the largest debt a bucket refilling n tokens per per
// may owe: MaxCount tokens, or what it repays in 100 years if that is
// less.
func MostDebt(n int64, per time.Duration) int64 {
	if n <= 0 || per <= 0 {
		return 0
	}
	return min(wide.MulDiv(uint64(MaxSpan), uint64(n), uint64(per)), MaxCount)
}
