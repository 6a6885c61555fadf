package policy

import (
	"iter"
	"net/netip"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/units"
)

// Kind selects which rules a request is resolved against.
type Kind uint8

const (
	// Requests are rate limited: every rule but concurrency rules.
	Requests Kind = iota
	// Leases take slots: concurrency rules only.
	Leases
)

// Request is what a caller knows about one request. Empty fields are
// absent: a rule applies only if the request carries its scope (a user
// rule needs User, an ip rule IP, and so on); a request without a Tenant
// is charged the global rules only.
type Request struct {
	Tenant     string
	User       string
	Action     string
	IP         string // made canonical by Resolve (see CanonicalIP)
	APIKey     string // the key itself; buckets are keyed by its hash
	Session    string
	Attributes map[string]string
	Cost       int64
	DryRun     bool
	// Debit charges Cost as a debit (admit.Charge.Debit): a cost known
	// after the work, applied whether it fits or not. A debit is charged
	// to the rules that apply and take debits (buckets and windows); the
	// sliding logs, combinations and concurrency rules that apply are
	// not charged.
	Debit bool
	Kind  Kind
	// Metered says the request is an LLM call whose Gate sets the cost
	// of the rules in tokens and money (Rule.Unit); other requests are
	// not charged to those rules. Model is the call's model, for rules
	// per model.
	Metered bool
	Model   string
	// Untrusted says that a caller Admit does not trust named the
	// request's values: no credential, or a tenant's API key, rather
	// than the platform's own code, a service token or a front end that
	// established them itself (the client address of forward-auth, the
	// proxy and the middleware). An untrusted request reaches no key that
	// other tenants share with what it chose: rules whose buckets all
	// tenants share (scope global, and global rules keyed by ip or an
	// attribute) are not charged its ip and attribute values, nor its
	// debits. Its checks of a shared bucket are bounded, like every
	// charge, by the rule's max_cost and by the tenant's own rules, which
	// a decision charges all or nothing.
	Untrusted bool
	// LeaseTTL shortens the lease TTL of concurrency charges; it never
	// lengthens it past a rule's lease_ttl.
	LeaseTTL time.Duration
	// Unvouched says that no credential and no trusted caller vouches for
	// the tenant the request names, though the caller is trusted for its
	// other values (Envoy's descriptors): a tenant only the default tier
	// knows then counts among the anonymous callers in shared limits, so
	// that no one multiplies its part by inventing tenants. Untrusted
	// requests are unvouched too.
	Unvouched bool
	// Client is the address of the client the request comes from, as the
	// front end knows it (the connection's peer through trusted proxies,
	// or the ip a trusted caller names): anonymous callers share their
	// class's part of a shared limit per client address (see Rule.Fair).
	// "" when unknown.
	Client string

	auth authenticated // see AuthenticateRequest
}

// Resolution is a request resolved into charges. Reuse one across calls to
// keep its buffers.
type Resolution struct {
	// Policy is the policy the request was resolved against.
	Policy *Policy
	// Tenant is the request's tenant, nil when it names none.
	Tenant *Tenant
	// Charges are the request's charges, Rules their rules, index by index.
	Charges []admit.Charge
	Rules   []*Rule

	keyHash string
	auth    *authenticated // the request's, if it holds
	who     identity       // what bans are matched against
	buf     []byte
	// share is the request's class in shared limits, which its fair
	// charges point to; shareWhole the same without its sub, for rules
	// keyed by the client's address already.
	share, shareWhole admit.Share
}

// Anonymous is the class of anonymous callers in shared limits (see
// Rule.Fair); a tenant's class is "tenant:" and its id.
const Anonymous = "anonymous"

// shareOf sets res's share: the request's tenant when the catalog knows it
// or a trusted caller names it, else the anonymous callers, shared per
// client address.
func (p *Policy) shareOf(req *Request, res *Resolution) {
	t := res.Tenant
	if t != nil && (t.Source != "default" || !req.Untrusted && !req.Unvouched) {
		class := t.class
		if class == "" {
			class = "tenant:" + t.ID
		}
		res.share = admit.Share{Class: class, Weight: max(t.Weight, 1)}
	} else {
		res.share = admit.Share{Class: Anonymous, Weight: max(p.anonymous, 1), Sub: ClientPrefix(req.Client)}
	}
	res.shareWhole = res.share
	res.shareWhole.Sub = ""
}

// ClientPrefix returns the part of a client address that names one
// client in shared limits: an IPv4 address whole, an IPv6 address's /64
// (one site's, which can hold any number of addresses); other text as it
// is, and "" for "".
func ClientPrefix(addr string) string {
	a, err := netip.ParseAddr(addr)
	if err != nil || !a.Is6() || a.Is4In6() {
		if err == nil {
			return a.Unmap().String()
		}
		return addr
	}
	p, _ := a.WithZone("").Prefix(64)
	return p.String()
}

// CanonicalIP returns the one spelling of the client address s that its
// buckets are kept under, so that one address is one bucket however it is
// written: an IPv4 address whole (also when written IPv4-mapped,
// ::ffff:198.51.100.7), an IPv6 address as its /64 (a site's network,
// which holds any number of addresses), a port (host:port, [v6]:port) and
// an IPv6 zone dropped. Anything else — a name, leading zeros, spaces, an
// octet past 255 — is an admit.CodeInvalid error about field "ip".
func CanonicalIP(s string) (string, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, perr := netip.ParseAddrPort(s)
		if perr != nil {
			e := admit.Errorf(admit.CodeInvalid, "ip %.64q is not an IP address (nor address:port)", s)
			e.Field = "ip"
			return "", e
		}
		a = ap.Addr()
	}
	a = a.Unmap().WithZone("")
	// Spelled canonically already (what every front end that parsed the
	// address itself passes): s, with nothing made.
	var buf [64]byte
	var b []byte
	if a.Is6() {
		p, _ := a.Prefix(64)
		b = p.AppendTo(buf[:0])
	} else {
		b = a.AppendTo(buf[:0])
	}
	if string(b) == s {
		return s, nil
	}
	return string(b), nil
}

// Validate checks the bounds of r's fields.
func (r *Request) Validate() error {
	for _, f := range [...]struct{ name, v string }{
		{"tenant", r.Tenant}, {"user", r.User}, {"action", r.Action}, {"ip", r.IP},
		{"api_key", r.APIKey}, {"session", r.Session}, {"model", r.Model},
	} {
		if len(f.v) > bounds.MaxValueLen {
			return admit.Errorf(admit.CodeInvalid, "%s is %d bytes; at most %d", f.name, len(f.v), bounds.MaxValueLen)
		}
	}
	if len(r.Attributes) > bounds.MaxAttributes {
		return admit.Errorf(admit.CodeInvalid, "%d attributes; at most %d", len(r.Attributes), bounds.MaxAttributes)
	}
	for k, v := range r.Attributes {
		if len(k) > 64 || len(v) > bounds.MaxValueLen {
			return admit.Errorf(admit.CodeInvalid, "attribute %.64q: names are at most 64 bytes, values %d", k, bounds.MaxValueLen)
		}
	}
	if r.Cost < 0 || r.Cost > bounds.MaxCost {
		return admit.Errorf(admit.CodeInvalid, "cost %d: must be from 0 to %d", r.Cost, int64(bounds.MaxCost))
	}
	return nil
}

// Resolve resolves req into res: the global rules, then the tenant's rules
// (its tier's after its overrides), each if it applies to req.Action and req
// carries its scope. A tenant the policy does not know is refused with
// admit.CodePermission, or gets the default tier if the policy has one.
func (p *Policy) Resolve(req *Request, res *Resolution) error {
	res.Policy, res.Tenant = p, nil
	res.Charges = res.Charges[:0]
	res.Rules = res.Rules[:0]
	res.keyHash = ""
	if err := req.Validate(); err != nil {
		return err
	}
	if req.IP != "" {
		ip, err := CanonicalIP(req.IP)
		if err != nil {
			return err
		}
		req.IP = ip
	}
	if req.auth.holds(p, req) {
		res.auth = &req.auth
		res.Tenant = req.auth.found
	} else {
		res.auth = nil
	}
	if req.Tenant != "" && res.Tenant == nil {
		t, err := p.TenantOrDefault(req.Tenant)
		if err != nil {
			return err
		}
		res.Tenant = t
	}
	res.share.Class = ""
	for _, r := range p.global {
		p.add(req, res, r, true)
	}
	if res.Tenant != nil {
		for _, r := range res.Tenant.Rules {
			p.add(req, res, r, false)
		}
	}
	if len(res.Charges) > bounds.MaxCharges {
		return admit.Errorf(admit.CodeInvalid, "the request resolves to %d charges; at most %d", len(res.Charges), bounds.MaxCharges)
	}
	res.who = identity{tenant: req.Tenant, user: req.User, ip: req.IP, apiKey: req.APIKey, keyHash: res.keyHash, auth: res.auth,
		untrusted: req.Untrusted, unvouched: req.Unvouched || req.Untrusted}
	res.who.keyed = res.auth != nil && res.auth.hashed && res.auth.found != nil
	if req.Untrusted {
		// A caller Admit does not trust is refused by its own address's
		// ban as well as by the one it names; a trusted one (the
		// platform's backend) is not its clients, and answers for the
		// address it names alone.
		res.who.client = req.Client
	}
	if res.Tenant != nil {
		res.who.tenant = res.Tenant.ID
	}
	if res.who.keyed {
		res.who.unvouched = false // a key of the tenant's vouches for it
	}
	if res.who.tenant == "" {
		res.who.user = "" // a user is a tenant's
	}
	return nil
}

func (p *Policy) add(req *Request, res *Resolution, r *Rule, global bool) {
	if (r.Algorithm == admit.Concurrency) != (req.Kind == Leases) || !r.Applies(req.Action) {
		return
	}
	if req.Debit && engine.CheckDebit(&r.Rule, 0) != nil {
		return
	}
	if r.Unit != units.UnitRequests && !req.Metered || r.PerModel && req.Model == "" {
		return
	}
	k := admit.Key{Scope: r.Scope, Rule: r.bucket}
	if !global || r.Scope == ScopeTenant || r.Scope == ScopeUser || r.Scope == ScopeSession {
		if req.Tenant == "" {
			return
		}
		k.Tenant = req.Tenant
	}
	switch r.Scope {
	case ScopeGlobal:
		k.Tenant = "" // one bucket for everyone, even in a tier
	case ScopeTenant:
	case ScopeUser:
		k.Subject = req.User
	case ScopeIP:
		k.Subject = req.IP
	case ScopeSession:
		k.Subject = req.Session
	case ScopeAPIKey:
		if req.APIKey != "" && res.keyHash == "" {
			if a := res.auth; a != nil && a.hashed {
				res.keyHash = string(a.hash[:])
			} else {
				res.keyHash = HashKey(req.APIKey)
			}
		}
		k.Subject = res.keyHash
	default:
		k.Subject = req.Attributes[r.attribute]
	}
	if k.Subject == "" && r.Scope != ScopeGlobal && r.Scope != ScopeTenant {
		return // the request does not carry the rule's scope
	}
	if req.Untrusted && k.Tenant == "" && r.Scope != ScopeAPIKey && (req.Debit || r.Scope != ScopeGlobal) {
		// A bucket every tenant shares, keyed by a value the caller
		// chose or charged a debit that is never refused: one tenant
		// could exhaust it for all (see Request.Untrusted).
		return
	}
	if r.PerAction {
		k.Action = req.Action
	}
	if r.PerModel {
		k.Rule = r.bucket + "#" + req.Model // "#" appears in no name
	}
	res.buf = k.Append(res.buf[:0])
	res.Charges = append(res.Charges, admit.Charge{
		Key: string(res.buf), Rule: &r.Rule, Cost: req.Cost, DryRun: req.DryRun, Debit: req.Debit,
		LeaseTTL: min(req.LeaseTTL, engine.LeaseTTL(&r.Rule)),
	})
	if r.Fair && k.Tenant == "" {
		if res.share.Class == "" {
			p.shareOf(req, res)
		}
		ch := &res.Charges[len(res.Charges)-1]
		ch.Share = &res.share
		if r.Scope == ScopeIP {
			ch.Share = &res.shareWhole // one key per address already
		}
	}
	// Hashed here, while the key is hot and its tenant known, once for
	// every store that reads the charge (the decision, a local fallback,
	// a retry).
	engine.PrepareChargeOf(&res.Charges[len(res.Charges)-1], k.Tenant)
	res.Rules = append(res.Rules, r)
}

// TenantOrDefault returns the tenant with the given id: the catalog's, or,
// when the catalog does not know it, a tenant of the default tier if the
// policy has one (Source "default"). Without a default tier an unknown
// tenant is admit.CodePermission.
func (p *Policy) TenantOrDefault(id string) (*Tenant, error) {
	if t := p.tenants[id]; t != nil {
		return t, nil
	}
	if p.fallback == nil {
		return nil, admit.Errorf(admit.CodePermission, "tenant %q is unknown", id)
	}
	return &Tenant{ID: id, Tier: p.fallback, Rules: p.fallback.Rules, Source: "default", Weight: p.fallback.Weight}, nil
}

// RuleResults yields each rule of a resolution with its result in a
// decision, index by index, and stops where the shorter list ends, so that
// a decision with fewer results than its request has rules is never read
// past its end.
func RuleResults(rules []*Rule, results []admit.Result) iter.Seq2[*Rule, *admit.Result] {
	return func(yield func(*Rule, *admit.Result) bool) {
		for i := range min(len(rules), len(results)) {
			if !yield(rules[i], &results[i]) {
				return
			}
		}
	}
}
