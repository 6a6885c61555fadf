package envoyrls

import (
	"cmp"
	"errors"
	"slices"
	"strconv"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/policy"
)

// resolve turns each descriptor of req into its charges in c: a limit
// override's, the catalog's, or the configured limit it matches; then
// applies the matched limits' replaces.
func (s *Service) resolve(c *call, req *rlsv3.RateLimitRequest, cfg *Config, p *policy.Policy, catalog bool) error {
	domain := req.GetDomain()
	c.descs = c.descs[:0]
	c.refs = c.refs[:0]
	c.never = c.never[:0]
	c.all = policy.Resolution{Policy: p, Charges: c.all.Charges[:0], Rules: c.all.Rules[:0]}
	c.ban = nil
	bans := s.opts.Decider.Bans()
	if bans != nil && !bans.Any() {
		bans = nil
	}
	c.tenant, c.tenants = nil, 0
	var replaced []string
	for i, d := range req.GetDescriptors() {
		if err := c.readEntries(d); err != nil {
			return err
		}
		cost, never := hits(req, d)
		st := descState{from: len(c.refs)}
		switch {
		case d.GetLimit() != nil:
			l, err := s.override(d.GetLimit())
			if err != nil {
				return admit.Errorf(admit.CodeInvalid, "descriptor %d: limit override: %v", i, err)
			}
			st.limit = l
			// Overrides of other periods count apart, as upstream's
			// window keys do; those of one period share a counter.
			s.addLimit(c, &st, domain, "limit-override:"+l.Window().String(), l, Match{}, cost, never)
		case catalog:
			if err := s.addCatalog(c, p, &st, cost, never); err != nil {
				return err
			}
		default:
			if bans != nil && c.ban == nil {
				c.ban = c.bannedAddress(bans)
			}
			m := cfg.Lookup(domain, c.entries)
			if m.Limit != nil {
				st.limit = m.Limit
				replaced = append(replaced, m.Limit.Replaces...)
				s.addLimit(c, &st, domain, m.Limit.FullKey, m.Limit, m, cost, never)
			}
		}
		st.to = len(c.refs)
		c.descs = append(c.descs, st)
	}
	if c.tenants == 1 {
		// The request is one tenant's: its quotas' usage is the
		// tenant's, as the usage meter and the quota service count it.
		c.all.Tenant = c.tenant
	}
	if len(replaced) > 0 {
		c.replace(replaced)
	}
	// A domain that counts each hit decides more charges than one
	// decision takes in several (see Service.run): its hits are counted
	// each on its own anyway.
	if n := len(c.all.Charges); n > bounds.MaxCharges && !(c.each && n <= MaxDescriptors) {
		return admit.Errorf(admit.CodeInvalid, "the request resolves to %d charges; at most %d", n, bounds.MaxCharges)
	}
	return nil
}

// overrideFullKey is the FullKey of a limit a request's descriptor brings
// (a limit override); its statistics are named from the descriptor.
const overrideFullKey = "limit-override"

// hits returns a descriptor's cost: its own hits_addend if set (0 asks
// without counting), else the request's, where 0 means 1, at most
// bounds.MaxCount (no window counts further). never is set when the cost is
// more than a charge may carry but a counted debit's (see call.add).
func hits(req *rlsv3.RateLimitRequest, d *rlext.RateLimitDescriptor) (cost int64, never bool) {
	n := max(1, uint64(req.GetHitsAddend()))
	if h := d.GetHitsAddend(); h != nil {
		n = h.GetValue()
	}
	if d.GetIsNegativeHits() {
		n = 0 // a refund: Admit gives nothing back, and reports the counters
	}
	return int64(min(n, bounds.MaxCount)), n > bounds.MaxCost
}

// bannedAddress returns the ban in force over the client address of an
// envoyproxy/ratelimit descriptor, its remote_address entry (as its limits
// are keyed), nil if none. The peer's own address is not the client's:
// banning an Envoy's address refuses what it names, not all it forwards.
func (c *call) bannedAddress(bans *policy.Bans) *policy.Ban {
	for _, e := range c.entries {
		if e.Key == EntryRemoteAddress {
			if b := bannedIP(bans, e.Value); b != nil {
				return b
			}
		}
	}
	return nil
}

func bannedIP(bans *policy.Bans, addr string) *policy.Ban {
	ip, err := policy.CanonicalIP(addr)
	if err != nil {
		return nil
	}
	if b, ok := bans.MatchIdentity("", "", ip, "", time.Now()); ok {
		return &b
	}
	return nil
}

// readEntries copies a descriptor's entries into c.entries, bounded.
func (c *call) readEntries(d *rlext.RateLimitDescriptor) error {
	es := d.GetEntries()
	if len(es) > MaxEntries {
		return admit.Errorf(admit.CodeInvalid, "a descriptor has %d entries; at most %d", len(es), MaxEntries)
	}
	c.entries = c.entries[:0]
	for _, e := range es {
		k, v := e.GetKey(), e.GetValue()
		if len(k) > MaxEntryLen || len(v) > MaxEntryLen {
			return admit.Errorf(admit.CodeInvalid, "descriptor entry %.64q: keys and values are at most %d bytes", k, MaxEntryLen)
		}
		c.entries = append(c.entries, Entry{Key: k, Value: v})
	}
	return nil
}

// addLimit adds the charge of an envoyproxy/ratelimit limit (or override)
// for the descriptor in c.entries: one counter per domain, limit and entry
// values (a share_threshold wildcard's pattern standing for the value).
func (s *Service) addLimit(c *call, st *descState, domain, bucket string, l *Limit, m Match, cost int64, never bool) {
	switch {
	case l.Unlimited:
		st.kind = kindUnlimited
		return
	case l.rule == nil:
		st.kind = kindRefuseAll
		return
	}
	st.kind = kindCharged
	c.sub = c.sub[:0]
	pat := 0
	for i, e := range c.entries {
		c.sub = appendField(c.sub, e.Key)
		if i < 64 && m.Shared&(1<<i) != 0 {
			c.sub = append(c.sub, '*')
			c.sub = appendField(c.sub, m.Patterns[pat])
			pat++
			continue
		}
		c.sub = append(c.sub, '=')
		c.sub = appendField(c.sub, e.Value)
	}
	// The encoding of admit.Key{Scope: "envoy", Tenant: domain, Subject:
	// sub, Rule: bucket}, written without building the Key's strings.
	c.key = appendField(c.key[:0], "envoy")
	c.key = appendField(c.key, domain)
	c.key = strconv.AppendInt(c.key, int64(len(c.sub)), 10)
	c.key = append(c.key, ':')
	c.key = append(c.key, c.sub...)
	c.key = appendField(c.key, "")
	c.key = appendField(c.key, bucket)
	c.add(admit.Charge{Key: string(c.key), Rule: &l.rule.Rule, Cost: cost}, l.rule, never)
}

func appendField(b []byte, f string) []byte {
	b = strconv.AppendInt(b, int64(len(f)), 10)
	b = append(b, ':')
	return append(b, f...)
}

// add adds a charge for the current descriptor. Descriptors that share a
// counter each have their charge: the store decides them one after the
// other in the same decision, so the counter takes both costs and each
// descriptor reports its own place (4 then 3 remaining of 5).
func (c *call) add(ch admit.Charge, r *policy.Rule, never bool) {
	j := len(c.all.Charges)
	c.all.Charges = append(c.all.Charges, ch)
	c.all.Rules = append(c.all.Rules, r)
	c.never = append(c.never, false)
	x := &c.all.Charges[j]
	if never && c.each && x.Rule.Algorithm == admit.FixedWindow && x.Rule.Distribution == admit.Exact {
		// Counted as envoyproxy/ratelimit counts, whatever its cost: a
		// cost past bounds.MaxCount takes the count past any limit, as
		// the cost itself would.
		never = false
	}
	if never || !c.each && engine.CheckCost(x.Rule, x.Cost) != nil {
		// More than the rule can ever admit at once: over the limit
		// whatever the counter holds, which a peek reports.
		c.never[j] = true
	}
	if c.never[j] {
		x.Cost = 0
	}
	c.refs = append(c.refs, j)
}

// addCatalog resolves a descriptor of the catalog domain against Admit's
// tenants and rules and adds its charges.
func (s *Service) addCatalog(c *call, p *policy.Policy, st *descState, cost int64, never bool) error {
	r := &c.req
	*r = policy.Request{Cost: min(cost, bounds.MaxCost), Kind: policy.Requests}
	clear(c.attrs)
	// Each entry that names who asks, or an attribute, comes once: of two,
	// two readers could take either (a proxy the first, Admit the last).
	var twice string
	set := func(f *string, key, v string) {
		if *f != "" || twice != "" {
			twice = cmp.Or(twice, key)
			return
		}
		*f = v
	}
	for _, e := range c.entries {
		switch e.Key {
		case EntryTenant:
			set(&r.Tenant, e.Key, e.Value)
		case EntryUser:
			set(&r.User, e.Key, e.Value)
		case EntryAction:
			set(&r.Action, e.Key, e.Value)
		case EntryAPIKey:
			set(&r.APIKey, e.Key, e.Value)
		case EntryRemoteAddress, EntryIP:
			set(&r.IP, EntryRemoteAddress+" or "+EntryIP, e.Value)
		case EntrySession:
			set(&r.Session, e.Key, e.Value)
		case EntryGenericKey:
		default:
			if c.attrs == nil {
				c.attrs = map[string]string{}
			}
			if _, dup := c.attrs[e.Key]; dup && twice == "" {
				twice = e.Key
			}
			c.attrs[e.Key] = e.Value
		}
	}
	if twice != "" {
		err := admit.Errorf(admit.CodeInvalid, "a descriptor of domain %q names %s twice", s.opts.CatalogDomain, twice)
		err.Field = twice
		return err
	}
	if r.Action == "" {
		for _, e := range c.entries {
			if e.Key == EntryGenericKey {
				r.Action = e.Value
			}
		}
	}
	if len(c.attrs) > 0 {
		r.Attributes = c.attrs
	}
	// Envoy names the client's address (believed from a trusted peer
	// only: Options.TrustedPeers), and a tenant no api_key entry vouches
	// for: one only a default tier knows is anonymous in shared limits.
	r.Client, r.Unvouched = r.IP, true
	if c.peer != "" {
		r.Client = c.peer
	}
	// Envoy's descriptors are the client's credentials: the one rule
	// (policy.Authenticate) holds, with no caller trusted.
	if err := p.AuthenticateRequest(r, false); err != nil {
		return err
	}
	if err := p.Resolve(r, &c.one); err != nil {
		return err
	}
	if bans := s.opts.Decider.Bans(); bans != nil && c.ban == nil {
		if b, ok := bans.Matched(&c.one, s.opts.Now()); ok {
			c.ban = &b
		}
	}
	if t := c.one.Tenant; t != nil && t != c.tenant {
		c.tenant, c.tenants = t, c.tenants+1
	}
	if len(c.one.Charges) == 0 {
		st.kind = kindNone
		return nil
	}
	st.kind = kindCharged
	for i, ch := range c.one.Charges {
		if ch.Share != nil {
			// c.one is resolved again for the next descriptor, which
			// may be another tenant's.
			sh := *ch.Share
			ch.Share = &sh
		}
		c.add(ch, c.one.Rules[i], never)
	}
	return nil
}

// replace drops the limits that another matched limit replaces: their
// descriptors answer OK without a limit, and their charges are not made
// (unless another descriptor needs the same counter).
func (c *call) replace(names []string) {
	keep := make([]bool, len(c.all.Charges))
	for i := range c.descs {
		st := &c.descs[i]
		if st.limit != nil && st.limit.Name != "" && slices.Contains(names, st.limit.Name) {
			st.kind, st.limit = kindNone, nil
			continue
		}
		for _, j := range c.refs[st.from:st.to] {
			keep[j] = true
		}
	}
	// Compact the charges, renumbering every descriptor's references.
	renum := make([]int, len(c.all.Charges))
	n := 0
	for j := range c.all.Charges {
		renum[j] = n
		if keep[j] {
			c.all.Charges[n], c.all.Rules[n], c.never[n] = c.all.Charges[j], c.all.Rules[j], c.never[j]
			n++
		}
	}
	c.all.Charges, c.all.Rules, c.never = c.all.Charges[:n], c.all.Rules[:n], c.never[:n]
	for i := range c.descs {
		st := &c.descs[i]
		if st.kind == kindNone {
			st.from, st.to = 0, 0
			continue
		}
		for k := st.from; k < st.to; k++ {
			c.refs[k] = renum[c.refs[k]]
		}
	}
}

// overrideKey identifies the limit of a descriptor's limit override.
type overrideKey struct {
	rpu  uint32
	unit typev3.RateLimitUnit
	mult uint32
}

// maxOverrides bounds the cache of override limits: overrides come from
// Envoy's route configuration, so there are few of them.
const maxOverrides = 4096

// override returns the fixed window limit of a descriptor's limit
// override, cached so that its rule is shared by every request (stores
// cache per-rule work by the rule's address).
func (s *Service) override(o *rlext.RateLimitDescriptor_RateLimitOverride) (*Limit, error) {
	k := overrideKey{rpu: o.GetRequestsPerUnit(), unit: o.GetUnit(), mult: 1}
	if m := o.GetUnitMultiplier(); m != nil {
		if m.GetValue() == 0 {
			return nil, errors.New("unit_multiplier must be at least 1")
		}
		k.mult = m.GetValue()
	}
	s.overMu.Lock()
	l := s.overrides[k]
	s.overMu.Unlock()
	if l != nil {
		return l, nil
	}
	unit, ok := parseUnit(k.unit.String())
	if !ok {
		return nil, errors.New("unit " + k.unit.String() + " is not a rate limit unit")
	}
	l = &Limit{FullKey: overrideFullKey, RequestsPerUnit: k.rpu, Unit: unit, UnitMultiplier: k.mult}
	if l.Window() > bounds.MaxRatePeriod {
		return nil, errors.New("the period is longer than " + bounds.MaxRatePeriod.String())
	}
	if k.rpu > 0 {
		r := admit.Rule{Name: "limit-override", Algorithm: admit.FixedWindow, Limit: int64(k.rpu), Window: l.Window()}
		if err := r.Validate(); err != nil {
			return nil, err
		}
		l.rule = &policy.Rule{Rule: r, Scope: "envoy"}
		l.countEach()
	}
	s.overMu.Lock()
	defer s.overMu.Unlock()
	if prev := s.overrides[k]; prev != nil {
		return prev, nil
	}
	if len(s.overrides) < maxOverrides {
		s.overrides[k] = l
	}
	return l, nil
}
