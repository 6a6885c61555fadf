package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/httpx"
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
	if body.TTLMS < 0 || body.TTLMS > bounds.MaxRatePeriod.Milliseconds() {
		e := admit.Errorf(admit.CodeInvalid, "ttl_ms %d: must be from 0 (the rule's lease_ttl) to %d; a longer one is cut to the rule's lease_ttl", body.TTLMS, bounds.MaxRatePeriod.Milliseconds())
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
	id := s.leaseOwner(r) + "." + c.d.Lease.ID
	c.buf = httpx.SetHeaders(w.Header(), c.buf, c.res.Rules, c.res.Charges, c.d.Results)
	w.Header().Set("Location", "/v1/leases/"+id)
	writeJSON(w, http.StatusCreated, leaseAnswer{LeaseID: id, ExpiresAt: c.d.Lease.ExpiresAt.UTC(), Failover: failoverName(c.out)})
}

// A lease is renewed and released only by the caller that took it: its id
// starts with a fingerprint of that caller (leaseOwner), which the
// request renewing or releasing it must have too. Someone who learned a
// lease's id — from a log, a shared proxy — cannot keep another's slots
// held, nor free them. The fingerprint is a hash, so the id tells nothing
// of the caller.

// leaseOwner returns the fingerprint of the caller of r: its service or
// admin token, else its API key, else the address it comes from, which an
// anonymous caller cannot choose (clients behind one address share it).
func (s *Server) leaseOwner(r *http.Request) string {
	h := sha256.New()
	switch tok, _ := httplimit.Bearer(r); {
	case s.callerOf(r).trusted():
		h.Write([]byte("token\x00" + tok))
	default:
		if key := s.presentedKey(r, false); key != "" {
			h.Write([]byte("key\x00" + key))
			break
		}
		h.Write([]byte("anonymous\x00"))
		if a := httplimit.ClientIP(r, s.trustedProxies, s.forwarded); a.IsValid() {
			h.Write([]byte(a.String()))
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// ownLease returns the store's id of lease id when the caller of r took
// it, else a not-found error, as for a lease that does not exist.
func (s *Server) ownLease(r *http.Request, id string) (string, error) {
	owner, inner, ok := strings.Cut(id, ".")
	if !ok || inner == "" {
		return "", admit.Errorf(admit.CodeNotFound, "lease %.64q does not exist", id)
	}
	want := s.leaseOwner(r)
	if subtle.ConstantTimeCompare([]byte(owner), []byte(want)) != 1 {
		return "", admit.Errorf(admit.CodeNotFound, "lease %.64q does not exist, or another caller took it", id)
	}
	return inner, nil
}

func (s *Server) handleLeaseRenew(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	inner, err := s.ownLease(r, id)
	if err != nil {
		s.fail(w, r, "lease", err)
		return
	}
	l, err := s.decider.RenewLease(r.Context(), inner)
	if err != nil {
		s.fail(w, r, "lease", err)
		return
	}
	writeJSON(w, http.StatusOK, leaseAnswer{LeaseID: id, ExpiresAt: l.ExpiresAt.UTC()})
}

func (s *Server) handleLeaseRelease(w http.ResponseWriter, r *http.Request) {
	inner, err := s.ownLease(r, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, "lease", err)
		return
	}
	if err := s.decider.ReleaseLease(r.Context(), inner); err != nil {
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
