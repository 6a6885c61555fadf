package llm

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/policy"
)

// Problem is an answer a Gate gives instead of the provider: a refusal
// (429) or an error (400, 401, 403, 503), written in the caller's
// provider's format by Write.
type Problem struct {
	Status  int
	Message string
	// Kind is OpenAI's error code: "rate_limit_exceeded" or
	// "insufficient_quota" for refusals, "invalid_request_error" and so
	// on for others.
	Kind string
	// RetryAfter is when to retry a refusal; Final says that no retry
	// helps before the refusing budget's period ends (x-should-retry:
	// false).
	RetryAfter time.Duration
	Final      bool
	// DeniedBy names the refusing rule.
	DeniedBy string
	// FromProvider says the provider answered the error (rewritten), not
	// Admit: it carries no X-Admit-Error.
	FromProvider bool
	// spent says the refusing budget holds nothing: any call of the
	// tenant is refused alike for now.
	spent bool
	// rules, charges and results are those of the refusing decision,
	// when one refused the call: its RateLimit fields go with the
	// refusal, as with an admitted call's answer.
	rules   []*policy.Rule
	charges []admit.Charge
	results []admit.Result
}

func (p *Problem) Error() string { return p.Message }

// Write answers with p in the format of provider's API: OpenAI's
// {"error":{"message","type","code"}}, Anthropic's
// {"type":"error","error":{"type","message"}} or Gemini's
// {"error":{"code","message","status"}}, with retry-after (seconds,
// rounded up), retry-after-ms and x-should-retry, which the official
// SDKs obey.
func (p *Problem) Write(w http.ResponseWriter, provider Provider) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	// A refusal no wait cures (a call larger than a rule takes at once)
	// says so with x-should-retry alone: a Retry-After of 0 would invite
	// a client that ignores it to retry at once, forever.
	if (p.Status == http.StatusTooManyRequests || p.Status == http.StatusServiceUnavailable) && (p.RetryAfter > 0 || !p.Final) {
		ms := max((p.RetryAfter+time.Millisecond-1)/time.Millisecond, 0)
		h.Set("Retry-After", strconv.FormatInt(int64((p.RetryAfter+time.Second-1)/time.Second), 10))
		h.Set("Retry-After-Ms", strconv.FormatInt(int64(ms), 10))
	}
	if p.Final {
		h.Set("X-Should-Retry", "false")
	}
	if !p.FromProvider {
		h.Set("X-Admit-Error", "true")
	}
	httpx.SetHeaders(h, nil, p.rules, p.charges, p.results)
	w.WriteHeader(p.Status)
	_, _ = w.Write(p.body(provider))
}

func (p *Problem) body(provider Provider) []byte {
	var v any
	switch provider {
	case Anthropic:
		t := map[int]string{
			400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
			404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
		}[p.Status]
		if t == "" {
			t = "api_error"
		}
		v = map[string]any{"type": "error", "error": map[string]string{"type": t, "message": p.Message}}
	case Gemini:
		st := map[int]string{
			400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
			413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE",
		}[p.Status]
		if st == "" {
			st = "INTERNAL"
		}
		v = map[string]any{"error": map[string]any{"code": p.Status, "message": p.Message, "status": st}}
	default:
		typ := map[int]string{
			400: "invalid_request_error", 401: "invalid_request_error", 403: "invalid_request_error",
			404: "invalid_request_error", 413: "invalid_request_error", 429: "tokens", 503: "server_error",
		}[p.Status]
		if p.Kind == "insufficient_quota" {
			typ = "insufficient_quota"
		}
		if typ == "" {
			typ = "server_error"
		}
		var code any
		if p.Kind != "" {
			code = p.Kind
		}
		v = map[string]any{"error": map[string]any{"message": p.Message, "type": typ, "param": nil, "code": code}}
	}
	b, _ := json.Marshal(v)
	return append(b, '\n')
}

// response returns p as an *http.Response, for a RoundTripper's caller.
func (p *Problem) response(r *http.Request, provider Provider) *http.Response {
	rec := &headerRecorder{h: http.Header{}}
	p.Write(rec, provider)
	body := p.body(provider)
	return &http.Response{
		Status: strconv.Itoa(p.Status) + " " + http.StatusText(p.Status), StatusCode: p.Status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: rec.h, Body: nopBody(body), ContentLength: int64(len(body)), Request: r,
	}
}

// headerRecorder collects the headers Write sets.
type headerRecorder struct {
	h http.Header
}

func (r *headerRecorder) Header() http.Header         { return r.h }
func (r *headerRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *headerRecorder) WriteHeader(int)             {}
