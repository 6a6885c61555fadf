package server

import (
	"net/http"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/policy"
)

// banRequest is the body of POST /v1/admin/bans.
type banRequest struct {
	Scope  string `json:"scope"`
	Value  string `json:"value"`
	Tenant string `json:"tenant"`
	TTL    string `json:"ttl"` // a duration: "10m"
	Reason string `json:"reason"`
}

// banView is a ban as the admin API shows it.
type banView struct {
	policy.Ban
	ExpiresInS int64 `json:"expires_in_s"`
}

func viewBan(b policy.Ban, now time.Time) banView {
	return banView{Ban: b, ExpiresInS: int64(max(b.Expires.Sub(now), 0)+time.Second-1) / int64(time.Second)}
}

// bans returns the server's bans, or answers 404 when it enforces none.
func (s *Server) bans(w http.ResponseWriter) *policy.Bans {
	b := s.decider.Bans()
	if b == nil {
		writeProblem(w, http.StatusNotFound, "this server enforces no bans")
	}
	return b
}

// handleBanCreate serves POST /v1/admin/bans: the ban is in force on this
// server when the answer is sent, and on the others of its store within a
// second.
func (s *Server) handleBanCreate(w http.ResponseWriter, r *http.Request) {
	bans := s.bans(w)
	if bans == nil {
		return
	}
	var req banRequest
	if err := decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	ttl, err := time.ParseDuration(req.TTL)
	if err != nil {
		e := admit.Errorf(admit.CodeInvalid, "ttl %.32q is not a duration like 10m", req.TTL)
		e.Field = "ttl"
		s.writeError(w, r, e)
		return
	}
	b, err := bans.Add(r.Context(), policy.Ban{Scope: req.Scope, Value: req.Value, Tenant: req.Tenant, Reason: req.Reason}, ttl)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.log.Info("ban set", "id", b.ID, "scope", b.Scope, "value", b.Value, "tenant", b.Tenant, "expires_at", b.Expires, "reason", b.Reason)
	w.Header().Set("Location", "/v1/admin/bans/"+b.ID)
	writeJSON(w, http.StatusCreated, viewBan(b, time.Now()))
}

// handleBans serves GET /v1/admin/bans: the bans in force, by id.
func (s *Server) handleBans(w http.ResponseWriter, r *http.Request) {
	bans := s.bans(w)
	if bans == nil {
		return
	}
	now := time.Now()
	list := bans.List()
	out := make([]banView, len(list))
	for i, b := range list {
		out[i] = viewBan(b, now)
	}
	writeJSON(w, http.StatusOK, map[string]any{"bans": out, "max_bans": policy.MaxBans})
}

// handleBanGet serves GET /v1/admin/bans/{id}.
func (s *Server) handleBanGet(w http.ResponseWriter, r *http.Request) {
	bans := s.bans(w)
	if bans == nil {
		return
	}
	b, ok := bans.Get(r.PathValue("id"))
	if !ok {
		writeProblem(w, http.StatusNotFound, "no ban "+r.PathValue("id")+" is in force")
		return
	}
	writeJSON(w, http.StatusOK, viewBan(b, time.Now()))
}

// handleBanDelete serves DELETE /v1/admin/bans/{id}: the ban is lifted.
func (s *Server) handleBanDelete(w http.ResponseWriter, r *http.Request) {
	bans := s.bans(w)
	if bans == nil {
		return
	}
	ok, err := bans.Remove(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !ok {
		writeProblem(w, http.StatusNotFound, "no ban "+r.PathValue("id")+" is in force")
		return
	}
	s.log.Info("ban lifted", "id", r.PathValue("id"))
	w.WriteHeader(http.StatusNoContent)
}
