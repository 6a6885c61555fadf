// Package llmtest is a stand-in for the LLM providers' APIs, for tests and
// benchmarks: OpenAI's chat completions, completions, Responses and
// embeddings, Anthropic's messages and Gemini's generateContent and
// streamGenerateContent, in their documented JSON and server-sent event
// formats. It answers with as many output tokens as it is told to, never
// more than the request's maximum, as the real APIs do, and reports its
// usage as each provider does (Anthropic's output count cumulative,
// Gemini's running totals).
package llmtest

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/units"
)

// Upstream is the stand-in. Its fields may be set before it serves;
// Calls and Last are safe to read meanwhile.
type Upstream struct {
	// Output is how many output tokens an answer has when the request's
	// maximum allows it (default 50); each is one word, and one stream
	// event.
	Output int64
	// Cached and Reasoning are the input tokens reported as read from the
	// cache and the output tokens reported as reasoning.
	Cached, Reasoning int64
	// CacheWrite is what Anthropic reports as written to its cache for 5
	// minutes, CacheWrite1h for an hour.
	CacheWrite, CacheWrite1h int64
	// AudioIn is the audio part of the input, reported by OpenAI's chat
	// completions and Gemini; AudioOut the audio answer, made when the
	// request asks for audio (OpenAI's modalities, Gemini's
	// responseModalities).
	AudioIn, AudioOut int64
	// WebSearches is how many web searches Anthropic reports it ran, when
	// the request has a web search tool.
	WebSearches int64
	// Spaced writes stream events' JSON with a space after each colon and
	// comma, as some servers (Python's json.dumps) do.
	Spaced bool
	// IgnoreMax makes Output tokens whatever the request's maximum, as a
	// server that does not honour it would.
	IgnoreMax bool
	// ServiceTier, if set, is the tier every answer reports it was served
	// at; else the tier the request asks for, if a tier a provider
	// reports (priority, flex), else the provider's default.
	ServiceTier string
	// NoUsage answers without any usage.
	NoUsage bool
	// Gzip compresses the answers of clients that accept it.
	Gzip bool
	// Fail, if set, is the status of every answer: an error without usage,
	// whose body is FailBody when set.
	Fail     int
	FailBody string
	// Header is added to every answer, as a provider adds its account's
	// organization, rate limits and cookies.
	Header http.Header
	// Hold, if set, is read before each stream event after the first
	// ones: a test paces a stream with it, or stops it.
	Hold chan struct{}
	// Padding adds this many bytes of text to every stream event's
	// content, for large streams.
	Padding int
	// HoldAnswer, if set, is read before a non-streamed answer is
	// written: a test keeps the answer back until its client has left.
	// The answer is made all the same, as a provider finishes (and
	// bills) a call whose client went away.
	HoldAnswer chan struct{}

	calls  atomic.Int64
	billed atomic.Int64
	mu     sync.Mutex
	last   *http.Request
	body   []byte
	// Cancelled counts streams whose client went away.
	Cancelled atomic.Int64
}

// Calls returns how many calls reached the stand-in.
func (u *Upstream) Calls() int64 { return u.calls.Load() }

// Billed returns the tokens the stand-in billed, as a provider bills
// them: every call it received in full, its input and every token it
// generates (reasoning included), whether or not its client stays for the
// answer: a provider finishes a non-streamed answer whose client left,
// and reasoning is made before the first token a client sees. (A
// provider may bill a stream cut short for less; never for more.)
// Errors bill nothing.
func (u *Upstream) Billed() int64 { return u.billed.Load() }

// Last returns the last call's request (headers, URL) and body.
func (u *Upstream) Last() (*http.Request, []byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last, u.body
}

// InputTokens is what the stand-in reports as a request's input tokens, a
// model of a real tokenizer's count: one token per 4 bytes of each text
// (every string but the model and roles), rounded up, one per token id
// (an integer of an input or prompt given as token ids), plus 3 per
// object for the framing of messages and parts, plus 3.
func InputTokens(body []byte) int64 {
	var v any
	_ = json.Unmarshal(body, &v)
	n := int64(3)
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch x := v.(type) {
		case map[string]any:
			n += 3
			for k, e := range x {
				walk(k, e)
			}
		case []any:
			for _, e := range x {
				walk(key, e)
			}
		case string:
			if key != "model" && key != "role" && key != "type" {
				n += (int64(len(x)) + 3) / 4
			}
		case float64:
			if key == "input" || key == "prompt" {
				n++
			}
		}
	}
	if m, ok := v.(map[string]any); ok {
		for k, e := range m { // the request object itself is no message
			walk(k, e)
		}
	}
	return n
}

func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.last, u.body = r.Clone(r.Context()), body
	u.mu.Unlock()
	var req map[string]any
	if json.Unmarshal(body, &req) != nil {
		http.Error(w, `{"error":{"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	for k, vs := range u.Header {
		w.Header()[k] = append([]string(nil), vs...)
	}
	if u.Fail != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(u.Fail)
		body := u.FailBody
		if body == "" {
			body = `{"error":{"message":"stand-in failure","type":"server_error"}}`
		}
		_, _ = io.WriteString(w, body)
		return
	}
	var out io.Writer = w
	if u.Gzip && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		defer gz.Close()
		out = &flushWriter{gz: gz, w: w}
	}
	s := &answer{u: u, w: w, out: out, r: r, req: req, in: InputTokens(body)}
	p := r.URL.Path
	switch {
	case strings.HasSuffix(p, "/chat/completions"):
		s.chat(false)
	case strings.HasSuffix(p, "/completions"):
		s.chat(true)
	case strings.HasSuffix(p, "/responses"):
		s.responses()
	case strings.HasSuffix(p, "/embeddings"):
		s.embeddings()
	case strings.HasSuffix(p, "/messages"):
		s.messages()
	case strings.HasSuffix(p, ":generateContent"):
		s.gemini(false)
	case strings.HasSuffix(p, ":streamGenerateContent"):
		s.gemini(true)
	default:
		http.NotFound(w, r)
	}
}

// flushWriter flushes the gzip stream and the response after each write,
// so that compressed events still arrive one by one.
type flushWriter struct {
	gz *gzip.Writer
	w  http.ResponseWriter
}

func (f *flushWriter) Write(p []byte) (int, error) {
	n, err := f.gz.Write(p)
	_ = f.gz.Flush()
	return n, err
}

type answer struct {
	u   *Upstream
	w   http.ResponseWriter
	out io.Writer
	r   *http.Request
	req map[string]any
	in  int64
}

func (s *answer) num(keys ...string) int64 {
	m := s.req
	for i, k := range keys {
		if i == len(keys)-1 {
			if v, ok := m[k].(float64); ok {
				return int64(v)
			}
			return 0
		}
		m, _ = m[k].(map[string]any)
	}
	return 0
}

// outputTokens is the answer's length: Output, at most the maximum.
func (s *answer) outputTokens(max int64) int64 {
	n := s.u.Output
	if n == 0 {
		n = 50
	}
	if max > 0 && n > max && !s.u.IgnoreMax {
		n = max
	}
	return n
}

func (s *answer) json(v any) {
	if s.u.HoldAnswer != nil {
		<-s.u.HoldAnswer
	}
	s.w.Header().Set("Content-Type", "application/json")
	b, _ := json.Marshal(v)
	_, _ = s.out.Write(b)
}

// event writes one server-sent event; false when the client is gone.
func (s *answer) event(name string, v any, i int64) bool {
	if i > 1 && s.u.Hold != nil {
		select {
		case _, ok := <-s.u.Hold:
			if !ok {
				return false
			}
		case <-s.r.Context().Done():
			s.u.Cancelled.Add(1)
			return false
		}
	}
	var b strings.Builder
	if name != "" {
		b.WriteString("event: " + name + "\n")
	}
	if raw, ok := v.(string); ok {
		b.WriteString("data: " + raw + "\n\n")
	} else {
		j, _ := json.Marshal(v)
		if s.u.Spaced {
			j = bytes.ReplaceAll(bytes.ReplaceAll(j, []byte(`":`), []byte(`": `)), []byte(`,"`), []byte(`, "`))
		}
		b.WriteString("data: " + string(j) + "\n\n")
	}
	if _, err := io.WriteString(s.out, b.String()); err != nil {
		s.u.Cancelled.Add(1)
		return false
	}
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
	return s.r.Context().Err() == nil
}

func (s *answer) startStream() {
	s.w.Header().Set("Content-Type", "text/event-stream")
	s.w.WriteHeader(http.StatusOK)
}

func (s *answer) word() string { return "tok " + strings.Repeat("x", s.u.Padding) }

// tier is the service tier the answer reports; def the provider's
// default.
func (s *answer) tier(def string) string {
	if s.u.ServiceTier != "" {
		return s.u.ServiceTier
	}
	if t, _ := s.req["service_tier"].(string); t == "priority" || t == "flex" {
		return t
	}
	return def
}

// audioOut is the audio answer's tokens: AudioOut when the request asks
// for audio, else 0.
func (s *answer) audioOut() int64 {
	asks := false
	if mods, ok := s.req["modalities"].([]any); ok {
		for _, m := range mods {
			asks = asks || m == "audio"
		}
	}
	if gc, ok := s.req["generationConfig"].(map[string]any); ok {
		if mods, ok := gc["responseModalities"].([]any); ok {
			for _, m := range mods {
				asks = asks || strings.EqualFold(fmt.Sprint(m), "audio")
			}
		}
	}
	if !asks {
		return 0
	}
	return s.u.AudioOut
}

func (s *answer) usage(out int64, openai bool) map[string]any {
	if openai {
		in, ao := s.in+s.u.AudioIn, s.audioOut()
		return map[string]any{
			"prompt_tokens": in, "completion_tokens": out + ao, "total_tokens": in + out + ao,
			"prompt_tokens_details":     map[string]any{"cached_tokens": s.u.Cached, "audio_tokens": s.u.AudioIn},
			"completion_tokens_details": map[string]any{"reasoning_tokens": s.u.Reasoning, "audio_tokens": ao},
		}
	}
	return map[string]any{
		"input_tokens": s.in, "output_tokens": out, "total_tokens": s.in + out,
		"input_tokens_details":  map[string]any{"cached_tokens": s.u.Cached},
		"output_tokens_details": map[string]any{"reasoning_tokens": s.u.Reasoning},
	}
}

func (s *answer) chat(legacy bool) {
	max := s.num("max_completion_tokens")
	if max == 0 {
		max = s.num("max_tokens")
	}
	if legacy && max == 0 {
		max = 16 // the completions API's default
	}
	n := s.num("n")
	if n == 0 {
		n = 1
	}
	// What is billed: a completion generates best_of answers for each
	// of its prompts, and returns n of them.
	billed := n
	if legacy {
		if b := s.num("best_of"); b > n {
			billed = b
		}
		if prompts, ok := s.req["prompt"].([]any); ok && len(prompts) > 0 {
			if _, ids := prompts[0].(float64); !ids {
				billed *= int64(len(prompts))
			}
		}
	}
	out := s.outputTokens(max)
	s.u.billed.Add(s.in + out*billed)
	if !legacy {
		s.u.billed.Add(s.u.AudioIn + s.audioOut())
	}
	object := "chat.completion"
	if legacy {
		object = "text_completion"
	}
	stream, _ := s.req["stream"].(bool)
	if !stream {
		choices := []map[string]any{}
		for i := range n {
			c := map[string]any{"index": i, "finish_reason": "stop", "logprobs": nil}
			text := strings.Repeat(s.word(), int(out))
			if legacy {
				c["text"] = text
			} else {
				c["message"] = map[string]any{"role": "assistant", "content": text, "refusal": nil}
			}
			choices = append(choices, c)
		}
		doc := map[string]any{"id": "cmpl-standin", "object": object, "created": 1, "model": s.req["model"], "choices": choices, "service_tier": s.tier("default")}
		if !s.u.NoUsage {
			doc["usage"] = s.usage(out*billed, true)
		}
		s.json(doc)
		return
	}
	s.startStream()
	opts, _ := s.req["stream_options"].(map[string]any)
	include, _ := opts["include_usage"].(bool)
	chunk := func(choices []map[string]any, usage any) map[string]any {
		return map[string]any{"id": "chatcmpl-standin", "object": object + ".chunk", "created": 1, "model": s.req["model"], "choices": choices, "usage": usage, "service_tier": s.tier("default")}
	}
	i := int64(0)
	for t := range out {
		for c := range n {
			i++
			delta := map[string]any{"index": c, "delta": map[string]any{"content": s.word()}, "finish_reason": nil}
			if t == 0 {
				delta["delta"] = map[string]any{"role": "assistant", "content": s.word()}
			}
			if legacy {
				delta = map[string]any{"index": c, "text": s.word(), "finish_reason": nil}
			}
			if !s.event("", chunk([]map[string]any{delta}, nil), i) {
				return
			}
		}
	}
	if !s.event("", chunk([]map[string]any{{"index": 0, "delta": map[string]any{}, "finish_reason": "stop"}}, nil), 0) {
		return
	}
	if include && !s.u.NoUsage {
		if !s.event("", chunk([]map[string]any{}, s.usage(out*billed, true)), 0) {
			return
		}
	}
	s.event("", "[DONE]", 0)
}

func (s *answer) responses() {
	out := s.outputTokens(s.num("max_output_tokens"))
	s.u.billed.Add(s.in + out)
	resp := func(status string, usage any) map[string]any {
		return map[string]any{"id": "resp_standin", "object": "response", "created_at": 1, "status": status, "model": s.req["model"],
			"output": []any{}, "usage": usage, "service_tier": s.tier("default")}
	}
	final := resp("completed", nil)
	if !s.u.NoUsage {
		final["usage"] = s.usage(out, false)
	}
	final["output"] = []any{map[string]any{"type": "message", "id": "msg_standin", "status": "completed", "role": "assistant",
		"content": []any{map[string]any{"type": "output_text", "text": strings.Repeat(s.word(), int(out)), "annotations": []any{}}}}}
	if stream, _ := s.req["stream"].(bool); !stream {
		s.json(final)
		return
	}
	s.startStream()
	seq := int64(0)
	ev := func(typ string, v map[string]any) bool {
		seq++
		v["type"], v["sequence_number"] = typ, seq
		return s.event(typ, v, seq)
	}
	if !ev("response.created", map[string]any{"response": resp("in_progress", nil)}) {
		return
	}
	for range out {
		if !ev("response.output_text.delta", map[string]any{"item_id": "msg_standin", "output_index": 0, "content_index": 0, "delta": s.word()}) {
			return
		}
	}
	// The text whole again, as the API closes its part and item.
	text := strings.Repeat(s.word(), int(out))
	part := map[string]any{"type": "output_text", "text": text, "annotations": []any{}}
	if !ev("response.output_text.done", map[string]any{"item_id": "msg_standin", "output_index": 0, "content_index": 0, "text": text}) ||
		!ev("response.content_part.done", map[string]any{"item_id": "msg_standin", "output_index": 0, "content_index": 0, "part": part}) ||
		!ev("response.output_item.done", map[string]any{"output_index": 0, "item": map[string]any{"type": "message", "id": "msg_standin", "status": "completed", "role": "assistant", "content": []any{part}}}) {
		return
	}
	ev("response.completed", map[string]any{"response": final})
}

func (s *answer) embeddings() {
	s.u.billed.Add(s.in)
	doc := map[string]any{"object": "list", "model": s.req["model"],
		"data": []any{map[string]any{"object": "embedding", "index": 0, "embedding": []float64{0.1, 0.2, 0.3}}}}
	if !s.u.NoUsage {
		doc["usage"] = map[string]any{"prompt_tokens": s.in, "total_tokens": s.in}
	}
	s.json(doc)
}

func (s *answer) messages() {
	max := s.num("max_tokens")
	if max == 0 {
		s.w.Header().Set("Content-Type", "application/json")
		s.w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(s.out, `{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}`)
		return
	}
	out := s.outputTokens(max)
	s.u.billed.Add(s.in + s.u.Cached + s.u.CacheWrite + s.u.CacheWrite1h + out)
	searches := int64(0)
	if tools, ok := s.req["tools"].([]any); ok {
		for _, t := range tools {
			if m, ok := t.(map[string]any); ok && strings.HasPrefix(fmt.Sprint(m["type"]), "web_search") {
				searches = s.u.WebSearches
			}
		}
	}
	usage := func(o int64) map[string]any {
		return map[string]any{"input_tokens": s.in, "output_tokens": o,
			"cache_read_input_tokens": s.u.Cached, "cache_creation_input_tokens": s.u.CacheWrite + s.u.CacheWrite1h,
			"cache_creation":  map[string]any{"ephemeral_5m_input_tokens": s.u.CacheWrite, "ephemeral_1h_input_tokens": s.u.CacheWrite1h},
			"server_tool_use": map[string]any{"web_search_requests": searches}, "service_tier": s.tier("standard")}
	}
	msg := map[string]any{"id": "msg_standin", "type": "message", "role": "assistant", "model": s.req["model"],
		"content": []any{map[string]any{"type": "text", "text": strings.Repeat(s.word(), int(out))}}, "stop_reason": "end_turn", "stop_sequence": nil}
	if stream, _ := s.req["stream"].(bool); !stream {
		if !s.u.NoUsage {
			msg["usage"] = usage(out)
		}
		s.json(msg)
		return
	}
	s.startStream()
	start := map[string]any{"id": "msg_standin", "type": "message", "role": "assistant", "model": s.req["model"], "content": []any{}, "stop_reason": nil, "stop_sequence": nil}
	if !s.u.NoUsage {
		start["usage"] = usage(1)
	}
	if !s.event("message_start", map[string]any{"type": "message_start", "message": start}, 0) ||
		!s.event("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}}, 0) {
		return
	}
	for i := range out {
		if !s.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": s.word()}}, i+2) {
			return
		}
		if i == out/2 && !s.u.NoUsage {
			// A cumulative count mid-stream, as Anthropic may send:
			// summing it with the last would double count.
			if !s.event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": nil, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": i + 1}}, 0) {
				return
			}
		}
	}
	if !s.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}, 0) {
		return
	}
	delta := map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil}}
	if !s.u.NoUsage {
		delta["usage"] = map[string]any{"output_tokens": out}
	}
	if !s.event("message_delta", delta, 0) {
		return
	}
	s.event("message_stop", map[string]any{"type": "message_stop"}, 0)
}

func (s *answer) gemini(stream bool) {
	out := s.outputTokens(s.num("generationConfig", "maxOutputTokens"))
	ao := s.audioOut()
	s.u.billed.Add(s.in + s.u.AudioIn + out + ao + s.u.Reasoning)
	meta := func(o int64) map[string]any {
		in := s.in + s.u.AudioIn
		return map[string]any{"promptTokenCount": in, "cachedContentTokenCount": s.u.Cached, "candidatesTokenCount": o + ao,
			"thoughtsTokenCount": s.u.Reasoning, "totalTokenCount": in + o + ao + s.u.Reasoning,
			"promptTokensDetails":     []any{map[string]any{"modality": "TEXT", "tokenCount": s.in}, map[string]any{"modality": "AUDIO", "tokenCount": s.u.AudioIn}},
			"candidatesTokensDetails": []any{map[string]any{"modality": "TEXT", "tokenCount": o}, map[string]any{"modality": "AUDIO", "tokenCount": ao}}}
	}
	cand := func(text string, finish string) []any {
		c := map[string]any{"content": map[string]any{"role": "model", "parts": []any{map[string]any{"text": text}}}, "index": 0}
		if finish != "" {
			c["finishReason"] = finish
		}
		return []any{c}
	}
	if !stream {
		doc := map[string]any{"candidates": cand(strings.Repeat(s.word(), int(out)), "STOP"), "modelVersion": "standin"}
		if !s.u.NoUsage {
			doc["usageMetadata"] = meta(out)
		}
		s.json(doc)
		return
	}
	if s.r.URL.Query().Get("alt") != "sse" {
		// Without alt=sse, Gemini streams one JSON array of chunks.
		s.w.Header().Set("Content-Type", "application/json")
		var chunks []any
		for i := range out {
			finish := ""
			if i == out-1 {
				finish = "STOP" // the last chunk says why the answer ended
			}
			doc := map[string]any{"candidates": cand(s.word(), finish), "modelVersion": "standin"}
			if !s.u.NoUsage {
				doc["usageMetadata"] = meta(i + 1)
			}
			chunks = append(chunks, doc)
		}
		b, _ := json.Marshal(chunks)
		_, _ = s.out.Write(b)
		return
	}
	s.startStream()
	for i := range out {
		doc := map[string]any{"candidates": cand(s.word(), ""), "modelVersion": "standin"}
		// Running totals, in every other chunk: a chunk without them
		// changes nothing.
		if !s.u.NoUsage && i%2 == 0 {
			doc["usageMetadata"] = meta(i + 1)
		}
		if i == out-1 {
			doc["candidates"] = cand(s.word(), "STOP")
			if !s.u.NoUsage {
				doc["usageMetadata"] = meta(out)
			}
		}
		if !s.event("", doc, i+1) {
			return
		}
	}
}

// String describes the stand-in's settings, for test logs.
func (u *Upstream) String() string {
	return fmt.Sprintf("llmtest.Upstream{Output: %d, Cached: %d, Reasoning: %d}", u.Output, u.Cached, u.Reasoning)
}

// ListCost is what a call that used t costs at p, computed apart from
// the Gate, as a provider's invoice adds it up: at the rates of the tier
// it was served at (the model's own where p prices no such tier), its
// long-context rates when long, Σ tokens × rate rounded up to a whole
// millionth once per call. Counts and rates must be small enough that
// their products fit an int64.
func ListCost(p *llm.Price, tier string, long bool, t units.Tokens) int64 {
	if tp := p.Tiers[tier]; tp != nil {
		p = tp
	}
	rates := p.Rates
	if long {
		rates = p.LongContext
	}
	var sum int64
	for k, n := range t {
		sum += n * rates[k]
	}
	return (sum + 999_999) / 1_000_000
}

// WAV returns seconds of silence as 16 kHz 16-bit mono PCM WAV, in
// base64: audio input whose duration its header states.
func WAV(seconds int) string {
	data := 32000 * seconds
	h := make([]byte, 44+data)
	copy(h, "RIFF")
	binary.LittleEndian.PutUint32(h[4:], uint32(len(h)-8))
	copy(h[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(h[16:], 16)
	binary.LittleEndian.PutUint16(h[20:], 1)     // PCM
	binary.LittleEndian.PutUint16(h[22:], 1)     // mono
	binary.LittleEndian.PutUint32(h[24:], 16000) // samples a second
	binary.LittleEndian.PutUint32(h[28:], 32000) // bytes a second
	binary.LittleEndian.PutUint16(h[32:], 2)     // bytes a sample
	binary.LittleEndian.PutUint16(h[34:], 16)
	copy(h[36:], "data")
	binary.LittleEndian.PutUint32(h[40:], uint32(data))
	return base64.StdEncoding.EncodeToString(h)
}
