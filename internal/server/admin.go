package server

import (
	"net/http"
	"slices"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/catalog"
)

// tenantView is a tenant as the admin API shows it. API keys are counted,
// never shown: only their hashes are kept.
type tenantView struct {
	ID        string            `json:"id"`
	Tier      string            `json:"tier"`
	Overrides []policy.RuleSpec `json:"overrides"`
	APIKeys   int               `json:"api_keys"`
	// APIKeyIDs name the keys for DELETE …/api-keys/{key id}.
	APIKeyIDs []string `json:"api_key_ids"`
	Source    string   `json:"source"`
	// Rules are the tenant's effective rules: its tier's, overrides applied.
	Rules []policy.RuleSpec `json:"rules"`
}

func viewTenant(t *policy.Tenant) tenantView {
	v := tenantView{
		ID: t.ID, Tier: t.Tier.Name, Overrides: t.Spec.Overrides, APIKeys: len(t.Spec.APIKeysSHA256),
		Source: t.Source, Rules: make([]policy.RuleSpec, len(t.Rules)),
	}
	if v.Overrides == nil {
		v.Overrides = []policy.RuleSpec{}
	}
	v.APIKeyIDs = make([]string, len(t.Spec.APIKeysSHA256))
	for i, h := range t.Spec.APIKeysSHA256 {
		v.APIKeyIDs[i] = catalog.APIKeyID(h)
	}
	for i, r := range t.Rules {
		v.Rules[i] = r.Spec()
	}
	return v
}

type tierView struct {
	Name    string            `json:"name"`
	Source  string            `json:"source"`
	Rules   []policy.RuleSpec `json:"rules"`
	Gateway policy.Gateway    `json:"gateway"`
	Tenants int               `json:"tenants"`
}

func viewTier(p *policy.Policy, t *policy.Tier) tierView {
	v := tierView{Name: t.Name, Source: t.Source, Rules: make([]policy.RuleSpec, len(t.Rules)), Gateway: t.Gateway}
	for i, r := range t.Rules {
		v.Rules[i] = r.Spec()
	}
	for _, tn := range p.Tenants() {
		if tn.Tier == t {
			v.Tenants++
		}
	}
	return v
}

func (s *Server) handleTenants(w http.ResponseWriter, r *http.Request) {
	ts := s.catalog.Policy().Tenants()
	out := make([]tenantView, len(ts))
	for i, t := range ts {
		out[i] = viewTenant(t)
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenants": out})
}

func (s *Server) handleTenantGet(w http.ResponseWriter, r *http.Request) {
	t := s.catalog.Policy().Tenant(r.PathValue("id"))
	if t == nil {
		writeProblem(w, http.StatusNotFound, "tenant "+quote(r.PathValue("id"))+" is unknown")
		return
	}
	writeJSON(w, http.StatusOK, viewTenant(t))
}

// tenantPut is the body of PUT /v1/admin/tenants/{id}.
type tenantPut struct {
	Tier          string            `json:"tier"`
	Overrides     []policy.RuleSpec `json:"overrides"`
	BillingAnchor string            `json:"billing_anchor"`
	Weight        int64             `json:"weight"`
}

func (s *Server) handleTenantPut(w http.ResponseWriter, r *http.Request) {
	var body tenantPut
	if err := decodeJSON(w, r, &body); err != nil {
		s.writeError(w, r, err)
		return
	}
	t, err := s.catalog.PutTenant(r.Context(), r.PathValue("id"), policy.TenantSpec{Tier: body.Tier, Overrides: body.Overrides, BillingAnchor: body.BillingAnchor, Weight: body.Weight})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.log.Info("tenant changed", "tenant", t.ID, "tier", t.Tier.Name, "overrides", len(t.Spec.Overrides))
	writeJSON(w, http.StatusOK, viewTenant(t))
}

func (s *Server) handleTenantDelete(w http.ResponseWriter, r *http.Request) {
	if err := s.catalog.DeleteTenant(r.Context(), r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.log.Info("tenant deleted", "tenant", r.PathValue("id"))
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleAPIKeyCreate(w http.ResponseWriter, r *http.Request) {
	key, err := s.catalog.CreateAPIKey(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	id := catalog.APIKeyID(policy.HashKey(key))
	s.log.Info("API key created", "tenant", r.PathValue("id"), "key_id", id) // never the key
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, map[string]string{"api_key": key, "key_id": id, "tenant": r.PathValue("id")})
}

// handleAPIKeyRevoke serves DELETE /v1/admin/tenants/{id}/api-keys/{key}:
// the key (named by its key_id) is refused from the next request on.
func (s *Server) handleAPIKeyRevoke(w http.ResponseWriter, r *http.Request) {
	if err := s.catalog.RevokeAPIKey(r.Context(), r.PathValue("id"), r.PathValue("key")); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.log.Info("API key revoked", "tenant", r.PathValue("id"), "key_id", r.PathValue("key"))
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleTiers(w http.ResponseWriter, r *http.Request) {
	p := s.catalog.Policy()
	ts := p.Tiers()
	out := make([]tierView, len(ts))
	for i, t := range ts {
		out[i] = viewTier(p, t)
	}
	writeJSON(w, http.StatusOK, map[string]any{"tiers": out})
}

func (s *Server) handleTierGet(w http.ResponseWriter, r *http.Request) {
	p := s.catalog.Policy()
	t := p.Tier(r.PathValue("name"))
	if t == nil {
		writeProblem(w, http.StatusNotFound, "tier "+quote(r.PathValue("name"))+" is unknown")
		return
	}
	writeJSON(w, http.StatusOK, viewTier(p, t))
}

func (s *Server) handleTierPut(w http.ResponseWriter, r *http.Request) {
	var body policy.TierSpec
	if err := decodeJSON(w, r, &body); err != nil {
		s.writeError(w, r, err)
		return
	}
	t, err := s.catalog.PutTier(r.Context(), r.PathValue("name"), body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.log.Info("tier changed", "tier", t.Name, "rules", len(t.Rules))
	writeJSON(w, http.StatusOK, viewTier(s.catalog.Policy(), t))
}

// scopeRequest names the buckets of /v1/admin/state and /v1/admin/reset.
type scopeRequest struct {
	Tenant     string            `json:"tenant"`
	User       string            `json:"user"`
	Action     string            `json:"action"`
	IP         string            `json:"ip"`
	APIKey     string            `json:"api_key"`
	Session    string            `json:"session"`
	Attributes map[string]string `json:"attributes"`
	// Rules limits a reset to the named rules; empty resets them all.
	Rules []string `json:"rules"`
}

// resolveAll resolves b into the charges of both its requests and its
// leases, at cost 0.
func (s *Server) resolveAll(b *scopeRequest) (*policy.Resolution, error) {
	p := s.catalog.Policy()
	req := policy.Request{
		Tenant: b.Tenant, User: b.User, Action: b.Action, IP: b.IP, APIKey: b.APIKey,
		Session: b.Session, Attributes: b.Attributes,
	}
	var all, leases policy.Resolution
	if err := p.Resolve(&req, &all); err != nil {
		return nil, err
	}
	req.Kind = policy.Leases
	if err := p.Resolve(&req, &leases); err != nil {
		return nil, err
	}
	all.Charges = append(all.Charges, leases.Charges...)
	all.Rules = append(all.Rules, leases.Rules...)
	if len(b.Rules) > 0 {
		keep := 0
		for i, r := range all.Rules {
			if slices.Contains(b.Rules, r.Name) {
				all.Charges[keep], all.Rules[keep] = all.Charges[i], r
				keep++
			}
		}
		all.Charges, all.Rules = all.Charges[:keep], all.Rules[:keep]
	}
	if len(all.Charges) > bounds.MaxCharges {
		return nil, admit.Errorf(admit.CodeInvalid, "%d buckets; at most %d at once", len(all.Charges), bounds.MaxCharges)
	}
	return &all, nil
}

type bucketView struct {
	Name         string `json:"name"`
	Scope        string `json:"scope"`
	Algorithm    string `json:"algorithm"`
	Key          string `json:"key"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	ResetAfterMS int64  `json:"reset_after_ms"`
	// ClassRemaining is, for a limit tenants share, what the request's
	// class may still take of it (Remaining is what the limit holds).
	ClassRemaining *int64 `json:"class_remaining,omitempty"`
}

// handleState shows the current levels of the buckets a request would be
// charged against, read at cost 0 (nothing is charged).
func (s *Server) handleState(w http.ResponseWriter, r *http.Request) {
	q, ok := s.query(w, r)
	if !ok {
		return
	}
	b := scopeRequest{
		Tenant: q.Get("tenant"), User: q.Get("user"), Action: q.Get("action"), IP: q.Get("ip"),
		APIKey: q.Get("api_key"), Session: q.Get("session"),
	}
	res, err := s.resolveAll(&b)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var d admit.Decision
	if len(res.Charges) > 0 {
		if err := s.store.Decide(r.Context(), res.Charges, &d); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	out := make([]bucketView, 0, len(res.Charges))
	for rule, x := range policy.RuleResults(res.Rules, d.Results) {
		v := bucketView{
			Name: rule.Name, Scope: rule.Scope, Algorithm: rule.Algorithm.String(), Key: res.Charges[len(out)].Key,
			Limit: x.Limit, Remaining: x.Remaining, ResetAfterMS: ms(x.ResetAfter),
		}
		if res.Charges[len(out)].Share != nil {
			class := x.Remaining
			v.Remaining, v.ClassRemaining = x.Shared, &class
		}
		out = append(out, v)
	}
	ans := map[string]any{"buckets": out}
	if res.Tenant != nil {
		ans["tenant"], ans["tier"] = res.Tenant.ID, res.Tenant.Tier.Name
	}
	writeJSON(w, http.StatusOK, ans)
}

// handleReset forgets the state of the buckets a request names.
func (s *Server) handleReset(w http.ResponseWriter, r *http.Request) {
	var b scopeRequest
	if err := decodeJSON(w, r, &b); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.resolveAll(&b)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(res.Charges) > 0 {
		if err := s.store.Reset(r.Context(), res.Charges); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	names := make([]string, len(res.Rules))
	for i, rule := range res.Rules {
		names[i] = rule.Name
	}
	s.log.Info("buckets reset", "tenant", b.Tenant, "rules", names)
	writeJSON(w, http.StatusOK, map[string]any{"reset": names})
}

func quote(s string) string {
	b := appendString(nil, s)
	return string(b)
}
