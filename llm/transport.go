package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/problem"
	"github.com/admitdev/admit/units"
)

// DefaultMaxBody bounds the request bodies a Transport reads: 32 MiB.
const DefaultMaxBody = 32 << 20

// Transport is an http.RoundTripper that meters the LLM calls it carries
// through a Gate: a call a budget refuses is answered here, in its
// provider's error format, and never goes out; an admitted one goes out
// with its maximum output set, and its response body, passed through
// unchanged, settles the call when it ends or is closed. Requests that
// are not LLM calls (see Route) pass through unmetered.
type Transport struct {
	Gate *Gate
	// Base carries the calls; default http.DefaultTransport.
	Base http.RoundTripper
	// Who identifies the caller of a request: tenant, user, API key. An
	// error refuses the call (as problem.Status maps it). Default: the
	// Request a handler put in the request's context (WithWho).
	Who func(*http.Request) (policy.Request, error)
	// MaxBody bounds a request body; default DefaultMaxBody.
	MaxBody int64
	// Drain, when positive, keeps a call whose client left going for up
	// to this long, streamed or not, reading its answer so that the
	// provider's own usage report settles it: what the provider bills.
	// 0 cancels the call at once. A call the provider received that
	// settles without its report is charged its reservation, the most it
	// could bill.
	Drain time.Duration
	// LegacyMaxTokens writes the maximum output of a chat completion that
	// sets none as max_tokens rather than max_completion_tokens, for
	// OpenAI-compatible servers that predate it.
	LegacyMaxTokens bool
	Logger          *slog.Logger
}

type whoKey struct{}

// WithWho returns ctx carrying who, for a Transport's default Who.
func WithWho(ctx context.Context, who policy.Request) context.Context {
	return context.WithValue(ctx, whoKey{}, who)
}

func whoFromContext(r *http.Request) (policy.Request, error) {
	who, ok := r.Context().Value(whoKey{}).(policy.Request)
	if !ok {
		return policy.Request{}, admit.Errorf(admit.CodeUnauthenticated, "llm: the call names no tenant")
	}
	return who, nil
}

// Middleware returns the Transport as the middleware of the official Go
// SDKs of OpenAI and Anthropic (option.WithMiddleware): a function of a
// request and the next step. Google's genai takes the Transport itself,
// in its HTTP client.
func (t *Transport) Middleware() func(*http.Request, func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	return func(r *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
		return t.roundTrip(r, next)
	}
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return t.roundTrip(r, base.RoundTrip)
}

func (t *Transport) logger() *slog.Logger {
	if t.Logger != nil {
		return t.Logger
	}
	return slog.Default()
}

func (t *Transport) roundTrip(r *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	api, pathModel, ok := Route(r.Method, r.URL.Path)
	if !ok {
		return next(r)
	}
	provider := api.Provider()
	fail := func(err error) (*http.Response, error) {
		if r.Body != nil {
			r.Body.Close()
		}
		return problemOf(err).response(r, provider), nil
	}
	who := t.Who
	if who == nil {
		who = whoFromContext
	}
	caller, err := who(r)
	if err != nil {
		return fail(err)
	}
	leave, err := t.Gate.Enter(caller.Tenant)
	if err != nil {
		return fail(err)
	}
	// The call is over when its answer settles (the body's end or close,
	// drained or not) or when it fails before one.
	settled := false
	defer func() {
		if !settled {
			leave()
		}
	}()
	limit := t.MaxBody
	if limit <= 0 {
		limit = DefaultMaxBody
	}
	var body []byte
	if r.Body != nil {
		body, err = readBody(r.Body, r.ContentLength, limit)
		r.Body.Close()
		if err != nil {
			status := http.StatusBadRequest
			var slow interface{ Timeout() bool }
			if errors.As(err, &slow) && slow.Timeout() {
				status = http.StatusRequestTimeout // the body came too slowly (httplimit.BodyTimeout)
			}
			return fail(&Problem{Status: status, Kind: "invalid_request_error", Message: "reading the request body: " + err.Error()})
		}
		if int64(len(body)) > limit {
			return fail(&Problem{Status: http.StatusRequestEntityTooLarge, Kind: "invalid_request_error", Message: fmt.Sprintf("the request body is over %d bytes", limit)})
		}
	}
	req, err := t.Gate.Parse(r.Context(), caller, api, pathModel, body)
	if err != nil {
		return fail(err)
	}
	ticket, err := t.Gate.Begin(r.Context(), caller, req)
	if err != nil {
		return fail(err)
	}
	askUsage := provider == OpenAI && req.Stream && !req.IncludeUsage && (api == ChatCompletions || api == Completions)
	req.legacyMaxTokens = t.LegacyMaxTokens
	out, err := req.Body(ticket.maxOut, askUsage)
	if err != nil {
		_ = ticket.Settle(context.WithoutCancel(r.Context()), Settlement{Status: http.StatusBadRequest})
		return fail(err)
	}
	ctx, cancel := r.Context(), context.CancelFunc(func() {})
	if t.Drain > 0 {
		// The call outlives its client by up to Drain: its own context,
		// cancelled Drain after the client leaves (while the answer is
		// awaited; once it comes, its body keeps to the same bound).
		ctx, cancel = context.WithCancel(context.WithoutCancel(ctx))
		drain := t.Drain
		stop := context.AfterFunc(r.Context(), func() { time.AfterFunc(drain, cancel) })
		defer stop()
	}
	// Whether the provider received the call: an error before it was
	// sent whole (no connection, a refused dial, TLS) means it billed
	// nothing; after, it may have generated all it was allowed to.
	var sent atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(w httptrace.WroteRequestInfo) { sent.Store(w.Err == nil) },
	})
	r2 := r.Clone(ctx)
	r2.Body = nopBody(out)
	r2.ContentLength = int64(len(out))
	r2.Header.Set("Content-Length", strconv.Itoa(len(out)))
	r2.GetBody = func() (io.ReadCloser, error) { return nopBody(out), nil }
	// Usage is read from the body: let the transport ask for gzip and
	// decompress it, rather than pass the client's encodings on.
	r2.Header.Del("Accept-Encoding")
	resp, err := next(r2)
	settleCtx := context.WithoutCancel(r.Context())
	if err != nil {
		cancel()
		// Never sent, the call did not happen: refund. Sent, the provider
		// may bill it whole though no answer came (a client that left, a
		// connection cut while it generated): the reservation stands.
		t.settle(settleCtx, ticket, Settlement{Status: http.StatusBadGateway, Keep: sent.Load(), Cut: sent.Load()})
		return nil, err
	}
	scrubHeaders(resp.Header)
	if resp.StatusCode >= 400 {
		// An error: nothing billable was generated (refunded), and its
		// body, which may name the platform's account, organization or
		// key, is answered in the provider's format in words of our own.
		p := providerError(resp, r2)
		t.settle(settleCtx, ticket, Settlement{Status: resp.StatusCode})
		cancel()
		return p.response(r, provider), nil
	}
	setHeaders(resp.Header, ticket)
	// Server-sent events are read event by event; anything else (a JSON
	// body, Gemini's stream as one JSON array without alt=sse) by its
	// tail, where the last usage is.
	stream := resp.StatusCode < 300 && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	settled = true
	mb := newMeteredBody(resp.Body, api, stream, askUsage, func(m *meter, ended bool) {
		defer leave()
		t.settle(settleCtx, ticket, settlement(m, ended, resp.StatusCode))
	})
	mb.cancel = cancel
	mb.drain = t.Drain
	if stream && api != Embeddings {
		mb.maxOutput = ticket.maxOut * req.Choices
	}
	resp.Body = mb
	if askUsage {
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
	}
	return resp, nil
}

// readBody reads at most limit+1 bytes of a request body into a buffer
// of the declared length, when it declares one within limit: growing a
// buffer by doubling left as much again as garbage for a body of 30 MB.
func readBody(r io.Reader, declared, limit int64) ([]byte, error) {
	if declared <= 0 || declared > limit { // 0: unknown, in a client's request
		return io.ReadAll(io.LimitReader(r, limit+1))
	}
	buf := make([]byte, declared, declared+1)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	// Anything past the declared length is the client's error; one more
	// byte says so.
	var extra [1]byte
	if n, _ := r.Read(extra[:]); n > 0 {
		return append(buf, extra[0]), nil
	}
	return buf, nil
}

// settlement is how a call whose response m read ended.
func settlement(m *meter, ended bool, status int) Settlement {
	s := Settlement{Usage: m.usage, Reported: m.reported(), Status: status, ServiceTier: m.tier}
	switch {
	case status >= 400 && !s.Reported:
		// An error without usage: nothing was generated; refund.
	case ended && m.complete():
	default:
		s.Cut = !ended
		// The provider reported nothing, or the answer ended before its
		// report (the client left, the upstream broke): what the
		// provider bills is unknown here — it may have gone on
		// generating, reasoning the client never saw — so the
		// reservation, the most it could bill, stands.
		s.Reported, s.Keep = false, true
	}
	return s
}

func (t *Transport) settle(ctx context.Context, ticket *Ticket, s Settlement) {
	switch {
	case s.Keep && s.Cut:
		// Routine (a client that left): logged only when asked for.
		t.logger().Debug("llm: the answer ended before the provider's usage report; the reservation is charged",
			"tenant", ticket.who.Tenant, "model", ticket.req.Model, "api", ticket.req.API.String(), "status", s.Status)
	case s.Keep:
		t.logger().Warn("llm: the provider reported no usage; the reservation is charged",
			"tenant", ticket.who.Tenant, "model", ticket.req.Model, "api", ticket.req.API.String(), "status", s.Status)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := ticket.Settle(ctx, s); err != nil {
		t.logger().Error("llm: settling a call failed; its reservation stands", "tenant", ticket.who.Tenant, "model", ticket.req.Model, "err", err)
	}
}

// problemOf turns an error of identification, parsing or deciding into
// the Problem to answer with.
func problemOf(err error) *Problem {
	var p *Problem
	if errors.As(err, &p) {
		return p
	}
	if errors.Is(err, ErrBadRequest) {
		return &Problem{Status: http.StatusBadRequest, Kind: "invalid_request_error", Message: err.Error()}
	}
	status := problem.Status(err)
	msg := err.Error()
	if status == http.StatusInternalServerError {
		msg = "internal error"
	}
	pr := &Problem{Status: status, Message: msg}
	switch status {
	case http.StatusUnauthorized:
		pr.Kind = "invalid_api_key"
	case http.StatusServiceUnavailable:
		pr.RetryAfter = time.Second
	}
	return pr
}

// setHeaders sets on an admitted call's response the RateLimit headers
// and OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens},
// each from the rule of its unit with the fewest remaining.
func setHeaders(h http.Header, t *Ticket) {
	d, rules := t.Decision()
	httpx.SetHeaders(h, nil, rules, t.res.Charges, d.Results)
	for _, u := range [...]struct {
		unit units.Unit
		name string
	}{{units.UnitRequests, "requests"}, {units.UnitTokens, "tokens"}} {
		var best *admit.Result
		for r, res := range policy.RuleResults(rules, d.Results) {
			if r.Unit == u.unit && !r.Shadow && (best == nil || res.Remaining < best.Remaining) {
				best = res
			}
		}
		if best == nil {
			continue
		}
		h.Set("X-Ratelimit-Limit-"+u.name, strconv.FormatInt(best.Limit, 10))
		h.Set("X-Ratelimit-Remaining-"+u.name, strconv.FormatInt(best.Remaining, 10))
		h.Set("X-Ratelimit-Reset-"+u.name, best.ResetAfter.Round(time.Millisecond).String())
	}
}

// providerHeaders are the headers of a provider's answer a tenant sees:
// what describes the answer itself. Any other (the platform's
// organization, project and account rate limits, cookies, headers a
// provider adds one day) is the platform's and is removed.
var providerHeaders = map[string]bool{
	"Content-Type": true, "Content-Encoding": true, "Content-Length": true, "Content-Language": true,
	"Cache-Control": true, "Date": true, "Vary": true, "Transfer-Encoding": true,
	"X-Request-Id": true, "Request-Id": true, "Openai-Processing-Ms": true, "Openai-Version": true,
}

// scrubHeaders keeps of a provider's answer's headers only
// providerHeaders; the tenant's own rate limit headers are set after,
// from its rules.
func scrubHeaders(h http.Header) {
	for k := range h {
		if !providerHeaders[http.CanonicalHeaderKey(k)] {
			delete(h, k)
		}
	}
}

// maxErrorBody bounds what is read of a provider's error body.
const maxErrorBody = 64 << 10

// providerError reads the error answer resp of the call sent as sent and
// returns it as a Problem of the same status. What the error says of the
// tenant's request (a 400's message) is kept, with every credential the
// call carried and anything shaped like a key or an account id removed;
// of the platform's account (credentials refused, its rate limits, the
// provider's failures) only that it happened.
func providerError(resp *http.Response, sent *http.Request) *Problem {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	resp.Body.Close()
	p := &Problem{Status: resp.StatusCode, FromProvider: true}
	switch s := resp.StatusCode; {
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		p.Message = "the provider refused the platform's credentials for this call"
	case s == http.StatusTooManyRequests:
		p.Message = "the provider is limiting the platform's calls; retry later"
		p.Kind = "rate_limit_exceeded"
		if secs, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64); err == nil && secs > 0 {
			p.RetryAfter = time.Duration(min(secs, 3600)) * time.Second
		} else {
			p.RetryAfter = time.Second
		}
	case s >= 500:
		p.Message = fmt.Sprintf("the provider failed (%d)", s)
	default:
		p.Message = redact(errorMessage(raw), sent)
		if p.Message == "" {
			p.Message = fmt.Sprintf("the provider refused the request (%d)", s)
		}
	}
	return p
}

// errorMessage returns the message of a provider's error body: OpenAI's
// and Gemini's error.message, Anthropic's error.message; "" if none.
func errorMessage(raw []byte) string {
	var doc struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(raw, &doc) != nil || len(doc.Error) == 0 {
		return ""
	}
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(doc.Error, &e) != nil {
		return ""
	}
	if len(e.Message) > 2048 {
		e.Message = e.Message[:2048]
	}
	return e.Message
}

// keyShaped matches what looks like a credential or an account id in a
// provider's words: OpenAI's sk-, org-, proj_ and user- ids, Google's
// AIza keys and project names and numbers (projects/NAME, runs of 9 or
// more digits), and long runs of key characters.
var keyShaped = regexp.MustCompile(`(?:sk-|org-|proj_|proj-|user-|AIza)[A-Za-z0-9_\-*.]+|(?i:projects?)[/=: ]+[A-Za-z0-9_\-.]+|[0-9]{9,}|[A-Za-z0-9_\-]{32,}`)

// redact removes from msg every credential the sent call carried and
// anything key-shaped.
func redact(msg string, sent *http.Request) string {
	for _, h := range []string{"Authorization", "X-Api-Key", "X-Goog-Api-Key", "Api-Key"} {
		v := strings.TrimSpace(strings.TrimPrefix(sent.Header.Get(h), "Bearer "))
		if len(v) >= 4 {
			msg = strings.ReplaceAll(msg, v, "[redacted]")
		}
	}
	if k := sent.URL.Query().Get("key"); len(k) >= 4 {
		msg = strings.ReplaceAll(msg, k, "[redacted]")
	}
	return keyShaped.ReplaceAllString(msg, "[redacted]")
}
