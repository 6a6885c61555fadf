// Package wsgateway is Admit's WebSocket gateway: sessions,
// connections admitted against per-tenant and per-session limits,
// per-tenant message limits, and messages processed in order through a
// silo route (one queue and worker per tenant) or a pool route (one shared
// queue and worker pool, ordered per tenant and session), with every reply
// delivered to all the connections of the sender's session.
//
// A Gateway admits a connection with one atomic decision over four limits
// of the tenant's tier (policy.Gateway): the tenant's and the session's
// live connections (concurrency leases, held for the connection's life,
// renewed by a heartbeat and reclaimed by the store after the lease TTL if
// the gateway dies) and the tenant's and the session's new connections per
// minute (sliding window counters), together with the global rules of the
// policy that name ws:connect; a message is decided against the tenant's
// messages_per_minute and the global rules that name ws:message, each
// tenant taking its fair share of those the tenants share. A
// refused connection charges nothing.
//
// Only what is admitted costs the store: a malformed frame and a ping cost
// it nothing, nor do a message over messages_per_minute and a connection
// refused again once the refusal is known (each server remembers the
// refusals the store gave until they could end). Frames that carry no
// admitted message draw on a per-connection frame budget instead, past
// which the connection is closed.
//
// Sessions and their frames live in a Sessions implementation: in memory
// for one server, or in Redis (redisstore.Sessions) for several gateway
// servers that share sessions, limits and replies.
package wsgateway

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/internal/tracing"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/problem"
)

// Close codes the gateway ends connections with, besides the standard
// 1001 (server shutting down), 1008 (slow consumer: the send buffer
// overflowed) and 1009 (a frame over the size limit).
const (
	// CloseSessionDeleted: the session was deleted (DELETE /v1/sessions/…).
	CloseSessionDeleted websocket.StatusCode = 4000
	// CloseSessionExpired: the session saw no activity for its TTL.
	CloseSessionExpired websocket.StatusCode = 4001
	// CloseSlotLost: the store no longer holds the connection's slot (its
	// lease expired, say after the store was unreachable for longer than
	// the lease TTL); the client may connect again.
	CloseSlotLost websocket.StatusCode = 4002
	// CloseBanned: a ban of the connection's tenant, client address or
	// API key came in force (POST /v1/admin/bans, or an escalation rule).
	CloseBanned websocket.StatusCode = 4003
)

// The limit names a refusal reports (problem+json denied_by, metrics).
const (
	LimitTenantConnections     = "tenant_connections"
	LimitConnectionsPerSession = "connections_per_session"
	LimitTenantPerMinute       = "tenant_per_minute"
	LimitSessionPerMinute      = "session_per_minute"
	LimitMessagesPerMinute     = "messages_per_minute"
	LimitTenantSessions        = "tenant_sessions"
)

// A LimitError is a session refused by its tenant's tenant_sessions: the
// tenant holds as many live sessions as its tier allows. It is a refusal,
// answered 429 with Retry-After, not a failure.
type LimitError struct {
	Limit string // LimitTenantSessions
	Max   int64
	// RetryAfter is when a session would expire if none were used again.
	RetryAfter time.Duration
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("session refused by %s: the tenant has %d live sessions, its limit; delete one or let one expire", e.Limit, e.Max)
}

// Options configure a Gateway. Store and Policy are required; the zero
// value of every other field is a documented default.
type Options struct {
	// Store decides the gateway's limits and holds connection leases.
	Store admit.Store
	// Policy returns the current policy: tenants and their tiers' gateway
	// settings, read on every connection and message, so tier changes
	// apply at once.
	Policy func() *policy.Policy
	// Decider decides, applying the deployment's failure mode; default a
	// new one over Store.
	Decider *policy.Decider
	// Sessions keeps sessions; default NewMemorySessions(nil).
	Sessions Sessions
	// Handler processes messages; default Echo.
	Handler Handler
	// OriginPatterns are the origins allowed besides the request's own
	// host, as path.Match patterns of the origin's host (or of
	// scheme://host when a pattern contains "://"). Requests from other
	// origins are refused with 403 before anything is charged.
	OriginPatterns []string
	// LeaseTTL is how long the store keeps a connection's slot without a
	// heartbeat; the gateway renews it every LeaseTTL/3. Default 30s.
	LeaseTTL time.Duration
	// SendFrames and SendBytes bound what may wait to be written to one
	// connection; past either, the connection is closed with 1008.
	// Defaults 4096 frames and 1 MiB.
	SendFrames int
	SendBytes  int
	// QueueSize bounds each route queue; a full queue stops reading from
	// the senders until it drains. Default 1024.
	QueueSize int
	// PoolWorkers is the size of the pool route's worker pool; default
	// 4 × GOMAXPROCS.
	PoolWorkers int
	// MaxMessageBytes bounds a client frame; a larger one closes the
	// connection with 1009. Default 32 KiB.
	MaxMessageBytes int64
	// WriteTimeout bounds writing one frame; default 10s.
	WriteTimeout time.Duration
	// PingInterval is how often a connection silent for that long is
	// pinged; no pong within the interval closes it. Default 30s.
	PingInterval time.Duration
	// FrameBudget and FrameBudgetPerSecond bound the frames a connection
	// sends that carry no admitted message: one refused by
	// messages_per_minute, a malformed one, a ping or a pong. Each draws on
	// the connection's budget of FrameBudget frames, refilled at
	// FrameBudgetPerSecond; the frame that finds it empty closes the
	// connection with 1008 (policy violation). None of them costs the store
	// anything, but each costs this server a read, a decode and an answer:
	// the budget keeps that within what an honest client needs (a ping
	// every few seconds, a burst of sends past its limit). Defaults 100
	// and 10.
	FrameBudget          int
	FrameBudgetPerSecond int
	// MaxMessageFrames and MessageTimeout bound one client message: at
	// most MaxMessageFrames frames (its first and its continuations), and
	// whole within MessageTimeout of the time the gateway spends waiting
	// for it from its first byte (a message's decision, or a full route
	// queue, does not count). Past either the connection is closed with
	// 1008. MaxMessageBytes bounds its payload, but not its frames: empty
	// continuation frames, sent for ever, once kept a connection open and
	// a core busy. Defaults 128 frames and 10s.
	MaxMessageFrames int
	MessageTimeout   time.Duration
	// Clock returns the current time of the frame budgets and of the
	// refusals the gateway remembers (of messages and of connections);
	// default time.Now. Give it the store's clock when the store has one
	// of its own.
	Clock func() time.Time
	// ClientAddr returns the address of the client an upgrade request
	// comes from, "" if unknown: the anonymous callers (tenants only the
	// default tier knows) share their part of the global rules that
	// WebSocket traffic is charged to by it. Default the request's peer
	// address; behind a proxy, give the address the proxy vouches for.
	ClientAddr func(*http.Request) string
	// Logger receives the gateway's logs; default slog.Default().
	Logger *slog.Logger
	// TracerProvider, if set, traces the admission of every connection
	// (an upgrade or a preflight) in an OpenTelemetry span
	// (docs/traces.md): a child of the trace the request's traceparent
	// header continues. The store calls are the Decider's spans
	// (policy.Decider.Trace): New traces a Decider of its own with tp.
	// Nil traces nothing, at no cost.
	TracerProvider trace.TracerProvider
}

// Stats counts what a Gateway did. Counters only grow, but Connections.
type Stats struct {
	Connections int64 // open now
	Admitted    int64 // connections admitted
	// Refused counts connections refused by each limit, in the order
	// LimitTenantConnections, LimitConnectionsPerSession,
	// LimitTenantPerMinute, LimitSessionPerMinute.
	Refused [4]int64
	// RefusedGlobal counts connections refused by global rules naming
	// ws:connect.
	RefusedGlobal int64
	Rejected      int64 // refused before the limits: authorizer, origin, bad request
	Messages      int64 // messages processed
	// Throttled counts messages refused by messages_per_minute or by a
	// global rule naming ws:message.
	Throttled int64
	// ThrottledLocally counts the Throttled messages refused without
	// asking the store: the tenant's refusal was known.
	ThrottledLocally int64
	Malformed        int64 // frames that are not a message to decide
	Control          int64 // pings and pongs received from clients
	SlowClosed       int64 // connections closed as slow consumers
	ExpiredClose     int64 // connections closed because their session expired
	// BudgetClosed counts connections closed with 1008 for frames past
	// their frame budget (Options.FrameBudget).
	BudgetClosed int64
	// MessageClosed counts connections closed with 1008 for a message
	// past its bounds (Options.MaxMessageFrames, Options.MessageTimeout).
	MessageClosed int64
}

// Gateway is the WebSocket gateway. It serves GET /v1/ws as an
// http.Handler; CreateSession and DeleteSession back the session API.
// Create it with New; it is safe for concurrent use.
type Gateway struct {
	store    admit.Store
	policy   func() *policy.Policy
	decider  *policy.Decider
	tracer   *tracing.Tracer // nil: traces are off
	sessions Sessions
	handler  Handler
	origins  []string
	log      *slog.Logger

	leaseTTL     time.Duration
	sendFrames   int
	sendBytes    int
	maxMessage   int64
	writeTimeout time.Duration
	pingInterval time.Duration
	frameBudget  float64 // frames
	frameRefill  float64 // frames per second
	msgFrames    int
	msgTimeout   time.Duration
	now          func() time.Time
	clientAddr   func(*http.Request) string

	limits sync.Map // policy.Gateway → *limits
	// shared are the global rules WebSocket traffic is charged to, of the
	// policy last asked about.
	shared atomic.Pointer[sharedRules]

	// The refusals the store gave, until they end (refusals.go): of
	// messages by message key, of connections by tenant and session.
	refusalsMu sync.Mutex
	throttled  map[string]throttle
	connects   map[string]map[string]connectRefusal
	slotsFreed uint64 // connections whose slots were freed here

	mu      sync.Mutex
	conns   map[*conn]struct{}
	closing bool
	wg      sync.WaitGroup // connections

	routes *routes
	ctx    context.Context // ends at Close: the maintenance loop and the workers
	cancel context.CancelFunc
	done   chan struct{}

	stats struct {
		connections, admitted, rejected, messages, throttled, slow, expired, banned atomic.Int64
		throttledLocally, malformed, control, overBudget, refusedGlobal             atomic.Int64
		messageClosed                                                               atomic.Int64
		refused                                                                     [4]atomic.Int64
	}
}

// New returns a Gateway with the given options, running its maintenance
// (heartbeats, session expiry, pings) until Close.
func New(opts Options) (*Gateway, error) {
	if opts.Store == nil || opts.Policy == nil {
		return nil, errors.New("wsgateway: Options.Store and Options.Policy are required")
	}
	for _, p := range opts.OriginPatterns {
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("wsgateway: origin pattern %q: %w", p, err)
		}
	}
	g := &Gateway{
		tracer: tracing.New(opts.TracerProvider, "gateway"),
		store:  opts.Store, policy: opts.Policy, decider: opts.Decider, sessions: opts.Sessions,
		handler: opts.Handler, origins: opts.OriginPatterns, log: opts.Logger,
		leaseTTL: opts.LeaseTTL, sendFrames: opts.SendFrames, sendBytes: opts.SendBytes,
		maxMessage: opts.MaxMessageBytes, writeTimeout: opts.WriteTimeout, pingInterval: opts.PingInterval,
		msgFrames: opts.MaxMessageFrames, msgTimeout: opts.MessageTimeout,
		now: opts.Clock, clientAddr: opts.ClientAddr, conns: map[*conn]struct{}{}, throttled: map[string]throttle{},
		connects: map[string]map[string]connectRefusal{}, done: make(chan struct{}),
	}
	if g.decider == nil {
		g.decider = policy.NewDecider(g.store, 1)
		g.decider.Trace(opts.TracerProvider, "")
	}
	if bans := g.decider.Bans(); bans != nil {
		bans.OnChange(g.closeBanned)
	}
	if g.sessions == nil {
		g.sessions = NewMemorySessions(nil)
	}
	if g.handler == nil {
		g.handler = Echo
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	if g.now == nil {
		g.now = time.Now
	}
	if g.clientAddr == nil {
		g.clientAddr = peerAddr
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defDur(&g.leaseTTL, 30*time.Second)
	defDur(&g.writeTimeout, 10*time.Second)
	defDur(&g.pingInterval, 30*time.Second)
	defDur(&g.msgTimeout, 10*time.Second)
	def(&g.msgFrames, 128)
	def(&g.sendFrames, 4096)
	def(&g.sendBytes, 1<<20)
	if g.maxMessage <= 0 {
		g.maxMessage = 32 << 10
	}
	def(&opts.FrameBudget, 100)
	def(&opts.FrameBudgetPerSecond, 10)
	g.frameBudget, g.frameRefill = float64(opts.FrameBudget), float64(opts.FrameBudgetPerSecond)
	def(&opts.QueueSize, 1024)
	def(&opts.PoolWorkers, 4*runtime.GOMAXPROCS(0))
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.routes = newRoutes(g, opts.QueueSize, opts.PoolWorkers)
	go g.maintain()
	return g, nil
}

// Stats returns the gateway's counters.
func (g *Gateway) Stats() Stats {
	s := Stats{
		Connections: g.stats.connections.Load(), Admitted: g.stats.admitted.Load(),
		Rejected: g.stats.rejected.Load(), Messages: g.stats.messages.Load(),
		Throttled: g.stats.throttled.Load(), SlowClosed: g.stats.slow.Load(),
		ExpiredClose: g.stats.expired.Load(), ThrottledLocally: g.stats.throttledLocally.Load(),
		Malformed: g.stats.malformed.Load(), Control: g.stats.control.Load(), BudgetClosed: g.stats.overBudget.Load(),
		RefusedGlobal: g.stats.refusedGlobal.Load(), MessageClosed: g.stats.messageClosed.Load(),
	}
	for i := range s.Refused {
		s.Refused[i] = g.stats.refused[i].Load()
	}
	return s
}

// Close closes every connection with 1001 (going away), releasing their
// slots, waits for them until ctx ends, and stops the workers. Later
// upgrades are refused with 503.
func (g *Gateway) Close(ctx context.Context) error {
	g.mu.Lock()
	already := g.closing
	g.closing = true
	conns := make([]*conn, 0, len(g.conns))
	for c := range g.conns {
		conns = append(conns, c)
	}
	g.mu.Unlock()
	if already {
		<-g.done
		return nil
	}
	for _, c := range conns {
		c.close(websocket.StatusGoingAway, "the server is shutting down")
	}
	waited := make(chan struct{})
	go func() { g.wg.Wait(); close(waited) }()
	var err error
	select {
	case <-waited:
	case <-ctx.Done():
		err = fmt.Errorf("wsgateway: closing: %w", ctx.Err())
	}
	g.cancel()
	g.routes.wait()
	close(g.done)
	return err
}

// limits are the rules of one tier's gateway settings.
type limits struct {
	gw       policy.Gateway
	connect  [4]*policy.Rule // in the order of Stats.Refused
	messages [1]*policy.Rule // a slice's backing array, for Resolution.Rules
	sessions [1]*policy.Rule // tenant_sessions: a lease per live session
}

func (g *Gateway) limitsOf(gw policy.Gateway) *limits {
	if l, ok := g.limits.Load(gw); ok {
		return l.(*limits)
	}
	rule := func(name string, r admit.Rule) *policy.Rule {
		r.Name = name
		return &policy.Rule{Rule: r, Scope: "tenant"}
	}
	conc := func(name string, max int64) *policy.Rule {
		return rule(name, admit.Rule{Algorithm: admit.Concurrency, Max: max, LeaseTTL: g.leaseTTL})
	}
	perMinute := func(name string, limit int64) *policy.Rule {
		return rule(name, admit.Rule{Algorithm: admit.SlidingWindow, Limit: limit, Window: time.Minute})
	}
	l := &limits{gw: gw, connect: [4]*policy.Rule{
		conc(LimitTenantConnections, gw.TenantConnections),
		conc(LimitConnectionsPerSession, gw.ConnectionsPerSession),
		perMinute(LimitTenantPerMinute, gw.TenantPerMinute),
		perMinute(LimitSessionPerMinute, gw.SessionPerMinute),
	}, messages: [1]*policy.Rule{perMinute(LimitMessagesPerMinute, gw.MessagesPerMinute)},
		// A session's slot lives as long as the session would without
		// activity; the gateway renews it while the session is in use.
		sessions: [1]*policy.Rule{rule(LimitTenantSessions, admit.Rule{Algorithm: admit.Concurrency, Max: max(1, gw.TenantSessions), LeaseTTL: gw.SessionTTL})},
	}
	l.connect[1].Scope, l.connect[3].Scope = "session", "session"
	v, _ := g.limits.LoadOrStore(gw, l)
	return v.(*limits)
}

// actionSession keys the buckets of tenant_sessions.
const actionSession = "ws:session"

// key returns the bucket key of a gateway rule. The action keeps the
// gateway's buckets apart from any rule of the catalog.
func key(r *policy.Rule, tenant, session, action string) string {
	k := admit.Key{Scope: r.Scope, Tenant: tenant, Action: action, Rule: r.Name}
	if r.Scope == "session" {
		k.Subject = session
	}
	return k.String()
}

// tenantOf returns the tenant and its gateway limits.
func (g *Gateway) tenantOf(id string) (*policy.Policy, *policy.Tenant, *limits, error) {
	if id == "" || len(id) > bounds.MaxValueLen {
		return nil, nil, nil, admit.Errorf(admit.CodeInvalid, "tenant must be 1 to %d bytes", bounds.MaxValueLen)
	}
	p := g.policy()
	t, err := p.TenantOrDefault(id)
	if err != nil {
		return nil, nil, nil, err
	}
	return p, t, g.limitsOf(t.Tier.Gateway), nil
}

// CreateSession creates a session of tenant with a new unguessable id (192
// random bits) that expires after the tier's session_ttl without activity.
// The session holds a slot of its tenant's tenant_sessions limit until it
// is deleted or expires; a tenant at its limit is refused with a
// *LimitError. An unknown tenant is admit.CodePermission (unless the policy
// has a default tier). Whether the caller may act for the tenant (API
// keys) is the caller's to check.
func (g *Gateway) CreateSession(ctx context.Context, tenant string) (Session, error) {
	return g.CreateSessionFor(ctx, tenant, tenant)
}

// CreateSessionFor is CreateSession with the tenant_sessions slot counted
// for holder rather than the tenant: for a tenant only a default tier
// knows, named without a credential, the caller's client address, so that
// inventing tenants does not multiply the sessions one client may hold.
func (g *Gateway) CreateSessionFor(ctx context.Context, tenant, holder string) (Session, error) {
	p, t, l, err := g.tenantOf(tenant)
	if err != nil {
		return Session{}, err
	}
	charge := [1]admit.Charge{{Key: key(l.sessions[0], holder, "", actionSession), Rule: &l.sessions[0].Rule, Cost: 1}}
	res := policy.Resolution{Policy: p, Tenant: t, Charges: charge[:], Rules: l.sessions[:]}
	var dec admit.Decision
	if _, err := g.decider.Decide(ctx, &res, &dec); err != nil {
		return Session{}, err
	}
	if !dec.Allowed {
		return Session{}, &LimitError{Limit: LimitTenantSessions, Max: l.sessions[0].Max, RetryAfter: dec.RetryAfter}
	}
	var b [24]byte
	_, _ = rand.Read(b[:])
	s, err := g.sessions.Create(ctx, Session{Tenant: tenant, ID: base64.RawURLEncoding.EncodeToString(b[:]), Lease: dec.Lease.ID}, l.gw.SessionTTL)
	if err != nil {
		g.releaseSlot(dec.Lease.ID, tenant)
	}
	return s, err
}

// DeleteSession deletes a session of tenant, closes its connections
// (CloseSessionDeleted) on every server sharing the Sessions and frees its
// tenant_sessions slot. A session that does not exist is
// admit.CodeNotFound; one of another tenant is admit.CodePermission.
func (g *Gateway) DeleteSession(ctx context.Context, tenant, id string) error {
	s, err := g.session(ctx, tenant, id)
	if err != nil {
		return err
	}
	if err := g.sessions.Delete(ctx, s.ID); err != nil {
		return err
	}
	g.releaseSlot(s.Lease, tenant)
	return nil
}

// releaseSlot frees a lease the gateway held; one the store no longer has
// is gone already.
func (g *Gateway) releaseSlot(lease, tenant string) {
	if lease == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := g.decider.ReleaseLease(ctx, lease)
	cancel()
	if err != nil && admit.ErrorCode(err) != admit.CodeNotFound {
		// The store reclaims the slot after the lease TTL.
		g.log.Warn("gateway: releasing a slot", "tenant", tenant, "err", err)
	}
}

// renewSlot keeps a session's tenant_sessions slot for another session
// TTL, from a connection's activity.
func (g *Gateway) renewSlot(ctx context.Context, lease, tenant string) {
	if lease == "" {
		return
	}
	if _, err := g.decider.RenewLease(ctx, lease); err != nil && admit.ErrorCode(err) != admit.CodeNotFound {
		g.log.Warn("gateway: renewing a session's slot", "tenant", tenant, "err", err)
	}
}

// session returns the session id if it belongs to tenant.
func (g *Gateway) session(ctx context.Context, tenant, id string) (Session, error) {
	if id == "" || len(id) > bounds.MaxValueLen {
		return Session{}, admit.Errorf(admit.CodeNotFound, "session %.64q does not exist", id)
	}
	s, err := g.sessions.Get(ctx, id)
	if err != nil {
		return Session{}, err
	}
	if s.Tenant != tenant {
		return Session{}, admit.Errorf(admit.CodePermission, "session %q is not a session of tenant %q", id, tenant)
	}
	return s, nil
}

// ServeHTTP serves GET /v1/ws?tenant=&session=: the authorizer (401 without
// tenant or session, 403 for an unknown tenant, a foreign session or a
// refused origin, 404 for a session that does not exist), then one atomic
// decision over the connection limits (429 with Retry-After and the
// refusing limit), then the upgrade.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !isUpgrade(r) {
		w.Header().Set("Upgrade", "websocket")
		g.reject(w, http.StatusUpgradeRequired, "GET /v1/ws is a WebSocket endpoint: send an upgrade request (GET /v1/ws/preflight asks whether one would be admitted)")
		return
	}
	a, ok := g.admitTraced(w, r, false)
	if !ok {
		return
	}
	g.serve(w, r, a)
}

// Preflight serves GET /v1/ws/preflight?tenant=&session=: what an upgrade
// would be answered now, deciding the limits as a dry run that charges
// nothing: 200 {"allowed":true}, or the upgrade's 4xx problem. A browser,
// which sees only that a WebSocket failed to open, learns why from it.
func (g *Gateway) Preflight(w http.ResponseWriter, r *http.Request) {
	if _, ok := g.admitTraced(w, r, true); ok {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte("{\"allowed\":true}\n"))
	}
}

// admission is an admitted connection attempt.
type admission struct {
	tenant, session string
	limits          *limits
	lease           string
	client          client
	keyHash         string // of the API key presented, "" if none
}

// admitTraced is admit in the span of the decision, when traces are on:
// the span ends with the admission decided, before the upgrade, and
// tells the status of an attempt answered without one.
func (g *Gateway) admitTraced(w http.ResponseWriter, r *http.Request, dryRun bool) (admission, bool) {
	if !g.tracer.Enabled() {
		return g.admit(w, r, dryRun, tracing.Span{})
	}
	ctx, span := g.tracer.Start(r.Context(), propagation.HeaderCarrier(r.Header))
	sw := &statusWriter{ResponseWriter: w}
	a, ok := g.admit(sw, r.WithContext(ctx), dryRun, span)
	if sw.status != 0 && span.Recording() {
		span.SetAttributes(attribute.Int("http.response.status_code", sw.status))
	}
	span.End(nil)
	return a, ok
}

// statusWriter remembers the status a response was written with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// admit runs the authorizer and decides the connection limits, with the
// global rules naming ws:connect (as a dry run if asked), recording the
// decision in span. A refusal is answered on w and ok is false.
func (g *Gateway) admit(w http.ResponseWriter, r *http.Request, dryRun bool, span tracing.Span) (a admission, ok bool) {
	g.mu.Lock()
	closing := g.closing
	g.mu.Unlock()
	if closing {
		problem.Write(w, http.StatusServiceUnavailable, "the gateway is shutting down")
		return a, false
	}
	q, err := httpx.Query(r.URL.RawQuery)
	if err != nil {
		g.reject(w, http.StatusBadRequest, err.Error())
		return a, false
	}
	tenant, sid := q.Get("tenant"), q.Get("session")
	if tenant == "" || sid == "" {
		g.reject(w, http.StatusUnauthorized, "a connection needs ?tenant= and ?session= (PUT /v1/sessions creates a session)")
		return a, false
	}
	if err := g.checkOrigin(r); err != nil {
		g.reject(w, http.StatusForbidden, err.Error())
		return a, false
	}
	p, t, l, err := g.tenantOf(tenant)
	if err != nil {
		g.reject(w, problem.Status(err), err.Error())
		return a, false
	}
	// The session is the credential (its tenant's key or the admin token
	// created it), so the caller is trusted; a key that comes as well
	// must still be the tenant's (policy.Authenticate).
	if _, err := p.Authenticate(policy.Credentials{Tenant: tenant, APIKey: presentedKey(r), Trusted: true}); err != nil {
		g.reject(w, problem.Status(err), err.Error())
		return a, false
	}
	// A session refused a moment ago is refused again without asking the
	// store: neither for the session (its tenant's key or a token created
	// it, and it was there) nor for the limits (refusals.go).
	now := g.now()
	cl := g.clientOf(r, t)
	var keyHash string
	if bans := g.decider.Bans(); bans != nil && bans.Any() {
		if k := presentedKey(r); k != "" {
			keyHash = policy.HashKey(k)
		}
		if ban, ok := bans.MatchIdentity(tenant, "", canonicalAddr(cl.addr), keyHash, now); ok {
			// Refused with no store call, as every front end refuses a
			// banned caller.
			g.stats.refusedGlobal.Add(1)
			g.refuseBanned(w, ban, now)
			return a, false
		}
	}
	rkey := cl.refusalKey(sid)
	shared := g.sharedOf(p)
	var dec admit.Decision
	if sr, ok := g.connectRefusedLocally(tenant, rkey, l, shared, now, &dec); ok {
		g.refuse(w, l, &dec, !dryRun, sr)
		return a, false
	}
	ctx := r.Context()
	if _, err := g.session(ctx, tenant, sid); err != nil {
		g.reject(w, problem.Status(err), err.Error())
		return a, false
	}

	var buf [8]admit.Charge
	charges := buf[:len(l.connect)]
	for i, rule := range l.connect {
		charges[i] = admit.Charge{Key: key(rule, tenant, sid, ActionConnect), Rule: &rule.Rule, Cost: 1, LeaseTTL: g.leaseTTL, DryRun: dryRun}
	}
	res := policy.Resolution{Policy: p, Tenant: t, Charges: charges, Rules: l.connect[:]}
	if len(shared.connect) > 0 {
		// Their charges point to the shares these resolutions hold.
		var reqs, leases policy.Resolution
		if err := g.resolveConnect(p, &cl, tenant, sid, dryRun, shared, &reqs, &leases); err != nil {
			g.reject(w, problem.Status(err), "the connection could not be decided: "+err.Error())
			return a, false
		}
		res.Charges = append(append(res.Charges, reqs.Charges...), leases.Charges...)
		res.Rules = append(append(append(make([]*policy.Rule, 0, len(res.Charges)), l.connect[:]...), reqs.Rules...), leases.Rules...)
	}
	freed := g.freedSlots()
	out, err := g.decider.Decide(ctx, &res, &dec)
	if err != nil {
		g.reject(w, problem.Status(err), "the connection could not be decided: "+err.Error())
		return a, false
	}
	span.Decided(&res, &dec, out)
	if !dec.Allowed {
		sr := sharedRefusalOf(&dec, res.Rules, len(l.connect))
		g.learnConnectRefusal(tenant, rkey, l, shared, now, freed, &dec, sr)
		g.refuse(w, l, &dec, !dryRun, sr)
		return a, false
	}
	return admission{tenant: tenant, session: sid, limits: l, lease: dec.Lease.ID, client: cl, keyHash: keyHash}, true
}

// canonicalAddr returns a client address as bans name it, "" if it is no
// address.
func canonicalAddr(addr string) string {
	ip, err := policy.CanonicalIP(addr)
	if err != nil {
		return ""
	}
	return ip
}

// refuseBanned answers a connection a ban refuses: 429 until the ban ends.
func (g *Gateway) refuseBanned(w http.ResponseWriter, ban policy.Ban, now time.Time) {
	left := ban.Expires.Sub(now)
	w.Header().Set("Retry-After", strconv.FormatInt(max(1, int64((left+time.Second-1)/time.Second)), 10))
	problem.WriteDetails(w, problem.RefusalBy("ban:"+ban.ID, nil, left,
		"connection refused by ban:"+ban.ID+": the caller is banned until "+ban.Expires.UTC().Format(time.RFC3339)))
}

// closeBanned closes the open connections a ban now in force refuses.
func (g *Gateway) closeBanned() {
	bans := g.decider.Bans()
	if !bans.Any() {
		return
	}
	now := g.now()
	for _, c := range g.snapshot() {
		if ban, ok := bans.MatchIdentity(c.tenant, "", canonicalAddr(c.client.addr), c.keyHash, now); ok {
			g.stats.banned.Add(1)
			c.close(CloseBanned, "banned by ban:"+ban.ID)
		}
	}
}

// resolveConnect resolves the global rules naming ws:connect for a
// connection of the tenant's session: the rate rules into reqs, the
// concurrency rules into leases, whose slots are held in the connection's
// lease, renewed and released with it.
func (g *Gateway) resolveConnect(p *policy.Policy, cl *client, tenant, sid string, dryRun bool, shared *sharedRules, reqs, leases *policy.Resolution) error {
	if shared.connectRequests {
		req := cl.request(tenant, sid, ActionConnect, policy.Requests, dryRun)
		if err := resolveShared(p, &req, shared.connect, reqs); err != nil {
			return err
		}
	}
	if shared.connectLeases {
		req := cl.request(tenant, sid, ActionConnect, policy.Leases, dryRun)
		if err := resolveShared(p, &req, shared.connect, leases); err != nil {
			return err
		}
		for i := range leases.Charges {
			leases.Charges[i].LeaseTTL = g.leaseTTL
		}
	}
	return nil
}

// serve upgrades an admitted connection and starts its reading goroutine.
func (g *Gateway) serve(w http.ResponseWriter, r *http.Request, a admission) {
	tenant, sid, l := a.tenant, a.session, a.limits
	ctx := r.Context()
	// The setup counts as a connection for Close, which waits for it to
	// finish and free what it took.
	g.mu.Lock()
	if g.closing {
		g.mu.Unlock()
		if a.lease != "" {
			_ = g.decider.ReleaseLease(context.WithoutCancel(ctx), a.lease)
		}
		problem.Write(w, http.StatusServiceUnavailable, "the gateway is shutting down")
		return
	}
	g.wg.Add(1)
	g.mu.Unlock()
	defer g.wg.Done() // after the cleanup below: defers run last first
	var err error
	msgKey := key(l.messages[0], tenant, "", ActionMessage)
	c := &conn{g: g, tenant: tenant, session: sid, lease: a.lease, id: newID(12),
		msgKey: msgKey, refusalKey: a.client.refusalKey(msgKey), client: a.client, keyHash: a.keyHash}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	admitted := false
	defer func() {
		if !admitted {
			c.cleanup()
		}
	}()
	if c.unsubscribe, err = g.sessions.Subscribe(ctx, sid, c.deliver); err != nil {
		g.reject(w, problem.Status(err), err.Error())
		return
	}
	s, err := g.sessions.Touch(ctx, sid, l.gw.SessionTTL)
	if err != nil {
		g.reject(w, problem.Status(err), err.Error())
		return
	}
	c.setDeadline(s.ExpiresAt)
	c.sessionLease = s.Lease
	g.renewSlot(ctx, s.Lease, tenant)
	// Upgraded through a frameConn, which bounds each message's frames and
	// time (frames.go).
	fw := &frameHijacker{ResponseWriter: w, maxFrames: g.msgFrames, timeout: g.msgTimeout}
	ws, err := websocket.Accept(fw, r, &websocket.AcceptOptions{
		OriginPatterns: g.origins,
		// A client's pings and pongs cost the store nothing, but each is a
		// frame to read and a ping one to answer: they draw on the frame
		// budget as refused messages do. Past it, no pong.
		OnPingReceived: func(context.Context, []byte) bool { return c.control() },
		OnPongReceived: func(context.Context, []byte) { c.control() },
	})
	if err != nil {
		g.stats.rejected.Add(1)
		return // Accept answered the client
	}
	ws.SetReadLimit(g.maxMessage)
	if !c.attach(ws, fw.conn) {
		return // closed meanwhile; the deferred cleanup frees the slot
	}
	g.mu.Lock()
	if g.closing {
		g.mu.Unlock()
		closeWS(ws, fw.conn, websocket.StatusGoingAway, "the server is shutting down")
		return
	}
	g.conns[c] = struct{}{}
	g.wg.Add(1)
	g.mu.Unlock()
	admitted = true
	g.stats.admitted.Add(1)
	g.stats.connections.Add(1)
	// The connection is hijacked: the handler returns, and with it the
	// HTTP server's goroutine, whose stack grew deep while admitting. A
	// fresh goroutine reads with a small one: most of an idle
	// connection's memory is its reader's stack.
	go func() {
		defer g.wg.Done()
		c.serve()
	}()
}

func (g *Gateway) reject(w http.ResponseWriter, status int, detail string) {
	g.stats.rejected.Add(1)
	problem.Write(w, status, detail)
}

// refuse answers a connection over a limit: 429, Retry-After in whole
// seconds (at least 1), and a problem naming the limit.
func (g *Gateway) refuse(w http.ResponseWriter, l *limits, dec *admit.Decision, count bool, sr sharedRefusal) {
	values := [4]int64{l.gw.TenantConnections, l.gw.ConnectionsPerSession, l.gw.TenantPerMinute, l.gw.SessionPerMinute}
	detail := "connection refused by " + dec.DeniedBy
	own := false
	for i, r := range l.connect {
		if r.Name == dec.DeniedBy {
			own = true
			if count {
				g.stats.refused[i].Add(1)
			}
			detail += ": " + fmt.Sprintf(refusalDetails[i], values[i])
		}
	}
	if !own {
		if count {
			g.stats.refusedGlobal.Add(1)
		}
		if sr.overShare {
			detail += ", a global limit the tenants share: the tenant is over its share while others want theirs"
		} else {
			detail += ", a global limit the tenants share: it is full"
		}
	}
	secs := max(1, int64((dec.RetryAfter+time.Second-1)/time.Second))
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	problem.WriteDetails(w, problem.Refusal(dec, detail))
}

// refusalDetails explain each connection limit, in the order of
// limits.connect.
var refusalDetails = [4]string{
	"the tenant has %d open connections, its limit",
	"the session has %d open connections, its limit",
	"the tenant opened %d connections in the last minute, its limit",
	"the session opened %d connections in the last minute, its limit",
}

// presentedKey returns the API key r carries in X-API-Key or
// Authorization: Bearer, "" for none.
func presentedKey(r *http.Request) string {
	if k := r.Header.Get("X-API-Key"); k != "" {
		return k
	}
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

func isUpgrade(r *http.Request) bool {
	return r.Method == http.MethodGet && headerHas(r.Header, "Connection", "upgrade") && headerHas(r.Header, "Upgrade", "websocket")
}

func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), token) {
				return true
			}
		}
	}
	return false
}

// checkOrigin applies the origin rules websocket.Accept applies, before
// anything is charged: no Origin (not a browser), the request's own host,
// or a host matching one of the patterns.
func (g *Gateway) checkOrigin(r *http.Request) error {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return fmt.Errorf("origin %.100q is not a URL with a host", origin)
	}
	if strings.EqualFold(u.Host, r.Host) {
		return nil
	}
	for _, p := range g.origins {
		target := u.Host
		if strings.Contains(p, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, _ := path.Match(strings.ToLower(p), strings.ToLower(target)); ok {
			return nil
		}
	}
	return fmt.Errorf("origin %.100q may not connect (allowed: this host and %d configured patterns)", origin, len(g.origins))
}

// newID returns n random bytes, base64url without padding.
func newID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
