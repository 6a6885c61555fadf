package llm

import (
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/admitdev/admit/policy"
)

// Upstream is a provider an LLM Handler forwards to: its base URL (as the
// provider's SDKs take it: OpenAI's with /v1, the others' without) and
// the platform's key for it.
type Upstream struct {
	BaseURL *url.URL
	APIKey  string
	// LegacyMaxTokens writes the maximum output an OpenAI chat completion
	// is given as max_tokens, for servers that predate
	// max_completion_tokens.
	LegacyMaxTokens bool
}

// HandlerOptions configure NewHandler. Gate and Identify are required.
type HandlerOptions struct {
	Gate      *Gate
	Upstreams map[Provider]Upstream
	// Identify names the caller from its credentials (an API key of the
	// platform's: in Authorization: Bearer, x-api-key, x-goog-api-key or
	// ?key=, whichever its SDK sends), as httplimit's Identify does.
	Identify func(*http.Request, *policy.Request) error
	// Next serves requests that are not metered LLM calls; nil answers
	// them 404. Other endpoints of the providers (files, models, batches)
	// are never forwarded with the platform's key.
	Next http.Handler
	// Transport carries calls to the providers; default
	// http.DefaultTransport.
	Transport http.RoundTripper
	MaxBody   int64
	// Drain keeps reading a stream whose client left for up to this long,
	// for the provider's own usage report (see Transport.Drain).
	Drain  time.Duration
	Logger *slog.Logger
}

// NewHandler returns admit proxy's LLM front end: each metered call (see
// Route) is identified, decided by the Gate, and forwarded to its
// provider with the caller's credential replaced by the platform's key,
// so that no tenant holds the provider's key and no tenant key reaches a
// provider. Refusals and errors are answered in the provider's format.
func NewHandler(o HandlerOptions) http.Handler {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	h := &handler{o: o, proxies: map[Provider]*httputil.ReverseProxy{}}
	for p, up := range o.Upstreams {
		h.proxies[p] = &httputil.ReverseProxy{
			Rewrite: h.rewrite,
			Transport: &Transport{Gate: o.Gate, Base: o.Transport, MaxBody: o.MaxBody, Drain: o.Drain,
				LegacyMaxTokens: up.LegacyMaxTokens, Logger: o.Logger},
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				o.Logger.Warn("llm: the provider did not answer", "provider", p.String(), "path", r.URL.Path, "err", err)
				(&Problem{Status: http.StatusBadGateway, Message: "the provider did not answer"}).Write(w, p)
			},
			ErrorLog: slog.NewLogLogger(o.Logger.Handler(), slog.LevelWarn),
		}
	}
	return h
}

type handler struct {
	o       HandlerOptions
	proxies map[Provider]*httputil.ReverseProxy
}

// credentialHeaders are the headers a caller's credential may come in,
// and provider headers that pick an account, project or organization
// of the platform's key: none reaches a provider from a caller.
var credentialHeaders = []string{"Authorization", "Proxy-Authorization", "X-Api-Key", "Api-Key", "X-Goog-Api-Key", "Cookie",
	"Openai-Organization", "Openai-Project", "Anthropic-Organization", "X-Goog-User-Project"}

// credentialParams are the query parameters a credential may come in,
// in any case: none is forwarded.
var credentialParams = []string{"key", "api_key", "apikey", "api-key", "access_token"}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	api, _, ok := RouteExact(r.Method, r.URL.Path)
	if ok && r.URL.RawPath != "" {
		ok = false // escapes in the path: not a path the providers' SDKs send
	}
	if !ok {
		if h.o.Next != nil {
			h.o.Next.ServeHTTP(w, r)
			return
		}
		(&Problem{Status: http.StatusNotFound, Message: "no LLM endpoint at " + r.Method + " " + r.URL.Path}).Write(w, OpenAI)
		return
	}
	provider := api.Provider()
	proxy, ok := h.proxies[provider]
	if !ok {
		(&Problem{Status: http.StatusNotFound, Message: "this proxy forwards no " + provider.String() + " calls"}).Write(w, provider)
		return
	}
	// Gemini's SDKs send their key as x-goog-api-key or ?key=: the same
	// credential, read where httplimit reads API keys.
	if k := r.Header.Get("X-Goog-Api-Key"); k != "" && r.Header.Get("X-Api-Key") == "" {
		r.Header.Set("X-Api-Key", k)
	}
	if k := r.URL.Query().Get("key"); k != "" && r.Header.Get("X-Api-Key") == "" {
		r.Header.Set("X-Api-Key", k)
	}
	var who policy.Request
	if err := h.o.Identify(r, &who); err != nil {
		problemOf(err).Write(w, provider)
		return
	}
	proxy.ServeHTTP(w, r.WithContext(WithWho(r.Context(), who)))
}

// rewrite points a call at its provider with the platform's key.
func (h *handler) rewrite(pr *httputil.ProxyRequest) {
	api, _, _ := Route(pr.In.Method, pr.In.URL.Path)
	provider := api.Provider()
	up := h.o.Upstreams[provider]
	path := pr.In.URL.Path
	if strings.HasSuffix(strings.TrimRight(up.BaseURL.Path, "/"), "/v1") {
		path = strings.TrimPrefix(path, "/v1") // OpenAI's base URL ends in /v1
	}
	out := pr.Out
	out.URL.Scheme, out.URL.Host = up.BaseURL.Scheme, up.BaseURL.Host
	out.URL.Path = strings.TrimRight(up.BaseURL.Path, "/") + path
	out.URL.RawPath = ""
	q := out.URL.Query()
	for name := range q {
		for _, c := range credentialParams {
			if strings.EqualFold(name, c) {
				q.Del(name)
			}
		}
	}
	out.URL.RawQuery = q.Encode()
	out.Host = ""
	for _, name := range credentialHeaders {
		out.Header.Del(name)
	}
	switch provider {
	case OpenAI:
		out.Header.Set("Authorization", "Bearer "+up.APIKey)
	case Anthropic:
		out.Header.Set("X-Api-Key", up.APIKey)
	case Gemini:
		out.Header.Set("X-Goog-Api-Key", up.APIKey)
	}
}
