package llm

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/httpx"
)

// Request is what a Gate needs to know of an LLM call before it goes out:
// its model, how long its answer may be, whether it streams, and an upper
// estimate of its input.
type Request struct {
	API   API
	Model string
	// Stream says the answer comes as server-sent events.
	Stream bool
	// MaxOutput is the most output tokens the request allows per choice,
	// 0 when it sets no maximum (the larger of a chat completion's two);
	// Choices is how many answers the provider generates and bills, at
	// least 1: the larger of OpenAI's n and best_of, times a completion's
	// prompts; Gemini's candidateCount.
	MaxOutput int64
	Choices   int64
	// Input is the estimate of its input tokens (see CountInput); Media
	// counts the images, audio and files in it, each estimated at
	// MediaTokens.
	Input int64
	Media int64
	// IncludeUsage says an OpenAI stream already asks for its usage.
	IncludeUsage bool
	// ServiceTier is the service tier the request asks for, as it names
	// it ("priority", "flex", "auto"), "" when it names none.
	ServiceTier string
	// AudioInput is the part of Input that is audio (its clips by their
	// length, at AudioTokensPerSecond);
	// AudioOutput says the request may make the model answer in audio.
	AudioInput  int64
	AudioOutput bool
	// CacheLong says the request may write to the provider's cache for an
	// hour (an Anthropic cache_control with a ttl of "1h").
	CacheLong bool
	// Searches is the most web searches the request's tools may run: a
	// tool's max_uses (Anthropic) or the call's max_tool_calls (OpenAI's
	// Responses) where it sets one, else DefaultSearches for each search
	// tool.
	Searches int64

	fields map[string]json.RawMessage
	body   []byte
	// legacyMaxTokens: see Transport.LegacyMaxTokens.
	legacyMaxTokens bool
}

// MediaTokens is the input estimate of one image, audio clip or file of
// a request: the settlement charges what the provider reports. It is
// above what GPT-4o and Claude bill for one image at its most detailed:
// OpenAI's GPT-4o family scales a high-detail image to fit 2048×2048 and
// then its short side to 768 pixels, and bills 85 tokens plus 170 for
// each 512-pixel tile, at most 8 tiles (768×2048): 1,445 tokens; Claude
// scales an image to about 1,600 tokens (width × height / 750). Audio,
// multi-page files and the images of a model that counts them in more,
// cheaper tokens (gpt-4o-mini) can bill more: the excess is debited after
// the call.
const MediaTokens = 2048

// modelImageTokens returns the most input tokens one image may be billed as
// by model, where that is more than MediaTokens: models that count an
// image in more, cheaper tokens. OpenAI's gpt-4o-mini bills a
// high-detail image 2,833 tokens plus 5,667 for each of at most 8 tiles;
// the models that count 32-pixel patches (gpt-4.1-mini and -nano,
// o4-mini, gpt-5-mini and -nano) bill at most 1,536 patches times a
// multiplier of up to 2.46.
func modelImageTokens(model string) int64 {
	switch {
	case strings.HasPrefix(model, "gpt-4o-mini"):
		return 2833 + 8*5667
	case strings.HasPrefix(model, "gpt-4.1-mini"), strings.HasPrefix(model, "gpt-4.1-nano"), strings.HasPrefix(model, "o4-mini"),
		strings.HasPrefix(model, "gpt-5-mini"), strings.HasPrefix(model, "gpt-5-nano"):
		return (1536*246 + 99) / 100
	}
	return MediaTokens
}

// ErrBadRequest wraps what is wrong with a request body.
var ErrBadRequest = errors.New("llm: bad request")

func badRequest(format string, args ...any) error {
	return &requestError{msg: sprintf(format, args...)}
}

type requestError struct{ msg string }

func (e *requestError) Error() string        { return e.msg }
func (e *requestError) Is(target error) bool { return target == ErrBadRequest }

// ParseRequest reads the body of a call to api. model is the one the path
// names (Gemini), "" when the body names it. count estimates the input
// tokens of a text for the model.
func ParseRequest(api API, model string, body []byte, count func(model, text string) int64) (*Request, error) {
	r, err := readRequest(api, model, body)
	if err != nil {
		return nil, err
	}
	r.countInput(count, -1)
	return r, nil
}

// readRequest is ParseRequest but for counting the input.
func readRequest(api API, model string, body []byte) (*Request, error) {
	r := &Request{API: api, Model: model, Choices: 1, body: body}
	if r.fields = topFields(body); r.fields == nil {
		return nil, badRequest("the request body is not a JSON object")
	}
	// Read here, the last of two values wins; the provider's parser may
	// take the first (a model, a max_tokens other than the one reserved
	// for). Names are compared exactly: providers read them so.
	if n := mostKeys(body); n > maxObjectKeys {
		// Checked before the duplicates, whose check keeps an object's
		// keys: 2.5 million of them took 200 MB.
		return nil, badRequest("an object of the request body has %d keys; at most %d", n, maxObjectKeys)
	}
	if key, dup := httpx.DuplicateKey(body, false); dup {
		return nil, badRequest("the request body is malformed: duplicate key %q", key)
	}
	if r.Model == "" {
		if err := r.str("model", &r.Model); err != nil {
			return nil, err
		}
		if r.Model == "" {
			return nil, badRequest("the request names no model: the \"model\" field is required")
		}
	}
	if len(r.Model) > 256 {
		return nil, badRequest("the model name is %d bytes; at most 256", len(r.Model))
	}
	var err error
	switch api {
	case ChatCompletions, Completions:
		if err = r.flag("stream", &r.Stream); err != nil {
			return nil, err
		}
		if err = r.maxOutput(api); err != nil {
			return nil, err
		}
		if err = r.choices(api); err != nil {
			return nil, err
		}
		if r.Stream {
			if raw := r.fields["stream_options"]; raw != nil && string(raw) != "null" {
				var so map[string]json.RawMessage
				if json.Unmarshal(raw, &so) != nil || so == nil {
					return nil, badRequest("stream_options is not an object")
				}
				r.IncludeUsage = string(so["include_usage"]) == "true"
			}
		}
	case Responses:
		if err = r.flag("stream", &r.Stream); err != nil {
			return nil, err
		}
		err = r.int("max_output_tokens", &r.MaxOutput)
	case Embeddings:
	case Messages:
		if err = r.flag("stream", &r.Stream); err != nil {
			return nil, err
		}
		err = r.int("max_tokens", &r.MaxOutput)
	case GenerateContent, StreamGenerateContent:
		r.Stream = api == StreamGenerateContent
		err = r.generationConfig()
	}
	if err != nil {
		return nil, err
	}
	if r.MaxOutput < 0 || r.MaxOutput > 100_000_000 {
		return nil, badRequest("the maximum output tokens %d is not from 1 to 100000000", r.MaxOutput)
	}
	if r.Choices < 1 || r.Choices > maxChoices {
		return nil, badRequest("%d choices: want 1 to %d", r.Choices, maxChoices)
	}
	if err := r.extras(api, body); err != nil {
		return nil, err
	}
	return r, nil
}

// countInput estimates r's input (see CountInput). With limit ≥ 0 it
// stops once the text counted passes limit tokens, and reports false:
// Input is then only a lower bound.
func (r *Request) countInput(count func(model, text string) int64, limit int64) bool {
	in := countInputUpTo(r.body, func(text string) int64 { return count(r.Model, text) }, limit)
	r.Input, r.Media, r.AudioInput = in.tokens, in.media, in.audio
	if per := modelImageTokens(r.Model); per > MediaTokens {
		r.Input += (in.media - in.audioItems) * (per - MediaTokens)
	}
	return !in.over
}

// DefaultSearches is the number of web searches reserved for a search
// tool that does not bound its uses; the searches the provider reports
// settle it.
const DefaultSearches = 5

// extras reads what a request may be billed for beyond tokens of text:
// its service tier, audio answers, hour-long cache writes and web
// searches.
func (r *Request) extras(api API, body []byte) error {
	if api.Provider() != Gemini {
		if err := r.str("service_tier", &r.ServiceTier); err != nil {
			return err
		}
	}
	switch api.Provider() {
	case OpenAI:
		var modalities []string
		if raw := r.fields["modalities"]; raw != nil && string(raw) != "null" && json.Unmarshal(raw, &modalities) != nil {
			return badRequest("\"modalities\" must be an array of strings")
		}
		r.AudioOutput = slices.Contains(modalities, "audio") || r.fields["audio"] != nil && string(r.fields["audio"]) != "null"
	case Anthropic:
		// A ttl spelled with escapes is still one: any escape counts.
		r.CacheLong = bytes.Contains(body, []byte(`1h`)) || bytes.Contains(body, []byte(`\u`))
	case Gemini:
		_, raw, _ := either(r.fields, "generationConfig", "generation_config")
		var gc map[string]json.RawMessage
		_ = json.Unmarshal(raw, &gc)
		_, mods, err := either(gc, "responseModalities", "response_modalities")
		if err != nil {
			return err
		}
		var modalities []string
		if mods != nil && string(mods) != "null" && json.Unmarshal(mods, &modalities) != nil {
			return badRequest("responseModalities must be an array of strings")
		}
		_, speech, _ := either(gc, "speechConfig", "speech_config")
		r.AudioOutput = speech != nil || slices.ContainsFunc(modalities, func(m string) bool { return strings.EqualFold(m, "audio") })
	}
	return r.searches()
}

// searches reads the most web searches the request's tools may run.
func (r *Request) searches() error {
	raw := r.fields["tools"]
	if raw == nil || string(raw) == "null" {
		if o := r.fields["web_search_options"]; o != nil && string(o) != "null" {
			r.Searches = 1 // a search model's call searches once
		}
		return nil
	}
	var tools []map[string]json.RawMessage
	if json.Unmarshal(raw, &tools) != nil {
		return badRequest("\"tools\" must be an array of objects")
	}
	var limit int64 = -1
	if v := r.fields["max_tool_calls"]; v != nil && string(v) != "null" {
		if json.Unmarshal(v, &limit) != nil || limit < 0 {
			return badRequest("\"max_tool_calls\" must be a non-negative integer")
		}
	}
	var n int64
	for _, tool := range tools {
		var typ string
		_ = json.Unmarshal(tool["type"], &typ)
		_, gs := tool["google_search"]
		_, gsc := tool["googleSearch"]
		_, gsr := tool["google_search_retrieval"]
		_, gsrc := tool["googleSearchRetrieval"]
		if !strings.HasPrefix(typ, "web_search") && !gs && !gsc && !gsr && !gsrc {
			continue
		}
		uses := int64(DefaultSearches)
		if v := tool["max_uses"]; v != nil && string(v) != "null" {
			if json.Unmarshal(v, &uses) != nil || uses < 0 || uses > 1_000_000 {
				return badRequest("a web search tool's max_uses must be an integer from 0 to 1000000")
			}
		}
		n += uses
	}
	if limit >= 0 {
		n = min(n, limit)
	}
	r.Searches = n
	return nil
}

func (r *Request) str(name string, dst *string) error {
	if raw := r.fields[name]; raw != nil && json.Unmarshal(raw, dst) != nil {
		return badRequest("%q must be a string", name)
	}
	return nil
}

func (r *Request) flag(name string, dst *bool) error {
	if raw := r.fields[name]; raw != nil && string(raw) != "null" && json.Unmarshal(raw, dst) != nil {
		return badRequest("%q must be true or false", name)
	}
	return nil
}

func (r *Request) int(name string, dst *int64) error {
	if raw := r.fields[name]; raw != nil && string(raw) != "null" && json.Unmarshal(raw, dst) != nil {
		return badRequest("%q must be an integer", name)
	}
	return nil
}

// maxChoices bounds the answers one request may ask for, all prompts
// together: its reservation is its maximum output times as many.
const maxChoices = 128

// maxOutput reads the maximum output of a chat completion or completion.
// A completion has max_tokens only; a chat completion may set both
// max_completion_tokens and the older max_tokens, and servers differ in
// which they read, so the larger stands.
func (r *Request) maxOutput(api API) error {
	if err := r.int("max_tokens", &r.MaxOutput); err != nil || api == Completions {
		return err
	}
	var n int64
	if err := r.int("max_completion_tokens", &n); err != nil {
		return err
	}
	r.MaxOutput = max(r.MaxOutput, n)
	return nil
}

// choices reads how many answers a chat completion or completion makes
// the provider generate and bill: max(n, best_of) for each of its
// prompts. best_of completions are generated and billed though only n
// are returned; a completion's prompt may be a list of prompts, each
// answered in full.
func (r *Request) choices(api API) error {
	n, bestOf := int64(1), int64(1)
	if err := r.int("n", &n); err != nil {
		return err
	}
	if err := r.int("best_of", &bestOf); err != nil {
		return err
	}
	if n < 1 || n > maxChoices || bestOf < 1 || bestOf > maxChoices {
		return badRequest("n %d and best_of %d: each must be from 1 to %d", n, bestOf, maxChoices)
	}
	prompts := int64(1)
	if raw := r.fields["prompt"]; api == Completions && len(raw) > 0 && raw[0] == '[' {
		// An array of token ids is one prompt; an array of strings or
		// of token-id arrays is one prompt per element. Counted in place:
		// decoding a prompt of millions of ids took gigabytes.
		prompts = max(promptsIn(raw), 1)
	}
	per := max(n, bestOf)
	if prompts > maxChoices || prompts*per > maxChoices {
		return badRequest("this request asks for %d completions (%d prompts × %d each, the larger of n and best_of); at most %d in one request", prompts*per, prompts, per, maxChoices)
	}
	r.Choices = prompts * per
	return nil
}

// maxObjectKeys bounds the keys of one object of a request body, far
// above what providers take (OpenAI's logit_bias: 300).
const maxObjectKeys = 10_000

// mostKeys returns the most keys one object of the JSON text body has
// (body valid JSON), without keeping any.
func mostKeys(body []byte) int {
	var stackBuf [32]int // keys so far of each open object; -1 for an array
	stack := stackBuf[:0]
	most := 0
	expectKey := false
	for i := 0; i < len(body); i++ {
		switch body[i] {
		case '{':
			stack, expectKey = append(stack, 0), true
		case '[':
			stack, expectKey = append(stack, -1), false
		case '}', ']':
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			expectKey = false
		case ',':
			expectKey = len(stack) > 0 && stack[len(stack)-1] >= 0
		case '"':
			if expectKey {
				stack[len(stack)-1]++
				most = max(most, stack[len(stack)-1])
				expectKey = false
			}
			i = stringEnd(body, i)
		}
	}
	return most
}

// topFields returns the fields of the JSON object body, each value a
// slice of body itself (a large prompt is not copied), the last of two
// values of one name winning as encoding/json has it; nil when body is
// not a valid JSON object.
func topFields(body []byte) map[string]json.RawMessage {
	if !json.Valid(body) {
		return nil
	}
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil
	}
	fields := map[string]json.RawMessage{}
	for i = skipSpace(body, i+1); i < len(body) && body[i] == '"'; {
		end := stringEnd(body, i)
		key := string(body[i+1 : end])
		if bytes.IndexByte(body[i:end], '\\') >= 0 || !utf8.Valid(body[i:end]) {
			_ = json.Unmarshal(body[i:end+1], &key) // as encoding/json reads it
		}
		v := skipSpace(body, skipSpace(body, end+1)+1) // past the colon
		e := valueEnd(body, v)
		fields[key] = body[v:e:e]
		if i = skipSpace(body, e); i < len(body) && body[i] == ',' {
			i = skipSpace(body, i+1)
		}
	}
	return fields
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// valueEnd returns the index just past the JSON value starting at b[i]
// (valid JSON).
func valueEnd(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			i = stringEnd(b, i)
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i // the end of the object holding a number or literal
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
	}
	return i
}

// promptsIn counts the elements of the JSON array raw (valid JSON, as
// ParseRequest checked) that are strings or arrays, without decoding it.
func promptsIn(raw []byte) int64 {
	var n int64
	depth := 0
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; c {
		case '"':
			if depth == 1 {
				n++
			}
			i = stringEnd(raw, i)
		case '[', '{':
			if depth == 1 && c == '[' {
				n++
			}
			depth++
		case ']', '}':
			depth--
		}
	}
	return n
}

// generationConfig reads a Gemini request's maximum output and candidate
// count. Google's JSON API takes each field under its lowerCamelCase name
// or its snake_case one; a request that spells one field both ways is
// refused as ambiguous, since which the provider reads is not known.
func (r *Request) generationConfig() error {
	name, raw, err := either(r.fields, "generationConfig", "generation_config")
	if err != nil || raw == nil || string(raw) == "null" {
		return err
	}
	var gc map[string]json.RawMessage
	if json.Unmarshal(raw, &gc) != nil || gc == nil {
		return badRequest("%s is not an object", name)
	}
	for _, f := range []struct {
		camel, snake string
		dst          *int64
	}{{"maxOutputTokens", "max_output_tokens", &r.MaxOutput}, {"candidateCount", "candidate_count", &r.Choices}} {
		key, v, err := either(gc, f.camel, f.snake)
		if err != nil {
			return err
		}
		if v != nil && string(v) != "null" && json.Unmarshal(v, f.dst) != nil {
			return badRequest("%s.%s must be an integer", name, key)
		}
	}
	return nil
}

// either returns the one of two spellings of a field that obj holds, and
// an error when it holds both.
func either(obj map[string]json.RawMessage, camel, snake string) (string, json.RawMessage, error) {
	c, cok := obj[camel]
	s, sok := obj[snake]
	switch {
	case cok && sok:
		return "", nil, badRequest("the request sets both %q and %q, one field spelled two ways: set one", camel, snake)
	case sok:
		return snake, s, nil
	}
	return camel, c, nil
}

// Body returns the body to send: the client's own bytes when nothing
// changes, else the request with maxOutput as its maximum output tokens
// (when > 0) and, for an OpenAI stream that does not ask for its usage,
// stream_options.include_usage set.
func (r *Request) Body(maxOutput int64, includeUsage bool) ([]byte, error) {
	set := map[string]json.RawMessage{}
	if maxOutput > 0 && maxOutput != r.MaxOutput {
		n := json.RawMessage(strconv.FormatInt(maxOutput, 10))
		switch r.API {
		case ChatCompletions:
			// Every maximum the client set, since servers differ in which
			// they read, else the one this server is told to read.
			_, mt := r.fields["max_tokens"]
			_, mct := r.fields["max_completion_tokens"]
			if mt || !mct && r.legacyMaxTokens {
				set["max_tokens"] = n
			}
			if mct || !mt && !r.legacyMaxTokens {
				set["max_completion_tokens"] = n
			}
		case Completions, Messages:
			set["max_tokens"] = n
		case Responses:
			set["max_output_tokens"] = n
		case GenerateContent, StreamGenerateContent:
			name, raw, err := either(r.fields, "generationConfig", "generation_config")
			if err != nil {
				return nil, err
			}
			gc := map[string]json.RawMessage{}
			if raw != nil && string(raw) != "null" {
				if err := json.Unmarshal(raw, &gc); err != nil {
					return nil, badRequest("%s is not an object", name)
				}
			}
			key, _, err := either(gc, "maxOutputTokens", "max_output_tokens")
			if err != nil {
				return nil, err
			}
			gc[key] = n
			b, _ := json.Marshal(gc)
			set[name] = b
		}
	}
	if includeUsage {
		so := map[string]json.RawMessage{}
		if raw := r.fields["stream_options"]; raw != nil && string(raw) != "null" {
			_ = json.Unmarshal(raw, &so) // checked by ParseRequest
		}
		so["include_usage"] = json.RawMessage("true")
		b, _ := json.Marshal(so)
		set["stream_options"] = b
	}
	if len(set) == 0 {
		return r.body, nil
	}
	// Written field by field into one buffer of the right size, the
	// values as the client sent them: marshalling a map of a 30 MB body
	// grew a buffer by doubling, and compacted every value again.
	size := len(r.body) + 64
	for _, v := range set {
		size += len(v) + 32
	}
	out := make([]byte, 0, size)
	out = append(out, '{')
	for _, k := range slices.Sorted(maps.Keys(r.fields)) {
		if _, replaced := set[k]; !replaced {
			out = appendField(out, k, r.fields[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(set)) {
		out = appendField(out, k, set[k])
	}
	return append(out, '}'), nil
}

// appendField appends "key":value (and a comma before it unless it is
// the first) to an object being written.
func appendField(out []byte, key string, value json.RawMessage) []byte {
	if len(out) > 1 {
		out = append(out, ',')
	}
	k, _ := json.Marshal(key)
	out = append(append(out, k...), ':')
	return append(out, value...)
}

// mediaKeys name the fields whose strings are media, not text: base64
// data, URLs of images and files.
var mediaKeys = map[string]bool{
	"data": true, "url": true, "image_url": true, "file_data": true, "file_id": true, "file_url": true,
	"file_uri": true, "fileUri": true, "image": true, "input_audio": true,
}

// skipKeys name fields whose strings are neither text nor media.
var skipKeys = map[string]bool{
	"model": true, "role": true, "type": true, "id": true, "tool_call_id": true,
	"mime_type": true, "mimeType": true, "media_type": true, "detail": true, "format": true,
	"encoding_format": true, "service_tier": true, "reasoning_effort": true, "user": true,
	"cache_control": true, "previous_response_id": true,
}

// schemaKeys name the fields whose whole value is a definition the
// provider renders into the model's input and bills: tools, functions and
// the JSON schemas of answers. Everything in it counts as text, its keys
// and literals included.
var schemaKeys = map[string]bool{
	"tools": true, "functions": true, "response_format": true, "input_schema": true,
	"functionDeclarations": true, "function_declarations": true,
	"format": true, "responseSchema": true, "response_schema": true, "responseJsonSchema": true, "response_json_schema": true,
}

// tokenIDKeys name the fields whose arrays of integers are prompts given
// as token ids: one token each.
var tokenIDKeys = map[string]bool{"input": true, "prompt": true}

// CountInput estimates the input tokens of a request body: count applied
// to its text (the strings of messages, system prompts and inputs; not
// models, roles, ids and types), plus one token per integer of a prompt
// given as token ids, plus 4 tokens per object for the framing of
// messages and parts, plus MediaTokens for each image, audio clip or
// file; media returns how many of those it found. Tools and schemas count
// whole as text, keys included. A document or inline file whose type is
// text/* counts as its text (decoded from base64 where it is encoded),
// not as media. The estimate is what a Gate reserves before the call; the
// provider's report settles it. body must be valid JSON (ParseRequest
// checks it first).
func CountInput(body []byte, count func(text string) int64) (tokens, media int64) {
	c := countInput(body, count)
	return c.tokens, c.media
}

// inputCount is what countInput found: the estimate of a request's input
// tokens, its media items, and the part of the estimate that is audio.
type inputCount struct {
	tokens, media, audio, audioItems int64
	// over says the count stopped past its limit.
	over bool
}

func countInput(body []byte, count func(text string) int64) inputCount {
	return countInputUpTo(body, count, -1)
}

// countInputUpTo is countInput, stopping once the text counted passes
// limit tokens when limit ≥ 0.
func countInputUpTo(body []byte, count func(text string) int64, limit int64) inputCount {
	// mediaTokens are the media items' tokens but audio's; audioItems
	// counts the items whose tokens are audio's.
	var tokens, media, mediaTokens, audioItems, audio int64
	over := false
	type frame struct {
		object bool
		key    []byte // the key the value was under
		media  bool   // inside a media value: nothing in it is text
		schema bool   // inside a tool or schema: everything in it is text
		// An object's "data" string, judged when the object ends by its
		// type: text when text/*, else media.
		data      []byte
		textType  bool // a media type text/*
		audioType bool // a media type audio/*
		videoType bool // a media type video/*
		fileRef   bool // a media file named by URL or id (file_uri)
		pdfType   bool // a media type application/pdf
		imageType bool // a media type image/*
		document  bool // Anthropic's "type": "document" block
		imageKind bool // a block of an image ("type": "input_image", "image", "image_url")
		fileDoc   bool // a file_id or file_url: a file by id or URL, a document unless an image
		// childMedia says a media item ended inside this object, and
		// childTyped that its type was known (and its tokens counted).
		childMedia, childTyped bool
		plainBytes             bool // Anthropic's "type": "text" source: data is not base64
	}
	// item counts one media item of mime type m (lower case, without
	// quotes), b64 its base64 text (unescaped) or nil when it is named by
	// URL or id; it reports whether the type was one counted apart.
	item := func(m string, b64 []byte) bool {
		switch {
		case strings.HasPrefix(m, "audio/"):
			audioItems++
			if b64 == nil {
				audio += MaxMediaTokens
			} else {
				audio += audioTokens(b64)
			}
		case strings.HasPrefix(m, "video/"):
			mediaTokens += MaxMediaTokens // billed by a length not known here
		case m == "application/pdf":
			mediaTokens += documentTokens(b64)
		case strings.HasPrefix(m, "image/") && b64 != nil:
			mediaTokens += tiledImageTokens(b64)
		default:
			mediaTokens += MediaTokens
			return false
		}
		return true
	}
	// dataURL counts a media string that is a data: URL, as its type says;
	// false when it is not one.
	dataURL := func(raw []byte) bool {
		rest, ok := bytes.CutPrefix(unquote(raw), []byte("data:"))
		if !ok {
			return false
		}
		head, payload, ok := bytes.Cut(rest, []byte(","))
		if !ok {
			return false
		}
		m, _, _ := bytes.Cut(head, []byte(";"))
		return item(strings.ToLower(string(m)), payload)
	}
	setType := func(f *frame, raw []byte) {
		m := bytes.ToLower(unquote(raw)) // audio\/flac is audio/flac
		f.textType = bytes.HasPrefix(m, []byte("text/"))
		f.audioType = bytes.HasPrefix(m, []byte("audio/"))
		f.videoType = bytes.HasPrefix(m, []byte("video/"))
		f.imageType = bytes.HasPrefix(m, []byte("image/"))
		f.pdfType = string(m) == "application/pdf"
	}
	mimeOf := func(f *frame) string {
		switch {
		case f.audioType:
			return "audio/"
		case f.videoType:
			return "video/"
		case f.pdfType:
			return "application/pdf"
		case f.imageType:
			return "image/"
		}
		return ""
	}
	var stackBuf [16]frame
	stack := append(stackBuf[:0], frame{})
	var key []byte
	expectKey := false
	var text []byte
	flush := func() {
		if len(text) > 0 {
			if !over {
				tokens += count(string(text))
				over = limit >= 0 && tokens > limit
			}
			text = text[:0]
		}
	}
	// Text is counted in pieces of at most countChunk bytes, cut where a
	// word ends: a tokenizer's memory grows with what it is given, and a
	// prompt of one 30 MB string once took half a gigabyte. A cut between
	// words changes a count by a token or so in 64 KB.
	addText := func(b []byte) {
		if len(text) > 0 {
			text = append(text, '\n')
		}
		for len(b) > 0 && !over {
			if len(text) >= countChunk {
				flush()
			}
			n := min(len(b), countChunk-len(text))
			if n < len(b) {
				if n = cutAt(b, n); n == 0 {
					if len(text) > 0 {
						flush() // no room for a word: a piece of its own
						continue
					}
					n = min(len(b), countChunk)
				}
			}
			text = append(text, b[:n]...)
			b = b[n:]
		}
		if len(text) >= countChunk {
			flush()
		}
	}
	for i := 0; i < len(body) && !over; {
		top := &stack[len(stack)-1]
		switch c := body[i]; c {
		case '{', '[':
			isSchema := top.schema || !top.media && schemaKeys[string(key)]
			isMedia := !isSchema && (top.media || mediaKeys[string(key)])
			if isMedia && !top.media {
				media++ // counted when it ends, by what it held
			}
			if c == '{' {
				tokens += 4
			}
			stack = append(stack, frame{object: c == '{', key: key, media: isMedia, schema: isSchema})
			expectKey = c == '{'
			i++
		case '}', ']':
			if len(stack) > 1 {
				f := &stack[len(stack)-1]
				parent := &stack[len(stack)-2]
				switch {
				case f.data != nil && f.textType:
					addText(decodeData(f.data, f.plainBytes))
				case f.data != nil:
					// An inline item: Gemini's inline_data, Anthropic's
					// base64 source.
					media++
					parent.childMedia = true
					parent.childTyped = item(mimeOf(f), unquote(f.data))
				case f.media && !parent.media:
					// A media value, ended: a URL, an id, an object naming
					// one (file_data), unless a data: URL counted it. A
					// file by URI of no stated type may be a video.
					switch m := mimeOf(f); {
					case f.childTyped:
					case m == "" && string(f.key) == "file_data":
						mediaTokens += MaxMediaTokens
					default:
						item(m, nil)
					}
					parent.childMedia = true
					parent.childTyped = mimeOf(f) != "" || string(f.key) == "file_data"
				case f.fileRef:
					// An object naming a file by URL or id, counted as
					// media when its name was read: its type, where it
					// says one, says more.
					parent.childMedia = true
					switch m := mimeOf(f); {
					case m != "":
						mediaTokens -= MediaTokens
						item(m, nil)
						parent.childTyped = true
					case f.fileDoc && !f.imageKind:
						mediaTokens += documentTokensJSON(nil) - MediaTokens
						parent.childTyped = true
					case string(f.key) == "fileData":
						mediaTokens += MaxMediaTokens - MediaTokens
						parent.childTyped = true
					}
				}
				if f.document && f.childMedia && !f.childTyped {
					// Anthropic's document block by URL or id: a PDF.
					mediaTokens += documentTokensJSON(nil) - MediaTokens
				}
				key = f.key
				stack = stack[:len(stack)-1]
			}
			expectKey = false
			i++
		case ',':
			expectKey = top.object
			i++
		case ' ', '\t', '\n', '\r', ':':
			i++
		case '"':
			end := stringEnd(body, i)
			raw := body[i : end+1]
			i = end + 1
			if top.object && expectKey {
				// As the provider reads it: mime\u005ftype is mime_type.
				key, expectKey = unquote(raw), false
				if top.schema {
					addText(unquote(raw))
				}
				continue
			}
			k := string(key)
			switch {
			case top.schema:
				addText(unquote(raw))
			case top.media:
				switch {
				case k == "data" && top.object && string(top.key) == "input_audio":
					audioItems++
					audio += audioTokensJSON(raw)
					top.childTyped = true
				case k == "mime_type" || k == "mimeType" || k == "media_type":
					// A file by reference (file_data): its type says how
					// it is billed.
					setType(top, raw)
				case dataURL(raw):
					top.childTyped = true
				}
			case k == "data" && top.object:
				top.data = raw
			case mediaKeys[k]:
				// A media string of its own: a URL, an id, a data: URL.
				media++
				if !dataURL(raw) {
					mediaTokens += MediaTokens
					top.fileRef = top.object
					top.fileDoc = top.fileDoc || k == "file_id" || k == "file_url"
				} else {
					top.childTyped = true
				}
				top.childMedia = true
			case k == "mime_type" || k == "mimeType" || k == "media_type":
				setType(top, raw)
			case k == "type":
				top.plainBytes = string(raw) == `"text"`
				top.document = string(raw) == `"document"`
				top.imageKind = string(raw) == `"input_image"` || string(raw) == `"image"` || string(raw) == `"image_url"`
			case skipKeys[k]:
			default:
				addText(unquote(raw))
			}
		default:
			// A number or a literal.
			j := i + 1
			for j < len(body) && (body[j] >= '0' && body[j] <= '9' || body[j] >= 'a' && body[j] <= 'z' || body[j] == '.' || body[j] == '-' || body[j] == '+' || body[j] == 'E') {
				j++
			}
			switch lit := body[i:j]; {
			case top.schema:
				addText(lit)
			case !top.object && !top.media && tokenIDKeys[string(top.key)] && (c == '-' || c >= '0' && c <= '9'):
				tokens++
				over = limit >= 0 && tokens > limit
			}
			i = j
		}
	}
	flush()
	return inputCount{tokens: min(tokens+mediaTokens+audio, bounds.MaxCost), media: media, audio: min(audio, bounds.MaxCost), audioItems: audioItems, over: over}
}

// countChunk is the most text CountInput gives its count function at once.
const countChunk = 64 << 10

// cutAt returns where to cut b, at most n bytes in (n < len(b)): after
// the last space or newline of the 256 bytes before n, else at the start
// of a UTF-8 character; 0 when there is none.
func cutAt(b []byte, n int) int {
	for i := n; i > max(n-256, 0); i-- {
		if b[i-1] == ' ' || b[i-1] == '\n' {
			return i
		}
	}
	for i := n; i > max(n-4, 0); i-- {
		if b[i]&0xC0 != 0x80 {
			return i
		}
	}
	return 0
}

// unquote returns the text of a JSON string, quotes included in raw.
func unquote(raw []byte) []byte {
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw[1 : len(raw)-1]
	}
	var s string
	_ = json.Unmarshal(raw, &s)
	return []byte(s)
}

// decodeData returns the text of a text file's data: as it is when plain,
// else decoded from base64. Data that is not base64 counts as it is.
func decodeData(raw []byte, plain bool) []byte {
	b := unquote(raw)
	if plain {
		return b
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if d, err := enc.DecodeString(string(b)); err == nil {
			return d
		}
	}
	return b
}

// stringEnd returns the index of the quote that ends the JSON string
// starting at b[i].
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j
		}
	}
	return len(b) - 1
}
