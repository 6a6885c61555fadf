package llm

import (
	"bytes"
	"encoding/json"

	"github.com/admitdev/admit/policy"
)

// usageJSON holds every provider's usage fields; which apply depends on
// the API (see tokens).
type usageJSON struct {
	// OpenAI chat completions, completions, embeddings.
	PromptTokens        *int64 `json:"prompt_tokens"`
	CompletionTokens    *int64 `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
	// OpenAI Responses and Anthropic.
	InputTokens        *int64 `json:"input_tokens"`
	OutputTokens       *int64 `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
}

// geminiUsage is Gemini's usageMetadata: running totals in a stream.
type geminiUsage struct {
	PromptTokenCount        int64 `json:"promptTokenCount"`
	CachedContentTokenCount int64 `json:"cachedContentTokenCount"`
	CandidatesTokenCount    int64 `json:"candidatesTokenCount"`
	ThoughtsTokenCount      int64 `json:"thoughtsTokenCount"`
	ToolUsePromptTokenCount int64 `json:"toolUsePromptTokenCount"`
}

func (g *geminiUsage) tokens() policy.Tokens {
	var t policy.Tokens
	t[policy.CachedInput] = g.CachedContentTokenCount
	t[policy.Input] = max(g.PromptTokenCount+g.ToolUsePromptTokenCount-g.CachedContentTokenCount, 0)
	t[policy.Output] = g.CandidatesTokenCount
	t[policy.Reasoning] = g.ThoughtsTokenCount
	return t
}

func val(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// openAITokens reads OpenAI's usage, chat completions' or Responses'
// names: prompt and completion counts include their cached and reasoning
// parts, which Tokens keeps apart.
func (u *usageJSON) openAITokens() policy.Tokens {
	var t policy.Tokens
	in, out := val(u.PromptTokens), val(u.CompletionTokens)
	if u.InputTokens != nil || u.OutputTokens != nil {
		in, out = val(u.InputTokens), val(u.OutputTokens)
	}
	var cached, reasoning int64
	if d := u.PromptTokensDetails; d != nil {
		cached = d.CachedTokens
	}
	if d := u.InputTokensDetails; d != nil {
		cached = d.CachedTokens
	}
	if d := u.CompletionTokensDetails; d != nil {
		reasoning = d.ReasoningTokens
	}
	if d := u.OutputTokensDetails; d != nil {
		reasoning = d.ReasoningTokens
	}
	t[policy.CachedInput] = min(cached, in)
	t[policy.Input] = in - t[policy.CachedInput]
	t[policy.Reasoning] = min(reasoning, out)
	t[policy.Output] = out - t[policy.Reasoning]
	return t
}

// anthropicTokens reads Anthropic's usage: input_tokens excludes the
// cache's reads and writes, which it counts apart.
func (u *usageJSON) anthropicTokens() policy.Tokens {
	var t policy.Tokens
	t[policy.Input] = val(u.InputTokens)
	t[policy.CachedInput] = val(u.CacheReadInputTokens)
	t[policy.CacheWrite] = val(u.CacheCreationInputTokens)
	t[policy.Output] = val(u.OutputTokens)
	return t
}

// event is one JSON response or stream event, with the fields of every
// API that carry usage.
type event struct {
	Type          string       `json:"type"`
	Usage         *usageJSON   `json:"usage"`
	UsageMetadata *geminiUsage `json:"usageMetadata"`
	Message       *struct {
		Usage *usageJSON `json:"usage"`
	} `json:"message"`
	Response *struct {
		Usage *usageJSON `json:"usage"`
	} `json:"response"`
	// Choices is read only for whether it is empty: OpenAI's usage-only
	// chunk.
	Choices *[]json.RawMessage `json:"choices"`
}

// meter reads the usage of one response, event by event. It keeps only
// counts: its memory does not grow with the response.
type meter struct {
	api API
	// usage is the latest report; input and output say which halves
	// were reported (an Anthropic stream reports input first, output
	// last).
	usage         policy.Tokens
	input, output bool
}

// reported says whether the response reported its usage.
func (m *meter) reported() bool { return m.input || m.output }

// observe reads one JSON document: a whole response body, or the data of
// one stream event. It reports whether the event is an OpenAI usage-only
// chunk (empty choices, usage set), which a stream that did not ask for
// its usage must not see.
func (m *meter) observe(data []byte) (usageChunk bool) {
	if !hasObject(data, `"usage"`) && !hasObject(data, `"usageMetadata"`) && !bytes.Contains(data, []byte(`"message_start"`)) {
		// A content event, the bulk of a stream: not decoded, so that a
		// long stream makes no garbage.
		return false
	}
	var ev event
	if json.Unmarshal(data, &ev) != nil {
		return false
	}
	return m.observeEvent(&ev)
}

// hasObject reports whether key (quoted) in data has an object value.
func hasObject(data []byte, key string) bool {
	for rest := data; ; {
		i := bytes.Index(rest, []byte(key))
		if i < 0 {
			return false
		}
		rest = rest[i+len(key):]
		if v := skipColon(rest); v >= 0 && rest[v] == '{' {
			return true
		}
	}
}

// skipColon returns the index of the value after a key's colon in b, or
// -1 when b does not start with one.
func skipColon(b []byte) int {
	colon := false
	for i, c := range b {
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
		case c == ':' && !colon:
			colon = true
		case colon:
			return i
		default:
			return -1
		}
	}
	return -1
}

// observeEvent is observe of a decoded event.
func (m *meter) observeEvent(ev *event) (usageChunk bool) {
	switch m.api.Provider() {
	case OpenAI:
		u := ev.Usage
		if ev.Response != nil && ev.Response.Usage != nil {
			u = ev.Response.Usage // response.completed, .incomplete, .failed
		}
		if u != nil {
			m.usage, m.input, m.output = u.openAITokens(), true, true
			usageChunk = ev.Choices != nil && len(*ev.Choices) == 0
		}
	case Anthropic:
		switch {
		case ev.Type == "message_start" && ev.Message != nil && ev.Message.Usage != nil:
			// Input and cache counts; output so far (usually 1).
			m.usage, m.input = ev.Message.Usage.anthropicTokens(), true
		case ev.Type == "message_delta" && ev.Usage != nil:
			// Cumulative: the latest replaces, never adds to, the
			// output; input counts, when present, replace too.
			u := ev.Usage
			m.usage[policy.Output], m.output = val(u.OutputTokens), true
			if u.InputTokens != nil {
				m.usage[policy.Input] = *u.InputTokens
			}
			if u.CacheReadInputTokens != nil {
				m.usage[policy.CachedInput] = *u.CacheReadInputTokens
			}
			if u.CacheCreationInputTokens != nil {
				m.usage[policy.CacheWrite] = *u.CacheCreationInputTokens
			}
		case ev.Usage != nil && ev.Type != "message_delta": // a whole message
			m.usage, m.input, m.output = ev.Usage.anthropicTokens(), true, true
		}
	case Gemini:
		// Running totals: a chunk that carries them replaces the last;
		// one without them changes nothing.
		if ev.UsageMetadata != nil {
			m.usage, m.input, m.output = ev.UsageMetadata.tokens(), true, true
		}
	}
	return usageChunk
}
