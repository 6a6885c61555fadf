package server

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/top"
	"github.com/admitdev/admit/simulate"
)

// The dashboard at / reads GET /v1/admin/dashboard: what this server
// decided second by second over the last ten minutes, by endpoint and by
// rule, the tenants it refused most, its last refusals, and the health of
// its store, gateway and configuration.

// activityWindow is how many seconds of activity the dashboard keeps.
const activityWindow = 600

// Bounds on what the dashboard keeps, whatever the traffic.
const (
	maxTenantsPerSecond = 1000 // refused tenants counted per second; the rest go to "(others)"
	recentRefusals      = 200
)

type second struct {
	unix      int64
	endpoints [6][2]int64 // allowed, refused, by decisionEndpoints
	rules     map[string]*[2]int64
	tenants   map[string]int64 // refusals by tenant
}

type refusal struct {
	Time     time.Time `json:"time"`
	Endpoint string    `json:"endpoint"`
	Tenant   string    `json:"tenant,omitempty"`
	User     string    `json:"user,omitempty"`
	Action   string    `json:"action,omitempty"`
	Rule     string    `json:"rule"`
}

// activity is the dashboard's memory: a ring of seconds and a ring of
// refusals, both bounded.
type activity struct {
	mu       sync.Mutex
	seconds  [activityWindow]second
	refusals [recentRefusals]refusal
	next     int
	endpoint map[string]int
}

func newActivity() *activity {
	if len(decisionEndpoints) != len(second{}.endpoints) {
		panic("server: second.endpoints does not fit decisionEndpoints")
	}
	a := &activity{endpoint: map[string]int{}}
	for i, e := range decisionEndpoints {
		a.endpoint[e] = i
	}
	return a
}

// slot returns the second of unix, emptied if it held an older one.
func (a *activity) slot(unix int64) *second {
	s := &a.seconds[unix%activityWindow]
	if s.unix != unix {
		*s = second{unix: unix}
	}
	return s
}

// add records one decision of user's request for action (res and d may
// say nothing of rules: the gRPC service's).
func (a *activity) add(now time.Time, endpoint, user, action string, res *policy.Resolution, d *admit.Decision) {
	e, ok := a.endpoint[endpoint]
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.slot(now.Unix())
	k := 0
	if !d.Allowed {
		k = 1
	}
	s.endpoints[e][k]++
	for r, x := range policy.RuleResults(res.Rules, d.Results) {
		if s.rules == nil {
			s.rules = map[string]*[2]int64{}
		}
		c := s.rules[r.Name]
		if c == nil {
			c = new([2]int64)
			s.rules[r.Name] = c
		}
		if x.Allowed || x.Shadow {
			c[0]++
		} else {
			c[1]++
		}
	}
	if d.Allowed {
		return
	}
	tenant := ""
	if res.Tenant != nil {
		tenant = res.Tenant.ID
	}
	if tenant != "" {
		if s.tenants == nil {
			s.tenants = map[string]int64{}
		}
		if _, ok := s.tenants[tenant]; ok || len(s.tenants) < maxTenantsPerSecond {
			s.tenants[tenant]++
		} else {
			s.tenants["(others)"]++
		}
	}
	a.refusals[a.next%recentRefusals] = refusal{
		Time: now.UTC(), Endpoint: endpoint, Tenant: tenant, User: user, Action: action, Rule: d.DeniedBy,
	}
	a.next++
}

type series struct {
	Allowed []int64 `json:"allowed"`
	Refused []int64 `json:"refused"`
}

type tenantCount struct {
	Tenant  string `json:"tenant"`
	Refused int64  `json:"refused"`
}

type activityView struct {
	Now             time.Time         `json:"now"`
	Seconds         int               `json:"seconds"`
	Endpoints       map[string]series `json:"endpoints"`
	Rules           map[string]series `json:"rules"`
	TopRefused      []tenantCount     `json:"top_refused_tenants"`
	RecentRefusals  []refusal         `json:"recent_refusals"`
	TopRefusedSince time.Time         `json:"top_refused_since"`
}

// view is the last activityWindow seconds before now, oldest first, the
// ten tenants refused most in the last five minutes, and the last
// refusals, newest first (of tenant only, if not empty).
func (a *activity) view(now time.Time, tenant string) activityView {
	a.mu.Lock()
	defer a.mu.Unlock()
	end := now.Unix()
	v := activityView{Now: now.UTC(), Seconds: activityWindow, Endpoints: map[string]series{}, Rules: map[string]series{},
		TopRefusedSince: time.Unix(end-299, 0).UTC()}
	for _, e := range decisionEndpoints {
		v.Endpoints[e] = series{Allowed: make([]int64, activityWindow), Refused: make([]int64, activityWindow)}
	}
	tenants := map[string]int64{}
	for i := range activityWindow {
		unix := end - activityWindow + 1 + int64(i)
		s := &a.seconds[unix%activityWindow]
		if s.unix != unix {
			continue
		}
		for e, name := range decisionEndpoints {
			v.Endpoints[name].Allowed[i], v.Endpoints[name].Refused[i] = s.endpoints[e][0], s.endpoints[e][1]
		}
		for name, c := range s.rules {
			r, ok := v.Rules[name]
			if !ok {
				r = series{Allowed: make([]int64, activityWindow), Refused: make([]int64, activityWindow)}
				v.Rules[name] = r
			}
			r.Allowed[i], r.Refused[i] = c[0], c[1]
		}
		if unix > end-300 {
			for t, n := range s.tenants {
				tenants[t] += n
			}
		}
	}
	for t, n := range tenants {
		v.TopRefused = append(v.TopRefused, tenantCount{t, n})
	}
	slices.SortFunc(v.TopRefused, func(x, y tenantCount) int {
		if x.Refused != y.Refused {
			return int(y.Refused - x.Refused)
		}
		return bytes.Compare([]byte(x.Tenant), []byte(y.Tenant))
	})
	v.TopRefused = v.TopRefused[:min(len(v.TopRefused), 10)]
	v.RecentRefusals = []refusal{}
	for i := 1; i <= min(a.next, recentRefusals); i++ {
		r := a.refusals[(a.next-i)%recentRefusals]
		if tenant == "" || r.Tenant == tenant {
			v.RecentRefusals = append(v.RecentRefusals, r)
		}
		if len(v.RecentRefusals) == 50 {
			break
		}
	}
	return v
}

// handleDashboard serves GET /v1/admin/dashboard?tenant=: the activity
// and the state of the server.
func (s *Server) handleDashboard(w http.ResponseWriter, r *http.Request) {
	ans := struct {
		activityView
		Store   readyAnswer    `json:"store"`
		Region  *RegionHealth  `json:"region,omitempty"`
		Gateway map[string]any `json:"gateway,omitempty"`
		Config  map[string]any `json:"config"`
		// Quota is the Envoy quota service's shares of the limits this
		// server's Envoys hold.
		Quota []envoyrls.QuotaShares `json:"quota_shares,omitempty"`
		// TopCallers are each rule's heaviest refused callers over the
		// last 5 minutes, every server's; Bans the bans in force.
		TopCallers []top.Top `json:"top_callers"`
		Bans       []banView `json:"bans"`
	}{activityView: s.activity.view(time.Now(), r.URL.Query().Get("tenant")), TopCallers: []top.Top{}, Bans: []banView{}}
	if s.callers != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		ans.TopCallers = s.topCallers(ctx)
		cancel()
	}
	if b := s.decider.Bans(); b != nil {
		now := time.Now()
		for _, x := range b.List() {
			ans.Bans = append(ans.Bans, viewBan(x, now))
		}
	}
	if f := s.quotaShares.Load(); f != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		ans.Quota = (*f)(ctx)
		cancel()
	}
	ans.Store, _ = s.readiness(r)
	if s.health != nil {
		ans.Region = s.health().Region
	}
	if s.gateway != nil {
		st := s.gateway.Stats()
		var refused int64
		for _, n := range st.Refused {
			refused += n
		}
		ans.Gateway = map[string]any{"connections": st.Connections, "admitted": st.Admitted, "refused": refused,
			"rejected": st.Rejected, "messages": st.Messages, "throttled": st.Throttled}
	}
	p := s.catalog.Policy()
	ans.Config = map[string]any{"tenants": len(p.Tenants()), "tiers": len(p.Tiers()), "global_rules": len(p.Global())}
	if v := s.configVersion.Load(); v != nil {
		ans.Config["version"], ans.Config["loaded_at"] = v.Version, v.LoadedAt
	}
	if e := s.configErr.Load(); e != nil {
		ans.Config["reload_error"] = *e
	}
	if e := s.envoyErr.Load(); e != nil {
		ans.Config["envoy_reload_error"] = *e
	}
	writeJSON(w, http.StatusOK, ans)
}

// simulateRequest is the body of POST /v1/admin/simulate.
type simulateRequest struct {
	Rules       []string `json:"rules"`  // rule specs, as admit simulate --rule
	Tenant      string   `json:"tenant"` // or the rules of this tenant (for action)
	Action      string   `json:"action"`
	Pattern     string   `json:"pattern"` // default seed004
	Independent bool     `json:"independent"`
	Format      string   `json:"format"` // svg (default), png or json
}

// Bounds on what one simulation may cost the server: requests run, lanes
// drawn (each a picture of its own, about 1 MB before encoding), and
// simulations at once.
const (
	maxSimulated      = 200_000
	maxSimulatedRules = 8
	maxSimulations    = 2
)

// simulating holds a place for each simulation running.
var simulating = make(chan struct{}, maxSimulations)

// handleSimulate serves POST /v1/admin/simulate: admit simulate's picture
// (or summary) of rules, or of a tenant's rules in the running catalog.
func (s *Server) handleSimulate(w http.ResponseWriter, r *http.Request) {
	var b simulateRequest
	if err := decodeJSON(w, r, &b); err != nil {
		s.writeError(w, r, err)
		return
	}
	invalid := func(field, format string, args ...any) {
		e := admit.Errorf(admit.CodeInvalid, format, args...)
		e.Field = field
		s.writeError(w, r, e)
	}
	if len(b.Rules) > maxSimulatedRules {
		invalid("rules", "%d rules; the server draws at most %d (admit simulate draws more)", len(b.Rules), maxSimulatedRules)
		return
	}
	var specs []policy.RuleSpec
	for _, spec := range b.Rules {
		rs, err := simulate.ParseRule(spec)
		if err != nil {
			invalid("rules", "%v", err)
			return
		}
		specs = append(specs, rs)
	}
	var rules []*policy.Rule
	if len(specs) > 0 {
		var err error
		if rules, err = simulate.Compile(specs); err != nil {
			invalid("rules", "%v", err)
			return
		}
	}
	if b.Tenant != "" {
		rs, err := simulate.TenantRules(s.catalog.Policy(), b.Tenant, b.Action)
		if err != nil {
			invalid("tenant", "%v", err)
			return
		}
		rules = append(rules, rs...)
	}
	if len(rules) == 0 {
		invalid("rules", "no rules: give rules or a tenant")
		return
	}
	if len(rules) > maxSimulatedRules {
		invalid("rules", "%d rules with the tenant's; the server draws at most %d (admit simulate draws more)", len(rules), maxSimulatedRules)
		return
	}
	if b.Pattern == "" {
		b.Pattern = "seed004"
	}
	p, err := simulate.ParsePattern(b.Pattern)
	if err != nil && !errors.Is(err, simulate.ErrTooManyEvents) {
		invalid("pattern", "%v", err)
		return
	}
	if n := p.Expected(); n > maxSimulated {
		invalid("pattern", "about %.0f requests; the server simulates at most %d (admit simulate runs more)", n, maxSimulated)
		return
	}
	select {
	case simulating <- struct{}{}:
		defer func() { <-simulating }()
	default:
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, "the server is already running its most simulations at once; try again")
		return
	}
	// Bounded as it is generated: the estimate above is exact for most
	// patterns, not for a poisson one.
	ev, err := p.Events(simulate.Identity{Tenant: b.Tenant, User: "user", Action: b.Action}, maxSimulated)
	if err != nil {
		invalid("pattern", "more than %d requests; the server simulates at most %d (admit simulate runs more)", maxSimulated, maxSimulated)
		return
	}
	res, err := simulate.Run(rules, ev, simulate.Options{Independent: b.Independent, Duration: p.Duration})
	if err != nil {
		invalid("pattern", "%v", err)
		return
	}
	var out bytes.Buffer
	size := simulate.DefaultSize(len(res.Lanes))
	switch b.Format {
	case "", "svg":
		err = simulate.SVG(&out, res, size)
		w.Header().Set("Content-Type", "image/svg+xml")
	case "png":
		err = simulate.PNG(&out, res, size)
		w.Header().Set("Content-Type", "image/png")
	case "json":
		err = simulate.WriteSummary(&out, res, simulate.FormatJSON)
		w.Header().Set("Content-Type", "application/json")
	default:
		invalid("format", "format %q: want svg, png or json", b.Format)
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	_, _ = w.Write(out.Bytes())
}

//go:embed dashboard
var dashboardFiles embed.FS

// handleDashboardPage serves the dashboard's page: one file, its script
// and styles inline, nothing from elsewhere.
func handleDashboardPage(w http.ResponseWriter, r *http.Request) {
	page, _ := dashboardFiles.ReadFile("dashboard/index.html")
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data: blob:")
	_, _ = w.Write(page)
}
