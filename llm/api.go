// Package llm puts token and money budgets in front of LLM APIs: OpenAI
// (and every server that speaks its API), Anthropic and Gemini. A Gate
// reserves, before a call goes out, the most it can cost at every level a
// policy's rules name, all or nothing with the request rules; it reads the
// usage the provider reports, streams included, and settles to it: the
// unused part is refunded, any excess charged. admit proxy forwards
// tenants' calls through it (Handler); Go programs that call a provider's
// SDK themselves put it in their client (Middleware, Transport).
package llm

import (
	"net/http"
	"strings"
)

// Provider is an LLM provider's API family.
type Provider uint8

// The providers.
const (
	OpenAI Provider = iota + 1
	Anthropic
	Gemini
)

// String returns the provider's configuration name.
func (p Provider) String() string {
	switch p {
	case OpenAI:
		return "openai"
	case Anthropic:
		return "anthropic"
	case Gemini:
		return "gemini"
	}
	return "unknown"
}

// API is one endpoint of a provider: what its requests and responses look
// like.
type API uint8

// The endpoints Admit meters.
const (
	ChatCompletions       API = iota + 1 // OpenAI POST /v1/chat/completions
	Responses                            // OpenAI POST /v1/responses
	Completions                          // OpenAI POST /v1/completions
	Embeddings                           // OpenAI POST /v1/embeddings
	Messages                             // Anthropic POST /v1/messages
	GenerateContent                      // Gemini POST /v1beta/models/{model}:generateContent
	StreamGenerateContent                // Gemini POST /v1beta/models/{model}:streamGenerateContent
)

// Provider returns the provider of a.
func (a API) Provider() Provider {
	switch a {
	case Messages:
		return Anthropic
	case GenerateContent, StreamGenerateContent:
		return Gemini
	case 0:
		return 0
	}
	return OpenAI
}

// String returns the endpoint's name.
func (a API) String() string {
	switch a {
	case ChatCompletions:
		return "chat.completions"
	case Responses:
		return "responses"
	case Completions:
		return "completions"
	case Embeddings:
		return "embeddings"
	case Messages:
		return "messages"
	case GenerateContent:
		return "generateContent"
	case StreamGenerateContent:
		return "streamGenerateContent"
	}
	return "unknown"
}

// Route finds the metered endpoint of a request by its method and path,
// and for Gemini the model the path names. Paths are matched by their
// end, so that a base URL with a prefix of its own (a gateway's, an
// OpenAI-compatible server's) still routes. ok is false for any other
// request: those are not LLM calls Admit meters.
func Route(method, path string) (api API, model string, ok bool) {
	if method != http.MethodPost {
		return 0, "", false
	}
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return ChatCompletions, "", true
	case strings.HasSuffix(path, "/responses"):
		return Responses, "", true
	case strings.HasSuffix(path, "/completions"):
		return Completions, "", true
	case strings.HasSuffix(path, "/embeddings"):
		return Embeddings, "", true
	case strings.HasSuffix(path, "/v1/messages"):
		return Messages, "", true
	}
	i := strings.LastIndex(path, "/models/")
	if i < 0 {
		return 0, "", false
	}
	m, method, found := strings.Cut(path[i+len("/models/"):], ":")
	if !found || m == "" || strings.Contains(m, "/") {
		return 0, "", false
	}
	return geminiMethod(method, m)
}

// geminiMethod is the API of a Gemini model path's method.
func geminiMethod(method, model string) (API, string, bool) {
	switch method {
	case "generateContent":
		return GenerateContent, model, true
	case "streamGenerateContent":
		return StreamGenerateContent, model, true
	}
	return 0, "", false
}

// RouteExact is Route for paths a caller Admit does not trust sends: the
// providers' own paths exactly (OpenAI's and Anthropic's under /v1,
// Gemini's under /v1beta or /v1, a model name of letters, digits and
// . _ -), so that no crafted path (dot segments, a prefix of another
// endpoint) passes as a metered call and reaches the provider with the
// platform's key.
func RouteExact(method, path string) (api API, model string, ok bool) {
	if method != http.MethodPost {
		return 0, "", false
	}
	switch path {
	case "/v1/chat/completions":
		return ChatCompletions, "", true
	case "/v1/responses":
		return Responses, "", true
	case "/v1/completions":
		return Completions, "", true
	case "/v1/embeddings":
		return Embeddings, "", true
	case "/v1/messages":
		return Messages, "", true
	}
	rest, found := strings.CutPrefix(path, "/v1beta/models/")
	if !found {
		rest, found = strings.CutPrefix(path, "/v1/models/")
	}
	if !found {
		return 0, "", false
	}
	m, method, _ := strings.Cut(rest, ":")
	if m == "" || len(m) > 256 || strings.Trim(m, ".") == "" {
		return 0, "", false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return 0, "", false
		}
	}
	return geminiMethod(method, m)
}
