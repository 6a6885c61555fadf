package server

import (
	"encoding/csv"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/usage"
)

// usageView is one rule's entry in GET /v1/usage: how much of it is used
// and until when, in the terms of its algorithm.
type usageView struct {
	Name      string `json:"name"`
	Scope     string `json:"scope"`
	Algorithm string `json:"algorithm"`
	Limit     int64  `json:"limit"`
	Used      int64  `json:"used"`
	Remaining int64  `json:"remaining"`
	// Windows and quotas: the period counted now.
	PeriodStart *time.Time `json:"period_start,omitempty"`
	PeriodEnd   *time.Time `json:"period_end,omitempty"`
	// Sliding windows and logs: the length of the window that slides.
	WindowMS int64 `json:"window_ms,omitempty"`
	// Buckets: the tokens there (remaining) and the time until full.
	Rate     string `json:"rate,omitempty"`
	RefillMS *int64 `json:"refill_ms,omitempty"`
	// Every rule: the time until it is back to its whole limit.
	ResetAfterMS int64 `json:"reset_after_ms"`
}

// handleUsage is GET /v1/usage?tenant=&user=&action=: every rule that
// applies to such a request, read at cost 0 (nothing is charged). A tenant
// reads its own with its API key (the one authentication rule), a service
// or the admin any tenant's. The buckets every tenant shares (global
// rules keyed by nothing, an ip or an attribute) are read only with a
// service or admin token: their levels tell what other tenants and other
// clients did (how many logins an address made), and the platform's own
// code asks for them.
func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request) {
	q, ok := s.query(w, r)
	if !ok {
		return
	}
	trusted := s.callerOf(r).trusted()
	req := policy.Request{
		Tenant: q.Get("tenant"), User: q.Get("user"), Action: q.Get("action"), IP: q.Get("ip"),
		Session: q.Get("session"), APIKey: s.presentedKey(r, trusted),
	}
	if req.Tenant == "" {
		e := admit.Errorf(admit.CodeInvalid, "tenant is required")
		e.Field = "tenant"
		s.writeError(w, r, e)
		return
	}
	p := s.catalog.Policy()
	if err := p.AuthenticateRequest(&req, trusted); err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.refuseBanned(w, r, req.Tenant, req.User, req.APIKey) {
		return
	}
	var all, leases policy.Resolution
	err := p.Resolve(&req, &all)
	if err == nil {
		req.Kind = policy.Leases
		err = p.Resolve(&req, &leases)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	all.Charges = append(all.Charges, leases.Charges...)
	all.Rules = append(all.Rules, leases.Rules...)
	if !trusted {
		kept := 0
		for i, r := range all.Rules {
			if !r.SharedByTenants() {
				all.Rules[kept], all.Charges[kept] = r, all.Charges[i]
				kept++
			}
		}
		all.Rules, all.Charges = all.Rules[:kept], all.Charges[:kept]
	}
	for i := range all.Charges {
		all.Charges[i].Cost = 0
	}
	var d admit.Decision
	if len(all.Charges) > 0 {
		if err := s.store.Decide(r.Context(), all.Charges, &d); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	now := time.Now()
	out := make([]usageView, 0, len(all.Rules))
	for rule, x := range policy.RuleResults(all.Rules, d.Results) {
		out = append(out, usageOf(rule, x, now))
	}
	ans := map[string]any{"tenant": all.Tenant.ID, "tier": all.Tenant.Tier.Name, "rules": out}
	writeJSON(w, http.StatusOK, ans)
}

func usageOf(rule *policy.Rule, x *admit.Result, now time.Time) usageView {
	v := usageView{
		Name: rule.Name, Scope: rule.Scope, Algorithm: rule.Algorithm.String(),
		Limit: x.Limit, Remaining: x.Remaining, Used: max(x.Limit-x.Remaining, 0), ResetAfterMS: ms(x.ResetAfter),
	}
	utc := func(t time.Time) *time.Time { t = t.UTC(); return &t }
	switch rule.Algorithm {
	case admit.TokenBucket, admit.GCRA, admit.Combination:
		refill := ms(x.ResetAfter)
		v.Rate, v.RefillMS = rule.Rate.String(), &refill
	case admit.FixedWindow:
		end := now.Add(x.ResetAfter)
		if x.ResetAfter == 0 { // nothing counted: the window now running
			end = now.Truncate(rule.Window).Add(rule.Window)
		}
		v.PeriodStart, v.PeriodEnd = utc(end.Add(-rule.Window)), utc(end)
	case admit.Quota:
		// A period in progress keeps its end (an anchor that changed
		// applies from the next): the end the store reports is the one.
		end := now.Add(x.ResetAfter).Round(time.Second)
		start, _ := engine.PeriodAt(&rule.Rule, end.Add(-time.Second))
		v.PeriodStart, v.PeriodEnd = utc(start), utc(end)
	case admit.SlidingWindow, admit.SlidingLog:
		v.WindowMS = ms(rule.Window)
	}
	return v
}

// handleUsageRecords is GET /v1/admin/usage?tenant=&from=&to=: a tenant's
// usage records whose period overlaps [from, to) (dates or RFC 3339
// times; from the first kept, to now by default), in JSON, or in CSV with
// Accept: text/csv or format=csv.
func (s *Server) handleUsageRecords(w http.ResponseWriter, r *http.Request) {
	q, ok := s.query(w, r)
	if !ok {
		return
	}
	tenant := q.Get("tenant")
	if tenant == "" {
		e := admit.Errorf(admit.CodeInvalid, "tenant is required")
		e.Field = "tenant"
		s.writeError(w, r, e)
		return
	}
	if s.usage == nil {
		s.writeError(w, r, admit.Errorf(admit.CodeNotFound, "this server keeps no usage records"))
		return
	}
	from, to := time.Unix(0, 0), time.Now()
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"from", &from}, {"to", &to}} {
		v := q.Get(p.name)
		if v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			t, err = time.Parse(time.DateOnly, v)
		}
		if err != nil {
			e := admit.Errorf(admit.CodeInvalid, "%s %q: want a date (2026-11-01) or an RFC 3339 time", p.name, v)
			e.Field = p.name
			s.writeError(w, r, e)
			return
		}
		*p.dst = t
	}
	recs, err := s.usage.Usage(r.Context(), tenant, from, to)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if q.Get("format") == "csv" || strings.Contains(r.Header.Get("Accept"), "text/csv") {
		w.Header().Set("Content-Type", "text/csv; charset=utf-8")
		cw := csv.NewWriter(w)
		_ = cw.Write([]string{"tenant", "rule", "period_start", "period_end", "admitted", "refused", "cost", "failover", "failover_cost"})
		for _, x := range recs {
			_ = cw.Write([]string{x.Tenant, x.Rule, x.PeriodStart.UTC().Format(time.RFC3339), x.PeriodEnd.UTC().Format(time.RFC3339),
				strconv.FormatInt(x.Admitted, 10), strconv.FormatInt(x.Refused, 10), strconv.FormatInt(x.Cost, 10),
				strconv.FormatInt(x.Failover, 10), strconv.FormatInt(x.FailoverCost, 10)})
		}
		cw.Flush()
		return
	}
	for i := range recs {
		recs[i].PeriodStart, recs[i].PeriodEnd = recs[i].PeriodStart.UTC(), recs[i].PeriodEnd.UTC()
	}
	if recs == nil {
		recs = []usage.Record{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenant": tenant, "records": recs})
}
