// Package policy turns tenants, tiers and rules into the charges of a
// request, and keeps the tenant catalog.
//
// A Spec (the configuration's policy, or the admin API's) is compiled into
// an immutable Policy. Resolving a request against a Policy reads it and
// writes only the caller's buffers, so any number of goroutines may resolve
// against one Policy while a Catalog prepares the next one; a change is an
// atomic swap of the pointer (see Catalog).
package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/units"
)

// The scopes with a meaning of their own. A rule keyed by a request
// attribute (Request.Attributes) declares it as ScopeAttribute + its name,
// "attribute:plan"; any other scope is a configuration error, so that a
// typo ("usr") is refused rather than loaded as a scope no request carries.
const (
	ScopeGlobal    = "global"
	ScopeTenant    = "tenant"
	ScopeUser      = "user"
	ScopeAPIKey    = "api_key"
	ScopeIP        = "ip"
	ScopeSession   = "session"
	ScopeAttribute = "attribute:"
)

// scopes lists the named scopes, for errors and suggestions.
var scopes = []string{ScopeGlobal, ScopeTenant, ScopeUser, ScopeAPIKey, ScopeIP, ScopeSession}

// Rule is a compiled rule: the store's admit.Rule plus which requests it
// applies to. A Rule is never changed once compiled.
type Rule struct {
	admit.Rule
	// Scope is what the rule's buckets are keyed by (see the Scope
	// constants).
	Scope string
	// PerAction gives every action its own bucket; otherwise the
	// actions of the rule share one.
	PerAction bool
	// Unit is what the rule counts; Weights weigh the token kinds of a
	// rule in tokens.
	Unit    units.Unit
	Weights units.Weights
	// PerModel gives every LLM model its own bucket.
	PerModel bool
	// Tier is the tier the rule belongs to, "" for a global rule.
	Tier string
	// ID numbers the rules of one Policy densely from 0, so that callers
	// can keep per-rule data (metrics, say) in a slice.
	ID int
	// Fair says the rule's buckets are shared by tenants (a global rule
	// of scope global, ip or an attribute, or a tier's rule of scope
	// global) and divided among them by weight: its charges carry the
	// request's admit.Share.
	Fair bool

	allActions bool
	actions    []string
	// settle is the rule as a metered call's settlement debits it: its
	// max_cost bounds what a caller asks, not what a provider reports.
	settle *admit.Rule
	// attribute is the request attribute an attribute scope names.
	attribute string
	// billing: a quota anchored on each tenant's billing anchor.
	billing bool
	// shared: tenants share the rule's buckets (Fair unless turned off).
	shared bool
	// bucket names the rule in its buckets' keys (see tierBucket): a
	// tenant moved to another tier keeps what its buckets hold.
	bucket string
}

// Applies reports whether r applies to action.
func (r *Rule) Applies(action string) bool {
	return r.allActions || slices.Contains(r.actions, action)
}

// SharedByTenants reports whether the buckets of r are shared by every
// tenant: a global rule keyed by nothing or by what any tenant's request
// may carry (an ip, an attribute), rather than by the request's tenant,
// user, session or API key. What one tenant's requests do to such a
// bucket, the others meet, so its level is the platform's to read.
func (r *Rule) SharedByTenants() bool {
	if r.Tier != "" {
		return false
	}
	switch r.Scope {
	case ScopeTenant, ScopeUser, ScopeSession, ScopeAPIKey:
		return false
	}
	return true
}

// Actions returns the actions r applies to; ["*"] means all.
func (r *Rule) Actions() []string {
	if r.allActions {
		return []string{"*"}
	}
	return slices.Clone(r.actions)
}

// Spec writes r back in configuration terms, with every parameter the
// compiled rule holds, defaults included.
func (r *Rule) Spec() RuleSpec {
	s := RuleSpec{Name: r.Name, Scope: r.Scope, Actions: r.Actions(), PerAction: r.PerAction, Algorithm: r.Algorithm.String()}
	n := func(v int64) *int64 { return &v }
	switch r.Algorithm {
	case admit.TokenBucket, admit.GCRA, admit.Combination:
		s.Rate, s.Burst, s.Initial = r.Rate.String(), n(r.Burst), r.Initial
		if r.Algorithm == admit.Combination {
			s.Floor = r.Floor.String()
		}
	case admit.Concurrency:
		s.Max, s.LeaseTTL = n(r.Max), engine.LeaseTTL(&r.Rule).String()
	case admit.Quota:
		s.Limit, s.Period, s.TimeZone = n(r.Limit), r.Period.String(), r.Location.String()
		switch {
		case r.billing:
			s.Anchor = "billing"
		case r.Anchor.IsZero():
			s.Anchor = "calendar"
		default:
			s.Anchor = r.Anchor.Format(time.RFC3339)
		}
	default:
		s.Limit, s.Window = n(r.Limit), r.Window.String()
	}
	s.MaxCost = n(r.MaxCost)
	if r.MaxDebt > 0 {
		s.MaxDebt = n(r.MaxDebt)
	}
	if r.Shadow {
		t := true
		s.Shadow = &t
	}
	s.OnError = r.OnError.String()
	s.PerModel = r.PerModel
	if r.shared && !r.Fair {
		f := false
		s.FairShare = &f
	}
	if r.Fair && r.ShareCeiling > 0 {
		s.ShareCeiling = strconv.FormatInt(r.ShareCeiling, 10)
	}
	switch r.Unit {
	case units.UnitTokens:
		s.Unit = r.Unit.String()
		if r.Weights != units.EveryTokenWeighsOne {
			s.Weights = map[string]string{}
			for k, w := range r.Weights {
				s.Weights[units.TokenKindNames[k]] = units.FormatDecimal(w, 3)
			}
		}
	case units.UnitMoney:
		s.Unit, s.Budget, s.Limit = r.Unit.String(), units.FormatDecimal(r.Limit, 6), nil
	}
	if r.Distribution != admit.Exact {
		s.Distribution = r.Distribution.String()
	}
	return s
}

// Gateway holds a tier's WebSocket gateway limits.
// In JSON it has the configuration's field names, session_ttl as a
// duration like "200s".
type Gateway struct {
	TenantConnections     int64         // live connections of a tenant
	ConnectionsPerSession int64         // live connections of a session
	TenantPerMinute       int64         // new connections of a tenant per minute
	SessionPerMinute      int64         // new connections of a session per minute
	SessionTTL            time.Duration // idle time after which a session expires
	MessagesPerMinute     int64         // messages of a tenant per minute
	// TenantSessions bounds a tenant's live sessions, so that one tenant
	// cannot fill the store every tenant's sessions live in. Default:
	// twice TenantConnections, at least 10.
	TenantSessions int64
}

// MarshalJSON implements json.Marshaler.
func (g Gateway) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		TenantConnections     int64  `json:"tenant_connections"`
		ConnectionsPerSession int64  `json:"connections_per_session"`
		TenantPerMinute       int64  `json:"tenant_per_minute"`
		SessionPerMinute      int64  `json:"session_per_minute"`
		SessionTTL            string `json:"session_ttl"`
		MessagesPerMinute     int64  `json:"messages_per_minute"`
		TenantSessions        int64  `json:"tenant_sessions"`
	}{g.TenantConnections, g.ConnectionsPerSession, g.TenantPerMinute, g.SessionPerMinute, g.SessionTTL.String(), g.MessagesPerMinute, g.TenantSessions})
}

// DefaultGateway is the gateway of a tier that declares none: 10
// connections per tenant, 2 per session, 60 new connections a minute per
// tenant and 5 per session, 60 messages a minute, sessions of 200 s.
var DefaultGateway = Gateway{
	TenantConnections: 10, ConnectionsPerSession: 2, TenantPerMinute: 60,
	SessionPerMinute: 5, SessionTTL: 200 * time.Second, MessagesPerMinute: 60,
	TenantSessions: 20,
}

// Tier is a compiled tier.
type Tier struct {
	Name    string
	Rules   []*Rule
	Gateway Gateway
	// Weight is the tier's tenants' weight in shared limits.
	Weight int64
	// LLMInFlight bounds each tenant's LLM calls in flight through one
	// proxy (see TierSpec.LLMInFlight).
	LLMInFlight int64
	// Source is "config" or "admin": where the tier's definition came from.
	Source string
	Spec   TierSpec
}

// Tenant is a compiled tenant: its tier's rules with its overrides applied.
type Tenant struct {
	ID    string
	Tier  *Tier
	Rules []*Rule
	// Weight is the tenant's weight in shared limits: its own, or its
	// tier's.
	Weight int64
	// class is the tenant's class in shared limits, made once.
	class string
	// Source is "config", "admin", or "default" for a tenant the catalog
	// does not know that got the default tier.
	Source string
	Spec   TenantSpec
}

// HasAPIKeys reports whether t must present an API key.
func (t *Tenant) HasAPIKeys() bool { return len(t.Spec.APIKeysSHA256) > 0 }

// HashKey returns the hex SHA-256 of an API key: the form in which keys are
// stored, compared and used in bucket keys.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Policy is a compiled Spec. It is immutable and safe for concurrent use.
type Policy struct {
	global    []*Rule
	tiers     map[string]*Tier
	tenants   map[string]*Tenant
	byKey     map[string]*Tenant // API key hash → tenant
	fallback  *Tier              // tier of unknown tenants; nil refuses them
	onError   admit.FailureMode
	anonymous int64   // the anonymous callers' weight in shared limits
	rules     []*Rule // by ID
	spec      Spec
}

// Rules returns every rule of p, indexed by Rule.ID.
func (p *Policy) Rules() []*Rule { return p.rules }

// Global returns the rules every request is charged against.
func (p *Policy) Global() []*Rule { return p.global }

// AnonymousWeight returns the anonymous callers' weight in shared limits.
func (p *Policy) AnonymousWeight() int64 { return p.anonymous }

// OnError returns the failure mode of rules that name none.
func (p *Policy) OnError() admit.FailureMode { return p.onError }

// Failover says what a policy's rules do when the store cannot answer.
type Failover struct {
	// Closed names the rules that fail closed ("tier/rule", or the rule
	// alone for a global rule), sorted: requests charged to them are
	// refused with an error while the store is down.
	Closed []string
	// Open and Local report whether some rule fails open, or is decided
	// by the server's local limiter.
	Open, Local bool
}

// Failover returns what p's rules do when the store cannot answer.
func (p *Policy) Failover() Failover {
	var f Failover
	seen := map[string]bool{}
	for _, r := range p.rules {
		mode := r.OnError
		if mode == admit.FailDefault {
			mode = p.onError
		}
		switch mode {
		case admit.FailClosed:
			name := r.Name
			if r.Tier != "" {
				name = r.Tier + "/" + r.Name
			}
			if !seen[name] {
				seen[name] = true
				f.Closed = append(f.Closed, name)
			}
		case admit.FailLocal:
			f.Local = true
		default:
			f.Open = true
		}
	}
	sort.Strings(f.Closed)
	return f
}

// Tier returns the tier named name, or nil.
func (p *Policy) Tier(name string) *Tier { return p.tiers[name] }

// Tenant returns the tenant with the given id, or nil if the catalog does
// not know it.
func (p *Policy) Tenant(id string) *Tenant { return p.tenants[id] }

// TenantByKey returns the tenant that owns the API key, or nil.
func (p *Policy) TenantByKey(key string) *Tenant {
	h := hashKey(key)
	return p.byKey[string(h[:])] // no allocation: a map index by a converted []byte
}

// hashKey is HashKey without allocating.
func hashKey(key string) (h [2 * sha256.Size]byte) {
	sum := sha256.Sum256([]byte(key))
	hex.Encode(h[:], sum[:])
	return h
}

// Tenants returns the known tenants sorted by id.
func (p *Policy) Tenants() []*Tenant {
	out := make([]*Tenant, 0, len(p.tenants))
	for _, t := range p.tenants {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Tiers returns the tiers sorted by name.
func (p *Policy) Tiers() []*Tier {
	out := make([]*Tier, 0, len(p.tiers))
	for _, t := range p.tiers {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Spec returns the specification p was compiled from. The caller must not
// modify it.
func (p *Policy) Spec() *Spec { return &p.spec }

// Settling returns the rule a metered call's excess (what the provider
// reported beyond the reservation) is debited with: r without its
// max_cost, which bounds what callers ask, so that the excess is owed in
// full. The key and its state are r's. It is r's own rule for a rule in
// requests.
func (r *Rule) Settling() *admit.Rule {
	if r.settle != nil {
		return r.settle
	}
	return &r.Rule
}
