package policy

import (
	"crypto/sha256"

	"github.com/admitdev/admit"
)

// Credentials are what a caller presented to act for a tenant.
type Credentials struct {
	// Tenant is the tenant the request names; "" when it names none.
	Tenant string
	// APIKey is the API key the caller presented, wherever it came from
	// (a body field, X-API-Key, Authorization: Bearer, an Envoy
	// descriptor entry); "" when none came.
	APIKey string
	// Trusted is set when the caller has proved it may act for any
	// tenant without the tenant's key: the admin token, a verified JWT
	// that names the tenant, or a gateway session the tenant created.
	Trusted bool
}

// Authenticate applies Admit's one authentication rule, which every front
// end shares (docs/api.md#authentication):
//
//   - An API key that is present must be known. An unknown key is refused
//     with admit.CodeUnauthenticated, whoever presents it and whatever the
//     tenant; it is never ignored.
//   - A known key acts for its own tenant: it names the tenant when the
//     request names none, and a request that names another tenant is
//     refused with admit.CodePermission.
//   - A tenant that has API keys needs one of them, unless the caller is
//     trusted: admit.CodeUnauthenticated otherwise.
//
// It returns the tenant the request acts for, "" for none. Whether that
// tenant exists is Resolve's to say.
func (p *Policy) Authenticate(c Credentials) (string, error) {
	var a authenticated
	err := p.authenticate(c, &a)
	return a.tenant, err
}

// AuthenticateRequest applies Authenticate's rule to req's tenant and API
// key and sets req.Tenant to the tenant it acts for. It remembers on req
// what it found (the tenant, the key's hash), so that Resolve neither
// looks the tenant up nor hashes the key again.
func (p *Policy) AuthenticateRequest(req *Request, trusted bool) error {
	a := &req.auth
	if err := p.authenticate(Credentials{Tenant: req.Tenant, APIKey: req.APIKey, Trusted: trusted}, a); err != nil {
		*a = authenticated{}
		return err
	}
	a.policy, a.apiKey = p, req.APIKey
	req.Tenant = a.tenant
	return nil
}

// authenticated is what authenticating a request found, for Resolve. It
// holds for the request only while the request's tenant and key are the
// ones authenticated, under the same policy.
type authenticated struct {
	policy *Policy
	tenant string  // the tenant the request acts for
	found  *Tenant // the catalog's tenant of that id; nil if it has none
	apiKey string  // the key presented, and its hash (hex SHA-256)
	hashed bool
	hash   [2 * sha256.Size]byte
}

// holds reports whether a applies to req resolved against p.
func (a *authenticated) holds(p *Policy, req *Request) bool {
	return a.policy == p && a.tenant == req.Tenant && a.apiKey == req.APIKey
}

func (p *Policy) authenticate(c Credentials, a *authenticated) error {
	if c.APIKey != "" {
		a.hash, a.hashed = hashKey(c.APIKey), true
		owner := p.byKey[string(a.hash[:])] // no allocation: a map index by a converted []byte
		switch {
		case owner == nil:
			return errUnknownKey
		case c.Tenant != "" && owner.ID != c.Tenant:
			return admit.Errorf(admit.CodePermission, "the API key is not a key of tenant %q", c.Tenant)
		}
		a.tenant, a.found = owner.ID, owner
		return nil
	}
	t := p.tenants[c.Tenant]
	if t != nil && t.HasAPIKeys() && !c.Trusted {
		return errKeyRequired
	}
	a.tenant, a.found = c.Tenant, t
	return nil
}

var (
	errUnknownKey  = admit.Errorf(admit.CodeUnauthenticated, "the API key is not known")
	errKeyRequired = admit.Errorf(admit.CodeUnauthenticated, "the tenant has API keys: present one (X-API-Key, Authorization: Bearer, or an api_key descriptor entry)")
)
