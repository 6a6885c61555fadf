package server

import (
	"embed"
	"errors"
	"io/fs"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/problem"
	"github.com/admitdev/admit/wsgateway"
)

type sessionRequest struct {
	Tenant string `json:"tenant"`
}

// handleSessionCreate serves PUT /v1/sessions: 201 with the new session.
func (s *Server) handleSessionCreate(w http.ResponseWriter, r *http.Request) {
	var body sessionRequest
	if err := decodeJSON(w, r, &body); err != nil {
		s.fail(w, r, "session", err)
		return
	}
	if body.Tenant == "" {
		s.fail(w, r, "session", admit.Errorf(admit.CodeInvalid, "tenant is required"))
		return
	}
	if err := s.mayActFor(r, body.Tenant); err != nil {
		s.fail(w, r, "session", err)
		return
	}
	if s.refuseBanned(w, r, body.Tenant, "", s.presentedKey(r, s.callerOf(r).trusted())) {
		return
	}
	holder := body.Tenant
	if s.catalog.Policy().Tenant(body.Tenant) == nil && !s.callerOf(r).trusted() {
		// A tenant only the default tier knows, named by a caller no
		// token vouches for: its sessions count for the client's address,
		// whatever tenants it invents.
		holder = "anonymous " // no tenant name holds a space
		if a := httplimit.ClientIP(r, s.trustedProxies, s.forwarded); a.IsValid() {
			holder += policy.ClientPrefix(a.String())
		}
	}
	sess, err := s.gateway.CreateSessionFor(r.Context(), body.Tenant, holder)
	var limit *wsgateway.LimitError
	if errors.As(err, &limit) {
		w.Header().Set("Retry-After", strconv.FormatInt(httpx.RetrySeconds(limit.RetryAfter), 10))
		problem.WriteDetails(w, problem.RefusalBy(limit.Limit, nil, limit.RetryAfter, err.Error()))
		return
	}
	if err != nil {
		s.fail(w, r, "session", err)
		return
	}
	w.Header().Set("Location", "/v1/sessions/"+sess.Tenant+"/"+sess.ID)
	writeJSON(w, http.StatusCreated, sess)
}

// handleSessionDelete serves DELETE /v1/sessions/{tenant}/{session}: 204,
// and the session's connections close on every server.
func (s *Server) handleSessionDelete(w http.ResponseWriter, r *http.Request) {
	tenant := r.PathValue("tenant")
	if err := s.mayActFor(r, tenant); err != nil {
		s.fail(w, r, "session", err)
		return
	}
	if err := s.gateway.DeleteSession(r.Context(), tenant, r.PathValue("session")); err != nil {
		s.fail(w, r, "session", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// mayActFor checks that the caller may manage tenant's sessions, by the
// one authentication rule (policy.Authenticate): a key that is present must
// be one of tenant's; a tenant with API keys needs one, or a service or the
// admin token.
func (s *Server) mayActFor(r *http.Request, tenant string) error {
	trusted := s.callerOf(r).trusted()
	_, err := s.catalog.Policy().Authenticate(policy.Credentials{Tenant: tenant, APIKey: s.presentedKey(r, trusted), Trusted: trusted})
	return err
}

//go:embed demo
var demoFiles embed.FS

// demoTenant is what the demo page lists of a tenant.
type demoTenant struct {
	ID      string         `json:"id"`
	Tier    string         `json:"tier"`
	Gateway policy.Gateway `json:"gateway"`
}

// handleDemoTenants serves GET /demo/tenants: the tenants the demo page may
// use, those without API keys, as the seed's tenant URL lists them.
func (s *Server) handleDemoTenants(w http.ResponseWriter, r *http.Request) {
	out := []demoTenant{}
	for _, t := range s.catalog.Policy().Tenants() {
		if !t.HasAPIKeys() {
			out = append(out, demoTenant{ID: t.ID, Tier: t.Tier.Name, Gateway: t.Tier.Gateway})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// demoHandler serves the demo page's files under /demo/, and the tenants
// it lists at /demo/tenants.
func (s *Server) demoHandler() http.Handler {
	sub, _ := fs.Sub(demoFiles, "demo")
	files := http.StripPrefix("/demo/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/demo/tenants" {
			s.handleDemoTenants(w, r)
			return
		}
		files.ServeHTTP(w, r)
	})
}

// gatewayCollector exports the gateway's counters as metrics.
type gatewayCollector struct {
	g                                          *wsgateway.Gateway
	conns, connects, refused, messages, closed *prometheus.Desc
	local, control                             *prometheus.Desc
}

func newGatewayCollector(g *wsgateway.Gateway) *gatewayCollector {
	return &gatewayCollector{
		g:        g,
		conns:    prometheus.NewDesc("admit_gateway_connections", "WebSocket connections open on this server.", nil, nil),
		connects: prometheus.NewDesc("admit_gateway_connects_total", "WebSocket connection attempts, by result: admitted, refused (over a limit, 429) or rejected (authorizer, origin, bad request).", []string{"result"}, nil),
		refused:  prometheus.NewDesc("admit_gateway_refused_total", "WebSocket connections refused, by the limit that refused them: a tier's connection limit, or global (a global rule naming ws:connect).", []string{"limit"}, nil),
		messages: prometheus.NewDesc("admit_gateway_messages_total", "WebSocket client frames, by result: processed, throttled (messages_per_minute or a global rule naming ws:message) or malformed.", []string{"result"}, nil),
		closed:   prometheus.NewDesc("admit_gateway_closed_total", "WebSocket connections the gateway closed, by reason: slow_consumer (1008), frame_budget (1008), message_bounds (1008: a message of too many frames, or too slow) or session_expired.", []string{"reason"}, nil),
		local:    prometheus.NewDesc("admit_gateway_throttled_locally_total", "Throttled WebSocket messages refused without asking the store: the tenant's refusal was known on this server.", nil, nil),
		control:  prometheus.NewDesc("admit_gateway_control_frames_total", "Pings and pongs received from WebSocket clients.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *gatewayCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.conns, c.connects, c.refused, c.messages, c.closed, c.local, c.control} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *gatewayCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.g.Stats()
	counter := func(d *prometheus.Desc, v int64, label string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), label)
	}
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(st.Connections))
	var refused int64
	for i, name := range []string{wsgateway.LimitTenantConnections, wsgateway.LimitConnectionsPerSession, wsgateway.LimitTenantPerMinute, wsgateway.LimitSessionPerMinute} {
		counter(c.refused, st.Refused[i], name)
		refused += st.Refused[i]
	}
	counter(c.refused, st.RefusedGlobal, "global")
	refused += st.RefusedGlobal
	counter(c.connects, st.Admitted, "admitted")
	counter(c.connects, refused, "refused")
	counter(c.connects, st.Rejected, "rejected")
	counter(c.messages, st.Messages, "processed")
	counter(c.messages, st.Throttled, "throttled")
	counter(c.messages, st.Malformed, "malformed")
	counter(c.closed, st.SlowClosed, "slow_consumer")
	counter(c.closed, st.BudgetClosed, "frame_budget")
	counter(c.closed, st.MessageClosed, "message_bounds")
	counter(c.closed, st.ExpiredClose, "session_expired")
	ch <- prometheus.MustNewConstMetric(c.local, prometheus.CounterValue, float64(st.ThrottledLocally))
	ch <- prometheus.MustNewConstMetric(c.control, prometheus.CounterValue, float64(st.Control))
}
