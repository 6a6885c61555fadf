package llm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/problem"
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
	// Drain, when positive, keeps reading a stream whose client left for
	// up to this long, so that the provider's own usage report settles
	// the call: what the provider bills, rather than the input and the
	// output relayed. 0 cancels the call at once.
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
	limit := t.MaxBody
	if limit <= 0 {
		limit = DefaultMaxBody
	}
	var body []byte
	if r.Body != nil {
		body, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
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
	req, err := ParseRequest(api, pathModel, body, t.Gate.opts.Count)
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
	if t.Drain > 0 && req.Stream {
		// The call outlives its client by up to Drain: its own context.
		ctx, cancel = context.WithCancel(context.WithoutCancel(ctx))
	}
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
		// The call did not happen, or not that anyone will tell: refund.
		t.settle(settleCtx, ticket, Settlement{Status: http.StatusBadGateway})
		return nil, err
	}
	setHeaders(resp.Header, ticket)
	// Server-sent events are read event by event; anything else (a JSON
	// body, Gemini's stream as one JSON array without alt=sse) by its
	// tail, where the last usage is.
	stream := resp.StatusCode < 300 && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	mb := newMeteredBody(resp.Body, api, stream, askUsage, func(m *meter, ended bool) {
		t.settle(settleCtx, ticket, settlement(m, ended, resp.StatusCode, req, ticket.maxOut))
	})
	mb.cancel = cancel
	if stream {
		mb.drain = t.Drain
	}
	resp.Body = mb
	if askUsage {
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
	}
	return resp, nil
}

// settlement is how a call whose response m read ended.
func settlement(m *meter, ended bool, status int, req *Request, maxOut int64) Settlement {
	s := Settlement{Usage: m.usage, Reported: m.reported(), Status: status}
	switch {
	case status >= 400 && !s.Reported:
		// An error without usage: nothing was generated; refund.
	case ended && m.input && m.output:
	case ended:
		// The provider reported nothing: the reservation stands.
		s.Keep = true
	default:
		// The client left, or the upstream broke, before the end: the
		// input (as reported, else as estimated) and the output relayed.
		s.Reported = false
		if !m.input {
			s.Usage[policy.Input] = req.Input
		}
		// The relayed output is estimated; the provider cannot have made
		// more than the maximum it was sent.
		out := max(s.Usage[policy.Output], m.relayedOutput()-s.Usage[policy.Reasoning])
		if maxOut > 0 {
			out = min(out, maxOut*req.Choices-s.Usage[policy.Reasoning])
		}
		s.Usage[policy.Output] = max(out, 0)
	}
	return s
}

func (t *Transport) settle(ctx context.Context, ticket *Ticket, s Settlement) {
	if s.Keep {
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
	httpx.SetHeaders(h, nil, rules, d.Results)
	for _, u := range [...]struct {
		unit policy.Unit
		name string
	}{{policy.UnitRequests, "requests"}, {policy.UnitTokens, "tokens"}} {
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
