package policy

import "github.com/admitdev/admit"

// The types in this file are policy as people write it: in the YAML
// configuration (decoded by cmd/admit) and in the admin API's JSON bodies.
// Both use the JSON field names. Compile turns them into a Policy.

// Spec is the whole policy: the rules every request is charged against, the
// tiers, the tenants and the defaults.
type Spec struct {
	// UnknownTenant is "deny" (or empty) to refuse requests that name a
	// tenant the catalog does not know, or the name of the tier such
	// tenants get.
	UnknownTenant string `json:"unknown_tenant,omitempty"`
	// Shadow puts every rule in shadow mode: decided and recorded, never
	// refusing.
	Shadow bool `json:"shadow,omitempty"`
	// OnError is the failure mode of rules that name none: "open" (the
	// default), "closed" or "local".
	OnError string `json:"on_error,omitempty"`
	// AnonymousWeight is the weight of the anonymous callers (requests
	// that name no tenant, or a tenant only a default tier knows, without
	// a credential that vouches for it) in the limits tenants share: one
	// class, whose part each client address shares equally. Default 1.
	AnonymousWeight int64 `json:"anonymous_weight,omitempty"`

	Global  []RuleSpec            `json:"global,omitempty"`
	Tiers   map[string]TierSpec   `json:"tiers,omitempty"`
	Tenants map[string]TenantSpec `json:"tenants,omitempty"`

	// CheckRule, if set, reports whether the store that decides the
	// policy can decide a rule, fair telling whether tenants share it
	// divided fairly: a rule it refuses is an error of the policy, at the
	// rule's field the error names (or its algorithm). The Redis store
	// refuses what it cannot decide exactly, and a region what it cannot
	// hold across regions. The catalog checks the changes made through it
	// (the admin API) so, not the ones it loads, which another server
	// accepted: those a store refuses at their decisions.
	CheckRule func(r *admit.Rule, fair bool) error `json:"-"`
}

// RuleSpec is a rule as written: its name, which requests it applies to, its
// algorithm and parameters, all as text where the configuration has text
// (rates like "100/s", durations like "30s").
//
// In a tenant's overrides, a RuleSpec names a rule of the tenant's tier and
// sets only the parameters to replace (rate, burst, initial, floor, limit,
// window, max, lease_ttl, max_cost, shadow, on_error, distribution).
type RuleSpec struct {
	Name      string   `json:"name"`
	Scope     string   `json:"scope,omitempty"`
	Actions   []string `json:"actions,omitempty"`
	PerAction bool     `json:"per_action,omitempty"`
	Algorithm string   `json:"algorithm,omitempty"`

	Rate     string `json:"rate,omitempty"`
	Burst    *int64 `json:"burst,omitempty"`
	Initial  *int64 `json:"initial,omitempty"`
	Floor    string `json:"floor,omitempty"`
	Limit    *int64 `json:"limit,omitempty"`
	Window   string `json:"window,omitempty"`
	Max      *int64 `json:"max,omitempty"`
	LeaseTTL string `json:"lease_ttl,omitempty"`

	// Quota: Period (day, week, month, year), TimeZone (an IANA name;
	// UTC by default) and Anchor: "calendar" (the default: midnight,
	// Monday, the 1st, January 1st), "billing" (the tenant's
	// billing_anchor, the calendar's for a tenant without one), or a date
	// (2026-01-15) or RFC 3339 time whose position in its period starts
	// every period.
	Period   string `json:"period,omitempty"`
	TimeZone string `json:"time_zone,omitempty"`
	Anchor   string `json:"anchor,omitempty"`

	// MaxCost bounds the cost of one check, debit or report charged to
	// the rule (a larger one is refused as invalid); by default the
	// rule's capacity: its burst, limit or max.
	MaxCost *int64 `json:"max_cost,omitempty"`
	// MaxDebt bounds what a token_bucket or gcra rule owes after debits,
	// in its units: by default one burst, and for a rule in tokens all it
	// can repay in 100 years (what an LLM call used beyond its
	// reservation is owed in full).
	MaxDebt *int64 `json:"max_debt,omitempty"`

	// Unit is what the rule counts: "requests" (the default), "tokens"
	// (LLM tokens, each kind weighed by Weights) or "money" (the cost of
	// LLM calls at the configured prices; the rule's limit is then
	// Budget). Rules in tokens or money are charged by LLM calls only,
	// all or nothing with the request rules they pass.
	Unit string `json:"unit,omitempty"`
	// Weights weigh the token kinds of a rule in tokens (input,
	// cached_input, cache_write, output, reasoning), as decimal numbers
	// like "0.25"; kinds not named weigh 1.
	Weights map[string]string `json:"weights,omitempty"`
	// Budget is the limit of a rule in money, in the prices' currency,
	// like "0.01" (at most 6 decimals, at most 4000).
	Budget string `json:"budget,omitempty"`
	// PerModel gives every LLM model its own bucket. A request that
	// names no model is not charged to such a rule.
	PerModel bool `json:"per_model,omitempty"`

	Shadow  *bool  `json:"shadow,omitempty"`
	OnError string `json:"on_error,omitempty"`
	// Distribution is "exact" (the default) or "leased": see
	// admit.Distribution.
	Distribution string `json:"distribution,omitempty"`

	// FairShare divides a limit that tenants share (a global rule of
	// scope global, ip or an attribute, or a tier's rule of scope global)
	// among the tenants that want it, by their weights, so that none
	// takes what the others want (see admit.Share). It is the default for
	// such rules; false makes the rule first come, first served.
	FairShare *bool `json:"fair_share,omitempty"`
	// ShareCeiling bounds what one tenant takes of a shared rule beyond
	// its share: the slots of a concurrency rule it holds, and, while no
	// other tenant asks, the part of a bucket's burst or a window's limit
	// it takes at once (its rate is the rule's). A number of the rule's
	// units, or a percentage of its capacity such as "50%" (the default
	// of rules of scope global and of concurrency rules; a rule keyed by
	// an address or an attribute, mostly one client's, takes 100%), so
	// that a tenant arriving later finds its share at once.
	ShareCeiling string `json:"share_ceiling,omitempty"`
}

// TierSpec is a tier: its rules and its WebSocket gateway settings.
type TierSpec struct {
	Rules   []RuleSpec   `json:"rules,omitempty"`
	Gateway *GatewaySpec `json:"gateway,omitempty"`
	// Weight is the tier's tenants' weight in the limits tenants share
	// (see RuleSpec.FairShare), from 1 to bounds.MaxShareWeight; default 1.
	Weight int64 `json:"weight,omitempty"`
	// LLMInFlight bounds each of the tier's tenants' LLM calls in flight
	// through one admit proxy, from 1 to 100,000; default 100.
	LLMInFlight int64 `json:"llm_in_flight,omitempty"`
}

// GatewaySpec holds a tier's WebSocket gateway settings. Zero
// values take the defaults documented on Gateway.
type GatewaySpec struct {
	TenantConnections     int64  `json:"tenant_connections,omitempty"`
	ConnectionsPerSession int64  `json:"connections_per_session,omitempty"`
	TenantPerMinute       int64  `json:"tenant_per_minute,omitempty"`
	SessionPerMinute      int64  `json:"session_per_minute,omitempty"`
	SessionTTL            string `json:"session_ttl,omitempty"`
	MessagesPerMinute     int64  `json:"messages_per_minute,omitempty"`
	TenantSessions        int64  `json:"tenant_sessions,omitempty"`
}

// TenantSpec is a tenant: its tier, the overrides of that tier's rules and
// the SHA-256 hashes (hex) of its API keys.
type TenantSpec struct {
	Tier      string     `json:"tier"`
	Overrides []RuleSpec `json:"overrides,omitempty"`
	// BillingAnchor is the date (2026-01-15) the tenant's billing periods
	// start from: its quotas with anchor "billing" run from that day of
	// each month (the month's last day when it has fewer), or week or
	// year, in the quota's time zone.
	BillingAnchor string `json:"billing_anchor,omitempty"`
	// Weight overrides the tier's weight for this tenant in the limits
	// tenants share; 0 keeps the tier's.
	Weight        int64    `json:"weight,omitempty"`
	APIKeysSHA256 []string `json:"api_keys_sha256,omitempty"`
}
