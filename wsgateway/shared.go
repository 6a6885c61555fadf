package wsgateway

import (
	"net"
	"net/http"
	"slices"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/policy"
)

// The actions of WebSocket traffic, which the gateway's own buckets are
// keyed by and global rules name to be charged by it.
const (
	// ActionConnect is a connection's admission.
	ActionConnect = "ws:connect"
	// ActionMessage is a message's admission.
	ActionMessage = "ws:message"
)

// Global rules on WebSocket traffic.
//
// A global rule is charged by WebSocket traffic only when its actions name
// ws:connect or ws:message: a connection's admission is decided, all or
// nothing, with the tier's four connection limits and every global rule
// naming ws:connect, and a message's with the tenant's
// messages_per_minute and every global rule naming ws:message. A rule of
// every action is not charged, so that a configuration written for HTTP
// traffic does not begin to spend its global request buckets on frames.
//
// The rules are resolved through the policy, as an HTTP check is: a rule
// tenants share (fair_share) is divided among the tenants that want it,
// each charge carrying its tenant's share. The session proves its tenant:
// a tenant of the catalog is a class of its own. A tenant only the default
// tier knows is not (anyone may create sessions for any name it does not
// know): such traffic is the anonymous callers', shared by client address,
// as the HTTP API shares it.
//
// A global concurrency rule naming ws:connect holds a slot for the
// connection's life, in the connection's lease: renewed by the gateway
// every lease_ttl/3, released when the connection ends, and reclaimed
// gateway.lease_ttl after a server dies (the rule's own lease_ttl does not
// apply). A message holds nothing, so concurrency rules naming ws:message
// are not charged.

// sharedRules are the global rules of one policy that WebSocket traffic is
// charged to.
type sharedRules struct {
	policy  *policy.Policy
	connect []*policy.Rule // naming ws:connect
	message []*policy.Rule // naming ws:message, but concurrency rules
	// connectLeases and connectRequests say connect has concurrency
	// rules (resolved as policy.Leases) and others (policy.Requests).
	connectLeases, connectRequests bool
}

// sharedOf returns the global rules of p that WebSocket traffic is charged
// to, computed once per policy.
func (g *Gateway) sharedOf(p *policy.Policy) *sharedRules {
	if s := g.shared.Load(); s != nil && s.policy == p {
		return s
	}
	s := &sharedRules{policy: p}
	for _, r := range p.Global() {
		actions := r.Actions() // ["*"] for every action
		if slices.Contains(actions, ActionConnect) {
			s.connect = append(s.connect, r)
			if r.Algorithm == admit.Concurrency {
				s.connectLeases = true
			} else {
				s.connectRequests = true
			}
		}
		if slices.Contains(actions, ActionMessage) && r.Algorithm != admit.Concurrency {
			s.message = append(s.message, r)
		}
	}
	g.shared.Store(s)
	return s
}

// resolveShared resolves req into res, keeping the charges of rules only
// (whatever other rules the policy charges req's action): the global
// rules that WebSocket traffic is charged to.
func resolveShared(p *policy.Policy, req *policy.Request, rules []*policy.Rule, res *policy.Resolution) error {
	if err := p.Resolve(req, res); err != nil {
		return err
	}
	n := 0
	for i, r := range res.Rules {
		if slices.Contains(rules, r) {
			res.Charges[n], res.Rules[n] = res.Charges[i], r
			n++
		}
	}
	res.Charges, res.Rules = res.Charges[:n], res.Rules[:n]
	return nil
}

// client is who a connection's traffic comes from in the limits tenants
// share.
type client struct {
	// addr is the client's address (Options.ClientAddr), "" if unknown.
	addr string
	// anonymous says the tenant is one only the default tier knows, whose
	// traffic is the anonymous callers'.
	anonymous bool
}

// clientOf returns who r comes from, for a tenant t.
func (g *Gateway) clientOf(r *http.Request, t *policy.Tenant) client {
	return client{addr: g.clientAddr(r), anonymous: t.Source == "default"}
}

// request returns the policy request of the client's traffic of action.
func (cl client) request(tenant, session, action string, kind policy.Kind, dryRun bool) policy.Request {
	return policy.Request{
		Tenant: tenant, Session: session, Action: action, Kind: kind, Cost: 1, DryRun: dryRun,
		Untrusted: cl.anonymous, Client: cl.addr,
	}
}

// refusalKey returns key made the client's: the refusals a store gives an
// anonymous client's share are its address's, not its tenant's.
func (cl client) refusalKey(key string) string {
	if !cl.anonymous {
		return key
	}
	return key + "\x00" + policy.ClientPrefix(cl.addr)
}

// peerAddr returns the address of r's peer, the default ClientAddr.
func peerAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// msgCharges are what a connection's messages are charged under one
// policy: the tenant's messages_per_minute, then the global rules naming
// ws:message. Built by the connection's first message under a policy,
// they serve every message after it, so that a message resolves nothing.
type msgCharges struct {
	policy *policy.Policy
	limits *limits
	shared *sharedRules
	// res holds the global rules' resolution, whose share their charges
	// point to.
	res     policy.Resolution
	charges []admit.Charge
	rules   []*policy.Rule
}

// messageCharges returns the charges of c's messages under p, where c's
// tenant has the limits l. Only c's reading goroutine calls it.
func (c *conn) messageCharges(p *policy.Policy, l *limits) (*msgCharges, error) {
	if m := c.msg; m != nil && m.policy == p && m.limits == l {
		return m, nil
	}
	m := &msgCharges{policy: p, limits: l, shared: c.g.sharedOf(p)}
	rule := l.messages[0]
	own := admit.Charge{Key: c.msgKey, Rule: &rule.Rule, Cost: 1}
	engine.PrepareChargeOf(&own, c.tenant) // key(…, c.tenant, …): its tenant's
	if len(m.shared.message) == 0 {
		m.charges, m.rules = []admit.Charge{own}, l.messages[:]
	} else {
		req := c.client.request(c.tenant, c.session, ActionMessage, policy.Requests, false)
		if err := resolveShared(p, &req, m.shared.message, &m.res); err != nil {
			return nil, err
		}
		m.charges = append([]admit.Charge{own}, m.res.Charges...)
		m.rules = append([]*policy.Rule{rule}, m.res.Rules...)
	}
	c.msg = m
	return m, nil
}

// sharedRefusal is what a refusal by the decision's global rules says.
type sharedRefusal struct {
	refused   bool // a global rule refused
	overShare bool // one of them for the tenant's share alone
	// slots says the refusal is a global concurrency rule's (it names the
	// decision's refusal), whose slots any connection's end may free.
	slots bool
}

// sharedRefusalOf reads a refused decision dec of charges whose rules are
// rules, the gateway's own first (own of them) and the global rules after.
func sharedRefusalOf(dec *admit.Decision, rules []*policy.Rule, own int) sharedRefusal {
	var s sharedRefusal
	for i := own; i < min(len(rules), len(dec.Results)); i++ {
		r := &dec.Results[i]
		if r.Allowed || r.Shadow || r.Debit {
			continue
		}
		s.refused = true
		s.overShare = s.overShare || r.Share == admit.ShareRefused
		s.slots = s.slots || r.Rule == dec.DeniedBy && rules[i].Algorithm == admit.Concurrency
	}
	return s
}
