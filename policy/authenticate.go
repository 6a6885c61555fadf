package policy

import "github.com/admitdev/admit"

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
	if c.APIKey != "" {
		owner := p.TenantByKey(c.APIKey)
		switch {
		case owner == nil:
			return "", errUnknownKey
		case c.Tenant == "":
			return owner.ID, nil
		case owner.ID != c.Tenant:
			return "", admit.Errorf(admit.CodePermission, "the API key is not a key of tenant %q", c.Tenant)
		}
		return c.Tenant, nil
	}
	if t := p.tenants[c.Tenant]; t != nil && t.HasAPIKeys() && !c.Trusted {
		return "", errKeyRequired
	}
	return c.Tenant, nil
}

var (
	errUnknownKey  = admit.Errorf(admit.CodeUnauthenticated, "the API key is not known")
	errKeyRequired = admit.Errorf(admit.CodeUnauthenticated, "the tenant has API keys: present one (X-API-Key, Authorization: Bearer, or an api_key descriptor entry)")
)
