package server

import (
	"net/http"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/policy"
)

// leaseRequest is the body of POST /v1/leases. Resource is the action the
// tenant's concurrency rules are matched against.
type leaseRequest struct {
	Tenant     string            `json:"tenant"`
	User       string            `json:"user"`
	Resource   string            `json:"resource"`
	TTLMS      int64             `json:"ttl_ms"`
	Cost       *int64            `json:"cost"`
	IP         string            `json:"ip"`
	APIKey     string            `json:"api_key"`
	Session    string            `json:"session"`
	Attributes map[string]string `json:"attributes"`
}

type leaseAnswer struct {
	LeaseID   string    `json:"lease_id"`
	ExpiresAt time.Time `json:"expires_at"`
	// Failover is "open" or "local" for a lease taken while the store
	// was down: one that holds no slot, or a slot of this server's own.
	Failover string `json:"failover,omitempty"`
}

func (s *Server) handleLeaseAcquire(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	c := getCall()
	defer putCall(c)
	var body leaseRequest
	if err := decodeJSON(w, r, &body); err != nil {
		s.fail(w, r, "lease", err)
		return
	}
	if body.TTLMS < 0 || body.TTLMS > admit.MaxRatePeriod.Milliseconds() {
		e := admit.Errorf(admit.CodeInvalid, "ttl_ms %d: must be from 0 (the rule's lease_ttl) to %d; a longer one is cut to the rule's lease_ttl", body.TTLMS, admit.MaxRatePeriod.Milliseconds())
		e.Field = "ttl_ms"
		s.fail(w, r, "lease", e)
		return
	}
	ttl := time.Duration(body.TTLMS) * time.Millisecond
	cr := checkRequest{
		Tenant: body.Tenant, User: body.User, Action: body.Resource, Cost: body.Cost,
		IP: body.IP, APIKey: body.APIKey, Session: body.Session, Attributes: body.Attributes,
	}
	p := s.catalog.Policy()
	if err := s.request(r, c, &cr, p, policy.Leases, ttl); err != nil {
		s.fail(w, r, "lease", err)
		return
	}
	if len(c.res.Charges) == 0 {
		s.fail(w, r, "lease", admit.Errorf(admit.CodeNotFound, "no concurrency rule applies to resource %q of tenant %q", body.Resource, c.req.Tenant))
		return
	}
	if err := s.decide(r.Context(), c); err != nil {
		s.fail(w, r, "lease", err)
		return
	}
	s.record(c, "lease", start)
	if !c.d.Allowed || c.d.Lease.ID == "" {
		if c.d.Allowed { // admitted without a lease: shadow rules, or fail open
			s.fail(w, r, "lease", admit.Errorf(admit.CodeUnavailable, "no lease could be taken (the rules are in shadow mode or the store is unavailable)"))
			return
		}
		s.answer(w, c, -1)
		return
	}
	w.Header().Set("Location", "/v1/leases/"+c.d.Lease.ID)
	writeJSON(w, http.StatusCreated, leaseAnswer{LeaseID: c.d.Lease.ID, ExpiresAt: c.d.Lease.ExpiresAt.UTC(), Failover: failoverName(c.out)})
}

func (s *Server) handleLeaseRenew(w http.ResponseWriter, r *http.Request) {
	l, err := s.decider.RenewLease(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, "lease", err)
		return
	}
	writeJSON(w, http.StatusOK, leaseAnswer{LeaseID: l.ID, ExpiresAt: l.ExpiresAt.UTC()})
}

func (s *Server) handleLeaseRelease(w http.ResponseWriter, r *http.Request) {
	if err := s.decider.ReleaseLease(r.Context(), r.PathValue("id")); err != nil {
		s.fail(w, r, "lease", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// failoverName names how a decision was taken without the store, "" when
// the store took it.
func failoverName(out policy.Outcome) string {
	switch out {
	case policy.FailedOpen:
		return "open"
	case policy.FailedLocal:
		return "local"
	}
	return ""
}
