package server

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/top"
	"github.com/admitdev/admit/problem"
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
	if _, err := strictQuery(r); err != nil {
		s.writeError(w, r, err)
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

// handleBansDelete serves DELETE /v1/admin/bans?source=&scope=&tenant=
// (or ?all=true): every ban in force that matches each filter given is
// lifted, on every server.
func (s *Server) handleBansDelete(w http.ResponseWriter, r *http.Request) {
	bans := s.bans(w)
	if bans == nil {
		return
	}
	q, err := strictQuery(r, "source", "scope", "tenant", "all")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	source, scope, tenant := q.Get("source"), q.Get("scope"), q.Get("tenant")
	if scope != "" && !slices.Contains([]string{policy.BanIP, policy.BanAPIKey, policy.BanUser, policy.BanTenant}, scope) {
		s.writeError(w, r, invalidParam("scope", fmt.Sprintf("scope %.32q: want ip, api_key, user or tenant", scope)))
		return
	}
	if name, ok := strings.CutPrefix(source, "escalation:"); source != "" && source != "admin" && (!ok || policy.CheckName(name) != nil) {
		s.writeError(w, r, invalidParam("source", fmt.Sprintf("source %.64q: want admin or escalation: and a rule's name", source)))
		return
	}
	if v, ok := q["all"]; ok && v[0] != "true" {
		s.writeError(w, r, invalidParam("all", "all takes true"))
		return
	}
	if source == "" && scope == "" && tenant == "" && q.Get("all") != "true" {
		s.writeError(w, r, invalidParam("all", "name what to lift: source, scope or tenant, or all=true for every ban"))
		return
	}
	n, err := bans.RemoveWhere(r.Context(), func(b policy.Ban) bool {
		return (source == "" || b.Source == source) && (scope == "" || b.Scope == scope) && (tenant == "" || b.Tenant == tenant || b.Scope == policy.BanTenant && b.Value == tenant)
	})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.log.Info("bans lifted", "count", n, "source", source, "scope", scope, "tenant", tenant)
	writeJSON(w, http.StatusOK, map[string]int{"lifted": n})
}

// handleTop serves GET /v1/admin/top?rule=NAME[&window=5m][&n=10]: the
// rule's heaviest refused and admitted callers over the window, every
// server's of the store.
func (s *Server) handleTop(w http.ResponseWriter, r *http.Request) {
	if s.callers == nil {
		writeProblem(w, http.StatusNotFound, "this server counts no callers")
		return
	}
	q, err := strictQuery(r, "rule", "window", "n")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rule := q.Get("rule")
	if rule == "" {
		s.writeError(w, r, invalidParam("rule", "name the rule: ?rule=NAME"))
		return
	}
	if !s.knowsRule(rule) {
		names := s.ruleNames()
		detail := "no rule " + strconv.Quote(rule)
		if sg := policy.Suggest(rule, names); sg != "" {
			detail += "; did you mean " + strconv.Quote(sg) + "?"
		}
		writeProblem(w, http.StatusNotFound, detail)
		return
	}
	window := 5 * time.Minute
	if v := q.Get("window"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Minute || d > top.Minutes*time.Minute {
			s.writeError(w, r, invalidParam("window", fmt.Sprintf("window %.32q: want a duration from 1m to %dm", v, top.Minutes)))
			return
		}
		window = d
	}
	n := 10
	if v := q.Get("n"); v != "" {
		k, err := strconv.Atoi(v)
		if err != nil || k < 1 || k > top.MaxListed {
			s.writeError(w, r, invalidParam("n", fmt.Sprintf("n %.16q: want 1 to %d", v, top.MaxListed)))
			return
		}
		n = k
	}
	t, err := s.callers.Top(r.Context(), rule, window, n)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// strictQuery parses r's query: a parameter not among allowed, one given
// twice, or a query that does not parse is an admit.CodeInvalid error.
func strictQuery(r *http.Request, allowed ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, admit.Errorf(admit.CodeInvalid, "the query does not parse: %v", err)
	}
	for k, v := range q {
		if !slices.Contains(allowed, k) {
			takes := "no parameter"
			if len(allowed) > 0 {
				takes = strings.Join(allowed, ", ")
			}
			return nil, invalidParam(k, fmt.Sprintf("unknown parameter %.32q: this endpoint takes %s", k, takes))
		}
		if len(v) > 1 {
			return nil, invalidParam(k, k+" is given twice")
		}
	}
	return q, nil
}

func invalidParam(field, msg string) error {
	e := admit.Errorf(admit.CodeInvalid, "%s", msg)
	e.Field = field
	return e
}

// ruleNames returns the names of the rules of the current policy.
func (s *Server) ruleNames() []string {
	seen := map[string]bool{}
	for _, r := range s.catalog.Policy().Rules() {
		seen[r.Name] = true
	}
	for _, name := range s.callers.Rules() { // an Envoy domain's limits too
		seen[name] = true
	}
	return slices.Sorted(maps.Keys(seen))
}

func (s *Server) knowsRule(name string) bool { return slices.Contains(s.ruleNames(), name) }

// topCallers returns each counted rule's heaviest refused callers over the
// last 5 minutes (the rules with refusals, five callers each), kept for 5
// seconds: the dashboard asks every few seconds, and each answer reads
// every server's sketches of every rule.
func (s *Server) topCallers(ctx context.Context) []top.Top {
	s.topMu.Lock()
	defer s.topMu.Unlock()
	if time.Since(s.topAt) < 5*time.Second && s.topLast != nil {
		return s.topLast
	}
	out := []top.Top{}
	for _, rule := range s.callers.Rules() {
		t, err := s.callers.Top(ctx, rule, 5*time.Minute, 5)
		if err == nil && len(t.Refused) > 0 {
			t.Admitted = nil
			out = append(out, t)
		}
	}
	s.topLast, s.topAt = out, time.Now()
	return out
}

// refuseBanned answers 429 to a caller a ban refuses — its tenant, user or
// API key, or, for an untrusted caller, the address the request comes
// from — with no store call,
// and reports whether it did: for the endpoints that read or write the
// store other than through a decision (sessions, usage).
func (s *Server) refuseBanned(w http.ResponseWriter, r *http.Request, tenant, user, apiKey string) bool {
	bans := s.decider.Bans()
	if bans == nil || !bans.Any() {
		return false
	}
	ip := ""
	if !s.callerOf(r).trusted() {
		// The platform's backend is not its clients: its own address's
		// ban does not refuse it (as on the decision API).
		if a := httplimit.ClientIP(r, s.trustedProxies, s.forwarded); a.IsValid() {
			ip, _ = policy.CanonicalIP(a.String())
		}
	}
	keyHash := ""
	if apiKey != "" {
		keyHash = policy.HashKey(apiKey)
	}
	now := time.Now()
	ban, ok := bans.MatchIdentity(tenant, user, ip, keyHash, now)
	if !ok {
		return false
	}
	left := ban.Expires.Sub(now)
	w.Header().Set("Retry-After", strconv.FormatInt(httpx.RetrySeconds(left), 10))
	problem.WriteDetails(w, problem.RefusalBy("ban:"+ban.ID, nil, left,
		"refused by ban:"+ban.ID+" until "+ban.Expires.UTC().Format(time.RFC3339)))
	return true
}
