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
// API that carry usage or output.
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
	Choices *[]struct {
		Delta *struct {
			Content   string `json:"content"`
			Reasoning string `json:"reasoning_content"`
			ToolCalls []struct {
				Function struct {
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		Text string `json:"text"`
	} `json:"choices"`
	Delta *struct {
		Text        string `json:"text"`
		Thinking    string `json:"thinking"`
		PartialJSON string `json:"partial_json"`
	} `json:"delta"`
	Candidates []struct {
		Content struct {
			Parts []struct {
				Text string `json:"text"`
			} `json:"parts"`
		} `json:"content"`
	} `json:"candidates"`
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
	// relayed counts the output bytes and content events passed on, for
	// a stream the client left before its usage came.
	relayedBytes, relayedEvents int64
}

// reported says whether the response reported its usage.
func (m *meter) reported() bool { return m.input || m.output }

// observe reads one JSON document: a whole response body, or the data of
// one stream event. It reports whether the event is an OpenAI usage-only
// chunk (empty choices, usage set), which a stream that did not ask for
// its usage must not see.
func (m *meter) observe(data []byte) (usageChunk bool) {
	if !hasObject(data, `"usage"`) && !hasObject(data, `"usageMetadata"`) && !bytes.Contains(data, []byte(`"message_start"`)) {
		// A content event, the bulk of a stream: its text is measured
		// where it lies, without decoding, so that a long stream makes
		// no garbage.
		m.relay(textBytes(data))
		return false
	}
	var ev event
	if json.Unmarshal(data, &ev) != nil {
		return false
	}
	return m.observeEvent(&ev, data)
}

// textKeys are the keys of the output text in the APIs' stream events.
var textKeys = [...][]byte{[]byte(`"content"`), []byte(`"text"`), []byte(`"delta"`), []byte(`"thinking"`),
	[]byte(`"partial_json"`), []byte(`"arguments"`), []byte(`"reasoning_content"`)}

// textBytes sums the lengths of the string values of textKeys in data.
func textBytes(data []byte) int {
	n := 0
	for _, key := range textKeys {
		for rest := data; ; {
			i := bytes.Index(rest, key)
			if i < 0 {
				break
			}
			rest = rest[i+len(key):]
			v := skipColon(rest)
			if v < 0 || rest[v] != '"' {
				continue
			}
			end := stringEnd(rest, v)
			n += end - v - 1
			rest = rest[end:]
		}
	}
	return n
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

// observeEvent is observe of a decoded event; data, its JSON, is read
// again only for Responses' text deltas (nil: none).
func (m *meter) observeEvent(ev *event, data []byte) (usageChunk bool) {
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
		if ev.Choices != nil {
			for _, c := range *ev.Choices {
				n := len(c.Text)
				if d := c.Delta; d != nil {
					n += len(d.Content) + len(d.Reasoning)
					for _, tc := range d.ToolCalls {
						n += len(tc.Function.Arguments)
					}
				}
				m.relay(n)
			}
		}
		if data != nil && (ev.Type == "response.output_text.delta" || ev.Type == "response.reasoning_text.delta" || ev.Type == "response.function_call_arguments.delta") {
			var d struct {
				Delta string `json:"delta"`
			}
			_ = json.Unmarshal(data, &d)
			m.relay(len(d.Delta))
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
		case ev.Type == "content_block_delta" && ev.Delta != nil:
			m.relay(len(ev.Delta.Text) + len(ev.Delta.Thinking) + len(ev.Delta.PartialJSON))
		}
	case Gemini:
		// Running totals: a chunk that carries them replaces the last;
		// one without them changes nothing.
		if ev.UsageMetadata != nil {
			m.usage, m.input, m.output = ev.UsageMetadata.tokens(), true, true
		}
		for _, c := range ev.Candidates {
			n := 0
			for _, p := range c.Content.Parts {
				n += len(p.Text)
			}
			m.relay(n)
		}
	}
	return usageChunk
}

func (m *meter) relay(n int) {
	if n > 0 {
		m.relayedBytes += int64(n)
		m.relayedEvents++
	}
}

// relayedOutput estimates the output tokens passed on so far: a content
// event carries about one token, and a token about four bytes of text.
func (m *meter) relayedOutput() int64 {
	return max(m.relayedEvents, (m.relayedBytes+3)/4)
}
