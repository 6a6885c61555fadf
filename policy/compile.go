package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/internal/ruletext"
	"github.com/admitdev/admit/units"
)

// FieldError is one problem in a Spec: the path of the field, in the
// configuration's terms ("tiers.free.rules[2].rate"), and what is wrong.
type FieldError struct {
	Path string
	Msg  string
}

// Error returns the path and the problem, "path: message".
func (e FieldError) Error() string { return e.Path + ": " + e.Msg }

// Errors lists every problem Compile found, in a stable order.
type Errors []FieldError

// Error returns every problem, joined by "; ".
func (e Errors) Error() string {
	parts := make([]string, len(e))
	for i, fe := range e {
		parts[i] = fe.Error()
	}
	return strings.Join(parts, "; ")
}

// Compile validates spec and compiles it. The error, when there is one, is
// an *admit.Error with CodeInvalid wrapping an Errors that lists every
// problem found.
func Compile(spec *Spec) (*Policy, error) {
	c := compiler{p: &Policy{
		tiers: map[string]*Tier{}, tenants: map[string]*Tenant{}, byKey: map[string]*Tenant{},
		spec: *spec,
	}, check: spec.CheckRule}
	c.compile(spec)
	if len(c.errs) > 0 {
		return nil, &admit.Error{Code: admit.CodeInvalid, Message: c.errs.Error(), Err: c.errs}
	}
	return c.p, nil
}

type compiler struct {
	p     *Policy
	errs  Errors
	check func(*admit.Rule, bool) error // Spec.CheckRule
}

func (c *compiler) fail(path, format string, args ...any) {
	c.errs = append(c.errs, FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (c *compiler) compile(spec *Spec) {
	p := c.p
	var err error
	if p.onError, err = ruletext.FailureMode(spec.OnError); err != nil {
		c.fail("on_error", "%v", err)
	}
	p.anonymous = c.weight("anonymous_weight", spec.AnonymousWeight, 1)
	if len(spec.Global) > bounds.MaxGlobalRules {
		c.fail("global", "%d rules; at most %d", len(spec.Global), bounds.MaxGlobalRules)
	}
	globalNames := map[string]bool{}
	for i := range spec.Global {
		path := fmt.Sprintf("global[%d]", i)
		r := c.rule(path, &spec.Global[i], "", spec.Shadow)
		// By the name the file gives, whether or not the rule compiled:
		// each of its problems is reported in one run.
		if n := spec.Global[i].Name; n != "" {
			if globalNames[n] {
				c.fail(path+".name", "rule %q is defined twice", n)
			}
			globalNames[n] = true
		}
		if r != nil {
			p.global = append(p.global, r)
		}
	}
	for _, name := range sortedKeys(spec.Tiers) {
		path := "tiers." + name
		if err := checkName(name); err != nil {
			c.fail(path, "tier name: %v", err)
			continue
		}
		ts := spec.Tiers[name]
		t := &Tier{Name: name, Gateway: c.gateway(path+".gateway", ts.Gateway), Source: "config", Spec: ts, Weight: c.weight(path+".weight", ts.Weight, 1),
			LLMInFlight: c.inFlight(path+".llm_in_flight", ts.LLMInFlight)}
		if len(ts.Rules) > bounds.MaxRulesPerTier {
			c.fail(path+".rules", "%d rules; at most %d", len(ts.Rules), bounds.MaxRulesPerTier)
		}
		names := map[string]bool{}
		for i := range ts.Rules {
			rp := fmt.Sprintf("%s.rules[%d]", path, i)
			r := c.rule(rp, &ts.Rules[i], name, spec.Shadow)
			if n := ts.Rules[i].Name; n != "" {
				switch {
				case names[n]:
					c.fail(rp+".name", "rule %q is defined twice in tier %q", n, name)
				case globalNames[n]:
					c.fail(rp+".name", "rule %q is also a global rule; rule names must differ", n)
				}
				names[n] = true
			}
			if r == nil {
				continue
			}
			t.Rules = append(t.Rules, r)
		}
		p.tiers[name] = t
	}
	switch u := spec.UnknownTenant; {
	case u == "" || u == "deny":
	case p.tiers[u] != nil:
		p.fallback = p.tiers[u]
	default:
		c.fail("unknown_tenant", "%q is neither deny nor a tier (tiers: %s)", u, strings.Join(sortedKeys(spec.Tiers), ", "))
	}
	for _, id := range sortedKeys(spec.Tenants) {
		ts := spec.Tenants[id]
		if t := c.tenant("tenants."+id, id, &ts, spec.Shadow); t != nil {
			p.tenants[id] = t
			for _, h := range t.Spec.APIKeysSHA256 {
				if other := p.byKey[h]; other != nil {
					c.fail("tenants."+id+".api_keys_sha256", "key hash %.12s… is also a key of tenant %q", h, other.ID)
				}
				p.byKey[h] = t
			}
		}
	}
}

// tenant compiles a tenant, applying its overrides to its tier's rules.
func (c *compiler) tenant(path, id string, ts *TenantSpec, shadow bool) *Tenant {
	if err := checkName(id); err != nil {
		c.fail(path, "tenant id: %v", err)
		return nil
	}
	tier := c.p.tiers[ts.Tier]
	if tier == nil {
		if ts.Tier == "" {
			c.fail(path+".tier", "missing; every tenant names its tier")
		} else {
			c.fail(path+".tier", "unknown tier %q (tiers: %s)", ts.Tier, strings.Join(sortedKeys(c.p.spec.Tiers), ", "))
		}
		return nil
	}
	if len(ts.APIKeysSHA256) > bounds.MaxAPIKeys {
		c.fail(path+".api_keys_sha256", "%d keys; at most %d", len(ts.APIKeysSHA256), bounds.MaxAPIKeys)
	}
	for i, h := range ts.APIKeysSHA256 {
		if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size || strings.ToLower(h) != h {
			c.fail(fmt.Sprintf("%s.api_keys_sha256[%d]", path, i), "not a lower-case hex SHA-256 (64 hex digits)")
		}
	}
	t := &Tenant{ID: id, Tier: tier, Rules: tier.Rules, Source: "config", Spec: *ts, Weight: c.weight(path+".weight", ts.Weight, tier.Weight), class: "tenant:" + id}
	overridden := map[string]bool{}
	cloned := false // t.Rules is still the tier's slice until an override lands
	for i := range ts.Overrides {
		op := fmt.Sprintf("%s.overrides[%d]", path, i)
		o := &ts.Overrides[i]
		k := slices.IndexFunc(tier.Spec.Rules, func(r RuleSpec) bool { return r.Name == o.Name })
		if k < 0 {
			c.fail(op+".name", "tier %q has no rule %q", tier.Name, o.Name)
			continue
		}
		if overridden[o.Name] {
			c.fail(op+".name", "rule %q is overridden twice", o.Name)
			continue
		}
		overridden[o.Name] = true
		if o.Scope != "" || o.Actions != nil || o.PerAction || o.Algorithm != "" {
			c.fail(op, "an override replaces parameters only; scope, actions, per_action and algorithm come from the tier")
			continue
		}
		merged := mergeOverride(tier.Spec.Rules[k], *o)
		if r := c.rule(op, &merged, tier.Name, shadow); r != nil {
			if !cloned {
				t.Rules, cloned = slices.Clone(tier.Rules), true
			}
			idx := slices.IndexFunc(t.Rules, func(x *Rule) bool { return x.Name == o.Name })
			if idx >= 0 {
				t.Rules[idx] = r
			}
		}
	}
	if ts.BillingAnchor != "" {
		day, err := time.Parse(time.DateOnly, ts.BillingAnchor)
		if err != nil {
			c.fail(path+".billing_anchor", "%q: want a date such as 2026-01-15", ts.BillingAnchor)
			return t
		}
		// The tenant's own copy of each quota anchored on billing: its
		// periods start on the anchor's day, at midnight in the quota's
		// zone.
		for i, r := range t.Rules {
			if !r.billing {
				continue
			}
			if !cloned {
				t.Rules, cloned = slices.Clone(tier.Rules), true
			}
			own := *r
			own.Anchor = time.Date(day.Year(), day.Month(), day.Day(), 0, 0, 0, 0, r.Location)
			own.ID = len(c.p.rules)
			c.p.rules = append(c.p.rules, &own)
			t.Rules[i] = &own
		}
	}
	return t
}

// weight returns a weight in shared limits, w or def when w is 0,
// reporting one out of bounds under path.
func (c *compiler) weight(path string, w, def int64) int64 {
	if w < 0 || w > bounds.MaxShareWeight {
		c.fail(path, "%d: a weight is from 1 to %d (0 or absent: the default)", w, bounds.MaxShareWeight)
		return def
	}
	if w == 0 {
		return def
	}
	return w
}

// mergeOverride returns base with the parameters o sets replaced.
func mergeOverride(base, o RuleSpec) RuleSpec {
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	setN := func(dst **int64, v *int64) {
		if v != nil {
			*dst = v
		}
	}
	set(&base.Rate, o.Rate)
	setN(&base.Burst, o.Burst)
	setN(&base.Initial, o.Initial)
	set(&base.Floor, o.Floor)
	setN(&base.Limit, o.Limit)
	set(&base.Window, o.Window)
	setN(&base.Max, o.Max)
	set(&base.LeaseTTL, o.LeaseTTL)
	setN(&base.MaxCost, o.MaxCost)
	set(&base.Period, o.Period)
	set(&base.TimeZone, o.TimeZone)
	set(&base.Anchor, o.Anchor)
	if o.Shadow != nil {
		base.Shadow = o.Shadow
	}
	set(&base.OnError, o.OnError)
	set(&base.Distribution, o.Distribution)
	set(&base.ShareCeiling, o.ShareCeiling)
	set(&base.Budget, o.Budget)
	if o.Weights != nil {
		base.Weights = o.Weights
	}
	return base
}

// rule compiles one rule, reporting its problems under path. It returns nil
// if the rule is invalid.
func (c *compiler) rule(path string, rs *RuleSpec, tier string, shadow bool) *Rule {
	before := len(c.errs)
	rs = c.budget(path, rs)
	r := &Rule{Rule: admit.Rule{Name: rs.Name}, Scope: rs.Scope, PerAction: rs.PerAction, PerModel: rs.PerModel, Tier: tier}
	if err := checkName(rs.Name); err != nil {
		c.fail(path+".name", "%v", err)
	}
	if msg := checkScope(rs.Scope); msg != "" {
		c.fail(path+".scope", "%s", msg)
	}
	r.attribute, _ = strings.CutPrefix(rs.Scope, ScopeAttribute)
	if len(rs.Actions) > bounds.MaxActions {
		c.fail(path+".actions", "%d actions; at most %d", len(rs.Actions), bounds.MaxActions)
	}
	r.allActions = len(rs.Actions) == 0
	for i, a := range rs.Actions {
		switch {
		case a == "*":
			r.allActions = true
		case a == "" || len(a) > bounds.MaxNameLen:
			c.fail(fmt.Sprintf("%s.actions[%d]", path, i), "an action is 1 to %d bytes", bounds.MaxNameLen)
		default:
			r.actions = append(r.actions, a)
		}
	}
	if r.allActions {
		r.actions = nil
	}
	alg, err := ruletext.Algorithm(rs.Algorithm)
	if rs.Algorithm == "" {
		c.fail(path+".algorithm", "missing (token_bucket, gcra, fixed_window, sliding_window, sliding_log, combination, concurrency or quota)")
		return nil
	} else if err != nil {
		c.fail(path+".algorithm", "%v", err)
		return nil
	}
	r.Algorithm = alg

	// Parameters: required ones must be present, foreign ones absent, so
	// that a typo like "limit" on a token bucket is not silently ignored.
	want := map[string]bool{}
	switch alg {
	case admit.TokenBucket:
		want = map[string]bool{"rate": true, "burst": true, "initial": true, "max_debt": true}
	case admit.GCRA:
		want = map[string]bool{"rate": true, "burst": true, "max_debt": true}
	case admit.Combination:
		want = map[string]bool{"rate": true, "burst": true, "initial": true, "floor": true}
	case admit.FixedWindow, admit.SlidingWindow, admit.SlidingLog:
		want = map[string]bool{"limit": true, "window": true}
	case admit.Concurrency:
		want = map[string]bool{"max": true, "lease_ttl": true}
	case admit.Quota:
		want = map[string]bool{"limit": true, "period": true, "time_zone": true, "anchor": true}
	}
	present := map[string]bool{
		"rate": rs.Rate != "", "burst": rs.Burst != nil, "initial": rs.Initial != nil, "floor": rs.Floor != "",
		"limit": rs.Limit != nil, "window": rs.Window != "", "max": rs.Max != nil, "lease_ttl": rs.LeaseTTL != "",
		"period": rs.Period != "", "time_zone": rs.TimeZone != "", "anchor": rs.Anchor != "", "max_debt": rs.MaxDebt != nil,
	}
	optional := map[string]bool{"initial": true, "lease_ttl": true, "time_zone": true, "anchor": true, "max_debt": true}
	for _, f := range []string{"rate", "burst", "initial", "floor", "limit", "window", "max", "lease_ttl", "period", "time_zone", "anchor", "max_debt"} {
		switch {
		case present[f] && !want[f]:
			c.fail(path+"."+f, "not a parameter of %s", alg)
		case !present[f] && want[f] && !optional[f]:
			c.fail(path+"."+f, "missing; %s needs it", alg)
		}
	}
	if rs.Rate != "" && want["rate"] {
		if r.Rate, err = admit.ParseRate(rs.Rate); err != nil {
			c.fail(path+".rate", "%v", err)
		}
	}
	if rs.Floor != "" && want["floor"] {
		if r.Floor, err = admit.ParseRate(rs.Floor); err != nil {
			c.fail(path+".floor", "%v", err)
		}
	}
	if rs.Window != "" && want["window"] {
		if r.Window, err = admit.ParseDuration(rs.Window); err != nil {
			c.fail(path+".window", "%v", err)
		}
	}
	if rs.LeaseTTL != "" && want["lease_ttl"] {
		if r.LeaseTTL, err = admit.ParseDuration(rs.LeaseTTL); err != nil {
			c.fail(path+".lease_ttl", "%v", err)
		}
	}
	if alg == admit.Quota {
		c.quota(path, rs, r)
	}
	deref := func(p *int64) int64 {
		if p == nil {
			return 0
		}
		return *p
	}
	r.Burst, r.Limit, r.Max, r.MaxCost = deref(rs.Burst), deref(rs.Limit), deref(rs.Max), deref(rs.MaxCost)
	if rs.MaxCost != nil && *rs.MaxCost < 1 {
		c.fail(path+".max_cost", "must be at least 1")
	}
	c.unit(path, rs, r)
	switch {
	case rs.MaxDebt != nil && want["max_debt"]:
		if *rs.MaxDebt < 1 {
			c.fail(path+".max_debt", "must be at least 1")
		}
		r.MaxDebt = *rs.MaxDebt
	case want["max_debt"] && r.Unit == units.UnitTokens:
		// What an LLM call used beyond its reservation is debited after
		// it, and owed in full: a debt capped at one burst would forgive
		// the rest.
		r.MaxDebt = engine.MostDebt(r.Rate)
	}
	if rs.Initial != nil && want["initial"] {
		v := *rs.Initial
		r.Initial = &v
	}
	r.Shadow = shadow || (rs.Shadow != nil && *rs.Shadow)
	if r.OnError, err = ruletext.FailureMode(rs.OnError); err != nil {
		c.fail(path+".on_error", "%v", err)
	}
	if r.OnError == admit.FailDefault && r.Unit != units.UnitRequests {
		// A budget in tokens or money fails closed unless it says
		// otherwise: admitted without the store, a call reserves
		// nothing, and a store made slow enough to time out would let
		// every call through.
		r.OnError = admit.FailClosed
	}
	if r.Distribution, err = ruletext.Distribution(rs.Distribution); err != nil {
		c.fail(path+".distribution", "%v", err)
	}
	c.share(path, rs, r, tier)
	// The rule's own checks run whatever failed above, so that each
	// parameter's problem is reported in one run, but for the fields
	// reported already (one that did not parse holds its zero value).
	if err := r.Rule.Validate(); err != nil {
		errs := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = j.Unwrap() // each parameter's problem at its own field
		}
		reported := c.errs[before:]
		for _, err := range errs {
			field := admit.ErrorField(err)
			if field == "" {
				field = "algorithm"
			}
			if !slices.ContainsFunc(reported, func(e FieldError) bool { return e.Path == path+"."+field }) {
				c.fail(path+"."+field, "%v", err)
			}
		}
	}
	if len(c.errs) > before {
		return nil
	}
	if r.MaxCost == 0 {
		// One charge, a debit above all, takes at most what the rule
		// holds: a debit is never refused, so an unbounded one would let
		// any caller empty a bucket in one request.
		r.MaxCost = r.Capacity()
	}
	if c.check != nil {
		if err := c.check(&r.Rule, r.Fair); err != nil {
			field := admit.ErrorField(err)
			if field == "" {
				field = "algorithm"
			}
			c.fail(path+"."+field, "%v", err)
			return nil
		}
	}
	if r.Unit != units.UnitRequests {
		settle := r.Rule
		settle.MaxCost = 0
		r.settle = &settle
	}
	r.bucket = tierBucket(r, tier)
	r.ID = len(c.p.rules)
	c.p.rules = append(c.p.rules, r)
	return r
}

// share compiles whether r's buckets are shared by tenants, and then
// divided fairly, and a shared concurrency rule's ceiling.
func (c *compiler) share(path string, rs *RuleSpec, r *Rule, tier string) {
	if tier == "" {
		r.shared = r.Scope == ScopeGlobal || r.Scope == ScopeIP || r.attribute != ""
	} else {
		r.shared = r.Scope == ScopeGlobal
	}
	r.Fair = r.shared && (rs.FairShare == nil || *rs.FairShare)
	if rs.FairShare != nil && *rs.FairShare && !r.shared {
		c.fail(path+".fair_share", "the rule's buckets are not shared by tenants (a global rule of scope global, ip or an attribute, or a tier's rule of scope global is)")
	}
	if rs.ShareCeiling == "" {
		if r.Fair && r.Scope != ScopeGlobal && r.Algorithm != admit.Concurrency {
			// A key per address or attribute is mostly one client's:
			// alone, it takes the rule's whole capacity.
			r.ShareCeiling = r.Capacity()
		}
		return
	}
	if !r.Fair {
		c.fail(path+".share_ceiling", "only a rule tenants share, divided fairly, has a share ceiling")
		return
	}
	capacity := r.Capacity()
	v, pct := strings.CutSuffix(strings.TrimSpace(rs.ShareCeiling), "%")
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	switch {
	case err != nil || n < 1 || pct && n > 100:
		c.fail(path+".share_ceiling", "%q: want a number of the rule's units, or a percentage of its capacity such as \"50%%\"", rs.ShareCeiling)
		return
	case pct:
		n = max(1, capacity*n/100)
	}
	if n > capacity {
		c.fail(path+".share_ceiling", "%d is more than the rule's capacity (%d)", n, capacity)
		return
	}
	r.ShareCeiling = n
}

// unit compiles what a rule counts: its unit, a tokens rule's weights and
// a money rule's budget, which becomes its limit in micro-units.
func (c *compiler) unit(path string, rs *RuleSpec, r *Rule) {
	switch rs.Unit {
	case "", "requests":
	case "tokens":
		r.Unit = units.UnitTokens
	case "money":
		r.Unit = units.UnitMoney
	default:
		c.fail(path+".unit", "unknown unit %q (want requests, tokens or money)", rs.Unit)
		return
	}
	if r.Unit != units.UnitRequests && engine.CheckDebit(&r.Rule, 0) != nil {
		c.fail(path+".unit", "a rule in %s must be a token_bucket, gcra, fixed_window, sliding_window or quota: an LLM call is settled after its answer, by refund or debit", r.Unit)
	}
	r.Weights = units.EveryTokenWeighsOne
	if rs.Weights != nil {
		if r.Unit != units.UnitTokens {
			c.fail(path+".weights", "only a rule in tokens has weights")
		} else if w, err := units.ParseWeights(rs.Weights); err != nil {
			c.fail(path+".weights", "%v", err)
		} else {
			r.Weights = w
		}
	}
	switch {
	case r.Unit == units.UnitMoney && (r.Algorithm == admit.TokenBucket || r.Algorithm == admit.GCRA):
		c.fail(path+".unit", "a budget in money is a quota or a window: %s has none", r.Algorithm)
	case r.Unit != units.UnitMoney && rs.Budget != "":
		c.fail(path+".budget", "only a rule in money has a budget")
	}
}

// budget returns rs with a money rule's budget as its limit, in
// micro-units, so that the rule's algorithm finds the limit it needs.
func (c *compiler) budget(path string, rs *RuleSpec) *RuleSpec {
	if rs.Unit != "money" {
		return rs
	}
	cp := *rs
	switch {
	case rs.Limit != nil:
		c.fail(path+".limit", "a rule in money states its limit as budget, in the currency")
	case rs.Budget == "":
		c.fail(path+".budget", "missing; a rule in money needs its budget, like \"10.00\"")
	default:
		n, err := units.ParseDecimal(rs.Budget, 6)
		if err != nil || n < 1 || n > bounds.MaxCount {
			c.fail(path+".budget", "%q: want an amount from 0.000001 to 4000 with at most 6 decimals", rs.Budget)
			break
		}
		cp.Limit = &n
	}
	return &cp
}

// quota compiles a quota's period, time zone and anchor into r.
func (c *compiler) quota(path string, rs *RuleSpec, r *Rule) {
	var err error
	if rs.Period != "" {
		if r.Period, err = ruletext.Period(rs.Period); err != nil {
			c.fail(path+".period", "%v", err)
		}
	}
	r.Location = time.UTC
	if rs.TimeZone != "" {
		if r.Location, err = time.LoadLocation(rs.TimeZone); err != nil || rs.TimeZone == "Local" {
			c.fail(path+".time_zone", "unknown time zone %q; want an IANA name such as Europe/Paris or UTC", rs.TimeZone)
			r.Location = time.UTC
		}
	}
	switch rs.Anchor {
	case "", "calendar":
	case "billing":
		r.billing = true
	default:
		if r.Anchor, err = parseAnchor(rs.Anchor, r.Location); err != nil {
			c.fail(path+".anchor", "%v", err)
		}
	}
}

// parseAnchor reads an anchor: a date (midnight in loc) or an RFC 3339
// time.
func parseAnchor(s string, loc *time.Location) (time.Time, error) {
	if t, err := time.ParseInLocation(time.DateOnly, s, loc); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.Truncate(time.Second), nil
	}
	return time.Time{}, fmt.Errorf("anchor %q: want calendar, billing, a date such as 2026-01-15 or an RFC 3339 time", s)
}

// inFlight compiles a tier's llm_in_flight.
func (c *compiler) inFlight(path string, n int64) int64 {
	switch {
	case n == 0:
		return bounds.DefaultLLMInFlight
	case n < 1 || n > 100_000:
		c.fail(path, "%d: want 1 to 100000", n)
	}
	return n
}

func (c *compiler) gateway(path string, g *GatewaySpec) Gateway {
	out := DefaultGateway
	if g == nil {
		return out
	}
	// Live connections are concurrency leases, bounded as such.
	for _, f := range []struct {
		name   string
		v, max int64
		dst    *int64
	}{
		{"tenant_connections", g.TenantConnections, bounds.MaxConcurrency, &out.TenantConnections},
		{"connections_per_session", g.ConnectionsPerSession, bounds.MaxConcurrency, &out.ConnectionsPerSession},
		{"tenant_per_minute", g.TenantPerMinute, bounds.MaxCount, &out.TenantPerMinute},
		{"session_per_minute", g.SessionPerMinute, bounds.MaxCount, &out.SessionPerMinute},
		{"messages_per_minute", g.MessagesPerMinute, bounds.MaxCount, &out.MessagesPerMinute},
		{"tenant_sessions", g.TenantSessions, bounds.MaxConcurrency, &out.TenantSessions},
	} {
		switch {
		case f.v == 0:
		case f.v < 0 || f.v > f.max:
			c.fail(path+"."+f.name, "must be from 1 to %d", f.max)
		default:
			*f.dst = f.v
		}
	}
	if g.SessionTTL != "" {
		d, err := admit.ParseDuration(g.SessionTTL)
		switch {
		case err != nil:
			c.fail(path+".session_ttl", "%v", err)
		case d < time.Second || d > bounds.MaxRatePeriod:
			c.fail(path+".session_ttl", "must be from 1s to %v", bounds.MaxRatePeriod)
		default:
			out.SessionTTL = d
		}
	}
	if g.TenantSessions == 0 {
		out.TenantSessions = min(bounds.MaxConcurrency, max(10, 2*out.TenantConnections))
	}
	return out
}

// checkName accepts tenant ids, tier and rule names: 1 to 128 bytes
// of letters, digits and . _ : @ -, so that names are safe in URL paths,
// header parameters, metrics labels and logs.
func checkName(s string) error {
	if s == "" || len(s) > bounds.MaxNameLen {
		return fmt.Errorf("%q: must be 1 to %d bytes", s, bounds.MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		if !nameByte(s[i]) {
			return fmt.Errorf("%q: only letters, digits and . _ : @ - are allowed", s)
		}
	}
	return nil
}

// CheckName reports whether s may name a tenant, a tier or a rule: 1 to
// 128 bytes of letters, digits and . _ : @ -, so that names are safe in
// URL paths, header parameters, metrics labels and logs. The error is of
// code CodeInvalid.
func CheckName(s string) error {
	if err := checkName(s); err != nil {
		return admit.Errorf(admit.CodeInvalid, "%v", err)
	}
	return nil
}

func nameByte(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' ||
		b == '.' || b == '_' || b == ':' || b == '@' || b == '-'
}

// checkScope says what is wrong with a rule's scope, "" if nothing.
func checkScope(scope string) string {
	const known = "global, tenant, user, api_key, ip, session, or attribute:NAME for a request attribute"
	if slices.Contains(scopes, scope) {
		return ""
	}
	if name, ok := strings.CutPrefix(scope, ScopeAttribute); ok {
		if !validAttribute(name) {
			return fmt.Sprintf("%q: an attribute name is 1 to 64 lower-case letters, digits, _ and -", scope)
		}
		return ""
	}
	if scope == "" {
		return "missing (" + known + ")"
	}
	msg := fmt.Sprintf("%q is not a scope (%s)", scope, known)
	if s := Suggest(scope, scopes); s != "" {
		msg += fmt.Sprintf("; did you mean %q?", s)
	} else if validAttribute(scope) {
		msg += fmt.Sprintf("; a request attribute is declared as %q", ScopeAttribute+scope)
	}
	return msg
}

// Suggest returns the candidate closest to s when s is close enough to be
// a typo of it (an edit distance of at most a third of the candidate's
// length, or the same letters in another case), "" otherwise: the "did you
// mean" of configuration errors.
func Suggest(s string, candidates []string) string {
	best, bestD := "", -1
	for _, c := range candidates {
		if strings.EqualFold(s, c) {
			return c
		}
		if d := editDistance(s, c); d <= max(1, len(c)/3) && (bestD < 0 || d < bestD) {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func validAttribute(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !('a' <= b && b <= 'z' || '0' <= b && b <= '9' || b == '_' || b == '-') {
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// tierBucket names r in its buckets' keys. A global rule's name is its
// own. A tier's rule keyed by its tenant (tenant, user, session, API key,
// ip, an attribute: every key holds the tenant) is named by its name and
// its algorithm's kind, not its tier, so that a tenant moved to another
// tier keeps what its buckets hold, adopted by the new tier's rule of the
// same name as any changed rule is (a bucket's tokens, a window's count);
// "*" is in no tier's name. A tier's rule of scope global is one bucket
// for the tier's tenants together, named after its tier.
func tierBucket(r *Rule, tier string) string {
	switch {
	case tier == "":
		return r.Name
	case r.Scope == ScopeGlobal:
		return tier + "/" + r.Name // "/" appears in no name
	}
	kind := r.Algorithm.String()
	if r.Algorithm == admit.TokenBucket || r.Algorithm == admit.GCRA {
		kind = "bucket" // one state, read alike
	}
	return "*" + kind + "/" + r.Name
}
