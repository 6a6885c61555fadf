// Package httplimit rate limits net/http servers with Admit, two ways.
//
// Middleware puts an admit.Limiter in front of a handler: a func of the
// program's own says who sent each request (an admit.Who), and the
// Limiter's limits decide it, answering with RateLimit headers, 429 and
// Retry-After. It is the way in for a Go program that sets its limits in
// code:
//
//	handler = httplimit.Middleware(limiter, func(r *http.Request) (admit.Who, error) {
//		return admit.Who{Tenant: r.Header.Get("X-Tenant"), IP: r.RemoteAddr}, nil
//	})(handler)
//
// New builds a Limiter (this package's) that does the same from a policy
// of tenants, tiers and rules, and identifies callers itself: API key,
// user header or JWT claim, client IP behind trusted proxies, actions
// from paths. admit proxy and the /v1/authz forward-auth endpoint are
// built on it.
//
// Identification follows one rule: a request is believed only as far as
// its credentials and its path reach. An API key names its tenant (by its
// SHA-256 hash; the key itself is never logged nor used as a store key); a
// JWT is believed once its signature, algorithm, expiry, issuer and
// audience check out; forwarding headers and the user header are believed
// only from trusted proxies.
package httplimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/internal/tracing"
	"github.com/admitdev/admit/policy"
)

// Action maps requests to an action name.
type Action struct {
	// Pattern is a net/http ServeMux pattern: "[METHOD ][HOST]/path",
	// with wildcards, like "POST /v1/docs/{id}/summary".
	Pattern string
	// Name is the action; empty means the pattern itself.
	Name string
}

// Options configure a Limiter. Store (or Decider) and Policy are required;
// the zero value of every other field is a documented default.
type Options struct {
	// Store decides; Instances is the number of servers sharing it, for
	// rules with on_error: local (default 1). Ignored when Decider is set.
	Store     admit.Store
	Instances int64
	// Decider, if set, decides instead of a new one over Store: share one
	// with the rest of a server so that its local fallback limiter is
	// shared too.
	Decider *policy.Decider
	// Policy returns the current policy, for instance a
	// (*catalog.Catalog).Policy method value.
	Policy func() *policy.Policy

	// TrustedProxies are the peers whose forwarding and user headers are
	// believed. Default: none, so the client is the peer.
	TrustedProxies Proxies
	// ForwardedHeader is X-Forwarded-For (the default) or Forwarded (RFC
	// 7239): the one header trusted proxies set. Only that one is read,
	// because a proxy that sets one usually passes the other through from
	// the client untouched.
	ForwardedHeader string
	// UserHeader, if set, is a header carrying the user id, set by an
	// authenticating proxy in front (believed from TrustedProxies only).
	UserHeader string
	// JWT, if set, identifies users (and tenants, with a tenant claim)
	// by a signed bearer token.
	JWT *JWT
	// Actions map requests to actions; the first match by ServeMux rules
	// (most specific pattern) wins. Unmatched requests have no action:
	// only rules for all actions apply to them. Paths are matched as the
	// common web frameworks route them (a trailing slash, case,
	// ";parameters" and a final ".extension" do not make "/login" another
	// path), unless StrictPaths, which matches them exactly as ServeMux
	// does.
	Actions     []Action
	StrictPaths bool
	// RequireKey refuses requests without a credential (an API key, or a
	// verified JWT when JWT is set) or a tenant or key named by Identify,
	// with 401. Otherwise they are anonymous: charged the global rules only
	// (per IP, say), and refused with 401 when no global rule applies to
	// them, never passed unlimited (unless PassUnlimited).
	RequireKey bool
	// PassUnlimited admits an anonymous request that no global rule
	// applies to, unlimited, where it would be refused with 401. The
	// forward-auth endpoint sets it: its contract is to answer for every
	// request a proxy asks about, public paths included.
	PassUnlimited bool
	// RetryJitter spreads the Retry-After of refusals by up to this much,
	// so that refused clients do not all return in the same second; never
	// earlier than the true retry time. Default 1s; negative disables.
	RetryJitter time.Duration
	// Identify, if set, runs after the built-in identification and may
	// change any field of the request (from a context value set by an
	// authentication middleware, say). An error it returns is answered
	// as problem.Status maps it: admit.Errorf(admit.CodePermission, …)
	// is a 403.
	Identify func(r *http.Request, req *policy.Request) error
	// Observe, if set, is told every decision made, with its outcome and
	// how long it took; it must not keep res or d.
	Observe func(res *policy.Resolution, d *admit.Decision, out policy.Outcome, took time.Duration)
	// Shedding protects the service behind Handler with adaptive
	// concurrency limits (see ShedGroup), after the rate limits admitted
	// a request.
	Shedding []ShedGroup
	// Logger receives internal errors; default slog.Default().
	Logger *slog.Logger
	// TracerProvider, if set, traces every decision in an OpenTelemetry
	// span (docs/traces.md): a child of the span of the request's context
	// if it has one, else of the trace its traceparent header continues.
	// The store calls are the Decider's spans, as policy.Decider.Trace
	// makes them: New traces a Decider of its own with tp, and leaves a
	// given one as it is. Nil traces nothing, at no cost.
	TracerProvider trace.TracerProvider
	// FrontEnd names the limiter in its spans' admit.front_end attribute;
	// default "http".
	FrontEnd string
}

// A Limiter is the rate limiting middleware. Create it with New; it is safe
// for concurrent use.
type Limiter struct {
	opts     Options
	decider  *policy.Decider
	tracer   *tracing.Tracer // nil: traces are off
	jwt      *verifier
	actions  *http.ServeMux
	patterns map[string]actionPattern // by the pattern as registered
	calls    sync.Pool
	// shedding holds the started shedding groups.
	shedding []*shedGroup
	// ownHeaders are the configured headers a request is identified by
	// (user, shedding class), whose underscore spellings are removed.
	ownHeaders []string
}

// actionHandler marks the handlers of the action mux: one per pattern,
// whose value is the action name.
type actionHandler string

func (actionHandler) ServeHTTP(http.ResponseWriter, *http.Request) {}

// New returns a Limiter, or an error saying which option is wrong.
func New(opts Options) (*Limiter, error) {
	if opts.Policy == nil {
		return nil, errors.New("httplimit: Options.Policy is required")
	}
	if opts.Store == nil && opts.Decider == nil {
		return nil, errors.New("httplimit: Options.Store or Options.Decider is required")
	}
	l := &Limiter{opts: opts, decider: opts.Decider}
	if err := l.compile(); err != nil {
		return nil, err
	}
	if l.decider == nil {
		l.decider = policy.NewDecider(opts.Store, opts.Instances)
		l.decider.Trace(opts.TracerProvider, "")
	}
	l.tracer = tracing.New(opts.TracerProvider, cmp.Or(opts.FrontEnd, "http"))
	if l.opts.RetryJitter == 0 {
		l.opts.RetryJitter = time.Second
	}
	if l.opts.Logger == nil {
		l.opts.Logger = slog.Default()
	}
	l.calls.New = func() any { return new(call) }
	return l, nil
}

// OptionError is an invalid option of Options. Field names it as in
// Options ("Actions", "JWT.Keys", "UserHeader"…); Index is the element of
// a list option, or -1.
type OptionError struct {
	Field string
	Index int
	msg   string
}

func (e *OptionError) Error() string { return "httplimit: " + e.msg }

func optionError(field string, index int, format string, args ...any) error {
	return &OptionError{Field: field, Index: index, msg: fmt.Sprintf(format, args...)}
}

// Validate checks the identification options (forwarded header, user
// header, JWT keys, action patterns) without needing a store or a policy:
// configuration checks use it.
func (o *Options) Validate() error {
	l := &Limiter{opts: *o}
	return l.compile()
}

// compile checks and prepares the identification options. Its errors are
// *OptionError.
func (l *Limiter) compile() error {
	o := &l.opts
	switch {
	case o.ForwardedHeader == "" || strings.EqualFold(o.ForwardedHeader, XForwardedFor):
		o.ForwardedHeader = XForwardedFor
	case strings.EqualFold(o.ForwardedHeader, Forwarded):
		o.ForwardedHeader = Forwarded
	default:
		return optionError("ForwardedHeader", -1, "forwarded header %q: want X-Forwarded-For or Forwarded", o.ForwardedHeader)
	}
	if h := o.UserHeader; h != "" {
		if !validHeaderName(h) {
			return optionError("UserHeader", -1, "user header %q is not a header name", h)
		}
		o.UserHeader = http.CanonicalHeaderKey(h)
	}
	if o.JWT != nil {
		v, err := newVerifier(*o.JWT)
		if err != nil {
			return err
		}
		l.jwt = v
	}
	if len(o.Actions) > 0 {
		if err := l.compileActions(); err != nil {
			return err
		}
	}
	if err := l.compileShedding(); err != nil {
		return err
	}
	l.ownHeaders = l.ownHeaders[:0]
	if o.UserHeader != "" {
		l.ownHeaders = append(l.ownHeaders, o.UserHeader)
	}
	for _, g := range l.shedding {
		if g.ClassHeader != "" {
			l.ownHeaders = append(l.ownHeaders, g.ClassHeader)
		}
	}
	return nil
}

func validHeaderName(h string) bool {
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return h != ""
}

// call is the per-request working set, pooled.
type call struct {
	req policy.Request
	res policy.Resolution
	d   admit.Decision
	buf []byte
}

// Handler returns next behind the limiter: a refused request is answered
// here and never reaches next; an admitted one reaches it with the
// RateLimit headers already set on the response, through its shedding
// group's concurrency limit if it has one (Options.Shedding).
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := l.calls.Get().(*call)
		defer l.put(c)
		if l.check(w, r, c) {
			l.serveShed(w, r, c, next)
		}
	})
}

// Check identifies and decides r. When admitted it sets the RateLimit
// headers on w and returns true; otherwise it answers r itself (401, 403,
// 400, 429 or 503, as problem+json) and returns false. It does not shed:
// shedding needs the request's whole life, which Handler has.
func (l *Limiter) Check(w http.ResponseWriter, r *http.Request) bool {
	c := l.calls.Get().(*call)
	defer l.put(c)
	return l.check(w, r, c)
}

func (l *Limiter) check(w http.ResponseWriter, r *http.Request, c *call) bool {
	ctx, span := l.tracer.Start(r.Context(), propagation.HeaderCarrier(r.Header))
	admitted, err := l.decide(ctx, w, r, c, span)
	span.End(err)
	return admitted
}

// decide is check in ctx, which holds the decision's span: it reports
// whether r was admitted, and the error it was answered with, if any.
func (l *Limiter) decide(ctx context.Context, w http.ResponseWriter, r *http.Request, c *call, span tracing.Span) (bool, error) {
	start := time.Now()
	p := l.opts.Policy() // one policy for identification and resolution
	if err := l.identify(r, &c.req, p); err != nil {
		l.fail(w, r, err)
		return false, err
	}
	if err := p.Resolve(&c.req, &c.res); err != nil {
		l.fail(w, r, err)
		return false, err
	}
	if len(c.res.Charges) == 0 && c.req.Tenant == "" && !l.opts.PassUnlimited {
		// Unidentified, and no global rule applies: never unlimited.
		l.fail(w, r, errUnlimited)
		return false, errUnlimited
	}
	out, err := l.decider.Decide(ctx, &c.res, &c.d)
	if err != nil {
		l.fail(w, r, err)
		return false, err
	}
	span.Decided(&c.res, &c.d, out)
	if l.opts.Observe != nil {
		l.opts.Observe(&c.res, &c.d, out, time.Since(start))
	}
	c.buf = httpx.SetHeaders(w.Header(), c.buf, c.res.Rules, c.res.Charges, c.d.Results)
	if c.d.Allowed {
		return true, nil
	}
	writeRefusal(w, r, &c.d, l.retryAfter(c.d.RetryAfter))
	return false, nil
}

func (l *Limiter) put(c *call) {
	c.req = policy.Request{}
	l.calls.Put(c)
}

// retryAfter returns the Retry-After seconds of a refusal: the wait plus a
// random share of the jitter, rounded up, so never before the wait is over.
func (l *Limiter) retryAfter(wait time.Duration) int64 {
	if j := l.opts.RetryJitter; j > 0 {
		wait += time.Duration(rand.Int64N(int64(j) + 1))
	}
	return httpx.RetrySeconds(wait)
}

// errUnauthenticated answers 401 when Options.RequireKey is set and no
// credential came.
var errUnauthenticated = admit.Errorf(admit.CodeUnauthenticated, "an API key is required: present one in X-API-Key or Authorization: Bearer")

// errUnlimited answers 401 a request that names no tenant when no global
// rule applies to it: passing it would pass it unlimited.
var errUnlimited = admit.Errorf(admit.CodeUnauthenticated, "the request names no tenant and no global rule limits it: present an API key in X-API-Key or Authorization: Bearer")

func (l *Limiter) fail(w http.ResponseWriter, r *http.Request, err error) {
	// A rule fails closed and its store is down: try again soon.
	writeError(w, r, err, l.retryAfter(time.Second), l.opts.Logger)
}

// Identify fills req with what r says of its sender, as far as it is
// believed: tenant and API key from the key, user from a verified JWT or
// (from a trusted proxy) the user header, client IP, action; cost 1. It
// also removes the underscore spellings of identity headers, the user
// header and the shedding class headers from r (see
// stripUnderscoreVariants), and the user header and class headers
// themselves when r is not from a trusted proxy. The errors are those Check answers with.
func (l *Limiter) Identify(r *http.Request, req *policy.Request) error {
	return l.identify(r, req, l.opts.Policy())
}

func (l *Limiter) identify(r *http.Request, req *policy.Request, p *policy.Policy) error {
	stripUnderscoreVariants(r.Header, l.ownHeaders...)
	fromProxy := len(l.ownHeaders) > 0 && l.opts.TrustedProxies.Contains(PeerIP(r))
	if len(l.ownHeaders) > 0 && !fromProxy {
		// Believed from trusted proxies only, and so never passed on from
		// anyone else: the handler (an upstream) might believe them.
		for _, h := range l.ownHeaders {
			delete(r.Header, h)
		}
	}
	*req = policy.Request{Cost: 1}
	if ip := ClientIP(r, l.opts.TrustedProxies, l.opts.ForwardedHeader); ip.IsValid() {
		req.IP = ip.String()
		req.Client = req.IP
	}
	key, token := credentials(r, l.jwt != nil)
	credited, verified := false, false
	if key != "" {
		tenant, err := p.Authenticate(policy.Credentials{APIKey: key})
		if err != nil {
			return err
		}
		req.Tenant, req.APIKey, credited = tenant, key, true
	}
	if token != "" {
		c, err := l.jwt.verify(token)
		if err != nil {
			return admit.Errorf(admit.CodeUnauthenticated, "the bearer token is not valid: %v", err)
		}
		if c.tenant != "" {
			if req.Tenant != "" && req.Tenant != c.tenant {
				return admit.Errorf(admit.CodePermission, "the API key's tenant is not the token's")
			}
			req.Tenant, verified = c.tenant, true
		}
		req.User, credited = c.user, true
	}
	if req.User == "" && l.opts.UserHeader != "" && fromProxy { // the user header is one of ownHeaders
		req.User = r.Header.Get(l.opts.UserHeader)
	}
	if l.actions != nil {
		req.Action = l.action(r)
	}
	if l.opts.Identify != nil {
		if err := l.opts.Identify(r, req); err != nil {
			return err
		}
	}
	// A tenant or key the Identify hook named identifies the request as
	// well as a credential does: the hook is the application's own code.
	if l.opts.RequireKey && !credited && req.Tenant == "" && req.APIKey == "" {
		return errUnauthenticated
	}
	// Again after the hook, which may have named a tenant or a key.
	if err := p.AuthenticateRequest(req, verified); err != nil {
		req.Tenant = ""
		return err
	}
	return nil
}

// credentials returns r's API key (X-API-Key, or a bearer credential that
// is not a JWT) and bearer JWT, if any.
func credentials(r *http.Request, jwtOn bool) (key, token string) {
	key = strings.TrimSpace(r.Header.Get("X-API-Key"))
	if b, ok := Bearer(r); ok {
		if jwtOn && looksLikeJWT(b) {
			token = b
		} else if key == "" {
			key = b
		}
	}
	return key, token
}

// Bearer returns the credential of r's "Authorization: Bearer" header.
func Bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:]), true
	}
	return "", false
}

// Close stops l's local fallback limiter when l made its own Decider.
func (l *Limiter) Close() error {
	if l.opts.Decider == nil {
		return l.decider.Close()
	}
	return nil
}
