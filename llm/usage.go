package llm

import (
	"bytes"
	"encoding/json"

	"github.com/admitdev/admit/units"
)

// usageJSON holds every provider's usage fields; which apply depends on
// the API (see tokens).
type usageJSON struct {
	// OpenAI chat completions, completions, embeddings.
	PromptTokens        *int64 `json:"prompt_tokens"`
	CompletionTokens    *int64 `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
		AudioTokens  int64 `json:"audio_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
		AudioTokens     int64 `json:"audio_tokens"`
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
	// Anthropic's cache writes by how long they are kept, its server
	// tools' uses and the tier it served the call at.
	CacheCreation *struct {
		Ephemeral1h int64 `json:"ephemeral_1h_input_tokens"`
	} `json:"cache_creation"`
	ServerToolUse *struct {
		WebSearchRequests int64 `json:"web_search_requests"`
	} `json:"server_tool_use"`
	ServiceTier string `json:"service_tier"`
}

// geminiUsage is Gemini's usageMetadata: running totals in a stream.
type geminiUsage struct {
	PromptTokenCount        int64 `json:"promptTokenCount"`
	CachedContentTokenCount int64 `json:"cachedContentTokenCount"`
	CandidatesTokenCount    int64 `json:"candidatesTokenCount"`
	ThoughtsTokenCount      int64 `json:"thoughtsTokenCount"`
	ToolUsePromptTokenCount int64 `json:"toolUsePromptTokenCount"`
	// The prompt's and the answer's counts by modality, of which audio
	// is priced apart.
	PromptTokensDetails     []geminiModality `json:"promptTokensDetails"`
	CandidatesTokensDetails []geminiModality `json:"candidatesTokensDetails"`
}

type geminiModality struct {
	Modality   string `json:"modality"`
	TokenCount int64  `json:"tokenCount"`
}

// audio returns the tokens of the AUDIO modality in d.
func audio(d []geminiModality) int64 {
	var n int64
	for _, m := range d {
		if m.Modality == "AUDIO" {
			n += max(m.TokenCount, 0)
		}
	}
	return n
}

func (g *geminiUsage) tokens() units.Tokens {
	var t units.Tokens
	t[units.CachedInput] = g.CachedContentTokenCount
	fresh := max(g.PromptTokenCount+g.ToolUsePromptTokenCount-g.CachedContentTokenCount, 0)
	t[units.AudioInput] = min(audio(g.PromptTokensDetails), fresh)
	t[units.Input] = fresh - t[units.AudioInput]
	t[units.AudioOutput] = min(audio(g.CandidatesTokensDetails), max(g.CandidatesTokenCount, 0))
	t[units.Output] = g.CandidatesTokenCount - t[units.AudioOutput]
	t[units.Reasoning] = g.ThoughtsTokenCount
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
func (u *usageJSON) openAITokens() units.Tokens {
	var t units.Tokens
	in, out := val(u.PromptTokens), val(u.CompletionTokens)
	if u.InputTokens != nil || u.OutputTokens != nil {
		in, out = val(u.InputTokens), val(u.OutputTokens)
	}
	var cached, reasoning, audioIn, audioOut int64
	if d := u.PromptTokensDetails; d != nil {
		cached, audioIn = d.CachedTokens, d.AudioTokens
	}
	if d := u.InputTokensDetails; d != nil {
		cached = d.CachedTokens
	}
	if d := u.CompletionTokensDetails; d != nil {
		reasoning, audioOut = d.ReasoningTokens, d.AudioTokens
	}
	if d := u.OutputTokensDetails; d != nil {
		reasoning = d.ReasoningTokens
	}
	// Each part at most what is left of its whole: a report whose parts
	// exceed it charges the whole, never more.
	t[units.CachedInput] = min(max(cached, 0), in)
	t[units.AudioInput] = min(max(audioIn, 0), in-t[units.CachedInput])
	t[units.Input] = in - t[units.CachedInput] - t[units.AudioInput]
	t[units.Reasoning] = min(max(reasoning, 0), out)
	t[units.AudioOutput] = min(max(audioOut, 0), out-t[units.Reasoning])
	t[units.Output] = out - t[units.Reasoning] - t[units.AudioOutput]
	return t
}

// anthropicTokens reads Anthropic's usage: input_tokens excludes the
// cache's reads and writes, which it counts apart.
func (u *usageJSON) anthropicTokens() units.Tokens {
	var t units.Tokens
	t[units.Input] = val(u.InputTokens)
	t[units.CachedInput] = val(u.CacheReadInputTokens)
	u.cacheWrites(&t)
	t[units.Output] = val(u.OutputTokens)
	if u.ServerToolUse != nil {
		t[units.WebSearch] = u.ServerToolUse.WebSearchRequests
	}
	return t
}

// cacheWrites sets t's cache writes from Anthropic's usage: all of them,
// of which those kept an hour are priced apart.
func (u *usageJSON) cacheWrites(t *units.Tokens) {
	all := val(u.CacheCreationInputTokens)
	var long int64
	if u.CacheCreation != nil {
		long = u.CacheCreation.Ephemeral1h
	}
	// An hour's writes reported beyond the total are all there is.
	long = max(long, 0)
	all = max(all, long)
	t[units.CacheWriteLong] = long
	t[units.CacheWrite] = all - long
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
		Usage       *usageJSON `json:"usage"`
		ServiceTier string     `json:"service_tier"`
	} `json:"response"`
	// ServiceTier is the tier OpenAI served a chat completion at.
	ServiceTier string `json:"service_tier"`
	// Choices is read only for whether it is empty: OpenAI's usage-only
	// chunk.
	Choices *[]json.RawMessage `json:"choices"`
	// Candidates are read for whether one finished: Gemini's last chunk.
	Candidates []struct {
		FinishReason string `json:"finishReason"`
	} `json:"candidates"`
}

// meter reads the usage of one response, event by event. It keeps only
// counts: its memory does not grow with the response.
type meter struct {
	api API
	// usage is the latest report; input and output say which halves
	// were reported (an Anthropic stream reports input first, output
	// last).
	usage         units.Tokens
	input, output bool
	// tier is the service tier the provider reported, if it did.
	tier string
	// finished says a Gemini answer's candidate said why it ended: its
	// stream's last chunk, whose running totals are the final ones.
	finished bool
}

// reported says whether the response reported its usage.
func (m *meter) reported() bool { return m.input || m.output }

// runningOutput is the output a stream's running totals report so far
// (Gemini's, Anthropic's cumulative count): 0 for a stream that reports
// its usage at its end only.
func (m *meter) runningOutput() int64 {
	if !m.output {
		return 0
	}
	return m.usage[units.Output] + m.usage[units.AudioOutput]
}

// complete says whether the response reported its whole usage: input and
// output, and for a Gemini stream, whose every chunk carries running
// totals, the chunk that says why it finished.
func (m *meter) complete() bool {
	return m.input && m.output && (m.api != StreamGenerateContent || m.finished)
}

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

// anthropicTier notes the service tier Anthropic's usage names.
func (m *meter) anthropicTier(u *usageJSON) {
	if u.ServiceTier != "" {
		m.tier = u.ServiceTier
	}
}

// observeEvent is observe of a decoded event.
func (m *meter) observeEvent(ev *event) (usageChunk bool) {
	switch m.api.Provider() {
	case OpenAI:
		u := ev.Usage
		if ev.ServiceTier != "" {
			m.tier = ev.ServiceTier
		}
		if ev.Response != nil && ev.Response.Usage != nil {
			u = ev.Response.Usage // response.completed, .incomplete, .failed
			if ev.Response.ServiceTier != "" {
				m.tier = ev.Response.ServiceTier
			}
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
			m.anthropicTier(ev.Message.Usage)
		case ev.Type == "message_delta" && ev.Usage != nil:
			// Cumulative: the latest replaces, never adds to, the
			// output; input counts, when present, replace too.
			u := ev.Usage
			m.usage[units.Output], m.output = val(u.OutputTokens), true
			if u.InputTokens != nil {
				m.usage[units.Input] = *u.InputTokens
			}
			if u.CacheReadInputTokens != nil {
				m.usage[units.CachedInput] = *u.CacheReadInputTokens
			}
			if u.CacheCreationInputTokens != nil || u.CacheCreation != nil {
				u.cacheWrites(&m.usage)
			}
			if u.ServerToolUse != nil {
				m.usage[units.WebSearch] = u.ServerToolUse.WebSearchRequests
			}
			m.anthropicTier(u)
		case ev.Usage != nil && ev.Type != "message_delta": // a whole message
			m.usage, m.input, m.output = ev.Usage.anthropicTokens(), true, true
			m.anthropicTier(ev.Usage)
		}
	case Gemini:
		// Running totals: a chunk that carries them replaces the last;
		// one without them changes nothing.
		if ev.UsageMetadata != nil {
			m.usage, m.input, m.output = ev.UsageMetadata.tokens(), true, true
		}
		for _, c := range ev.Candidates {
			m.finished = m.finished || c.FinishReason != ""
		}
	}
	return usageChunk
}
