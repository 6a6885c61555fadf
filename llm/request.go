package llm

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"

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
	// 0 when it sets no maximum; Choices is how many answers it asks for
	// (OpenAI's n, Gemini's candidateCount), at least 1.
	MaxOutput int64
	Choices   int64
	// Input is the estimate of its input tokens (see CountInput); Media
	// counts the images, audio and files in it, each estimated at
	// MediaTokens.
	Input int64
	Media int64
	// IncludeUsage says an OpenAI stream already asks for its usage.
	IncludeUsage bool

	fields map[string]json.RawMessage
	body   []byte
	// legacyMaxTokens: see Transport.LegacyMaxTokens.
	legacyMaxTokens bool
}

// MediaTokens is the input estimate of one image, audio clip or file of
// a request: the settlement charges what the provider reports.
const MediaTokens = 1024

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
	r := &Request{API: api, Model: model, Choices: 1, body: body}
	if err := json.Unmarshal(body, &r.fields); err != nil || r.fields == nil {
		return nil, badRequest("the request body is not a JSON object")
	}
	// Read here, the last of two values wins; the provider's parser may
	// take the first (a model, a max_tokens other than the one reserved
	// for). Names are compared exactly: providers read them so.
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
		if err = r.firstInt(&r.MaxOutput, "max_completion_tokens", "max_tokens"); err != nil {
			return nil, err
		}
		if err = r.int("n", &r.Choices); err != nil {
			return nil, err
		}
		if r.Stream {
			var so struct {
				IncludeUsage bool `json:"include_usage"`
			}
			if raw := r.fields["stream_options"]; raw != nil && string(raw) != "null" {
				if json.Unmarshal(raw, &so) != nil {
					return nil, badRequest("stream_options is not an object")
				}
			}
			r.IncludeUsage = so.IncludeUsage
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
		var gc struct {
			MaxOutputTokens *int64 `json:"maxOutputTokens"`
			CandidateCount  *int64 `json:"candidateCount"`
		}
		if raw := r.fields["generationConfig"]; raw != nil && string(raw) != "null" {
			if json.Unmarshal(raw, &gc) != nil {
				return nil, badRequest("generationConfig.maxOutputTokens and candidateCount must be integers")
			}
		}
		if gc.MaxOutputTokens != nil {
			r.MaxOutput = *gc.MaxOutputTokens
		}
		if gc.CandidateCount != nil {
			r.Choices = *gc.CandidateCount
		}
	}
	if err != nil {
		return nil, err
	}
	if r.MaxOutput < 0 || r.MaxOutput > 100_000_000 {
		return nil, badRequest("the maximum output tokens %d is not from 1 to 100000000", r.MaxOutput)
	}
	if r.Choices < 1 || r.Choices > 128 {
		return nil, badRequest("%d choices: want 1 to 128", r.Choices)
	}
	r.Input, r.Media = CountInput(body, func(text string) int64 { return count(r.Model, text) })
	return r, nil
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

// firstInt reads the first of names that is set.
func (r *Request) firstInt(dst *int64, names ...string) error {
	for _, n := range names {
		if raw := r.fields[n]; raw != nil && string(raw) != "null" {
			return r.int(n, dst)
		}
	}
	return nil
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
			if _, ok := r.fields["max_tokens"]; ok && r.fields["max_completion_tokens"] == nil || r.legacyMaxTokens && r.fields["max_completion_tokens"] == nil {
				set["max_tokens"] = n
			} else {
				set["max_completion_tokens"] = n
			}
		case Completions, Messages:
			set["max_tokens"] = n
		case Responses:
			set["max_output_tokens"] = n
		case GenerateContent, StreamGenerateContent:
			gc := map[string]json.RawMessage{}
			if raw := r.fields["generationConfig"]; raw != nil && string(raw) != "null" {
				if err := json.Unmarshal(raw, &gc); err != nil {
					return nil, badRequest("generationConfig is not an object")
				}
			}
			gc["maxOutputTokens"] = n
			b, _ := json.Marshal(gc)
			set["generationConfig"] = b
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
	out := make(map[string]json.RawMessage, len(r.fields)+len(set))
	for k, v := range r.fields {
		out[k] = v
	}
	for k, v := range set {
		out[k] = v
	}
	return json.Marshal(out)
}

// mediaKeys name the fields whose strings are media, not text: base64
// data, URLs of images and files.
var mediaKeys = map[string]bool{
	"data": true, "url": true, "image_url": true, "file_data": true, "file_id": true,
	"file_uri": true, "fileUri": true, "image": true, "input_audio": true,
}

// skipKeys name fields whose strings are neither text nor media.
var skipKeys = map[string]bool{
	"model": true, "role": true, "type": true, "id": true, "tool_call_id": true,
	"mime_type": true, "mimeType": true, "media_type": true, "detail": true, "format": true,
	"encoding_format": true, "service_tier": true, "reasoning_effort": true, "user": true,
	"cache_control": true, "previous_response_id": true,
}

// CountInput estimates the input tokens of a request body: count applied
// to its text (the strings of messages, system prompts, tools, inputs;
// not models, roles, ids and types), plus 4 tokens per object for the
// framing of messages and parts, plus MediaTokens for each image, audio
// clip or file; media returns how many of those it found. The estimate is
// what a Gate reserves before the call; the provider's report settles it.
// body must be valid JSON (ParseRequest checks it first).
func CountInput(body []byte, count func(text string) int64) (tokens, media int64) {
	type frame struct {
		object bool
		key    []byte // the key the value was under
		media  bool   // inside a media value: nothing in it is text
	}
	var stackBuf [16]frame
	stack := append(stackBuf[:0], frame{})
	var key []byte
	expectKey := false
	var text []byte
	flush := func() {
		if len(text) > 0 {
			tokens += count(string(text))
			text = text[:0]
		}
	}
	for i := 0; i < len(body); {
		top := &stack[len(stack)-1]
		switch c := body[i]; c {
		case '{', '[':
			isMedia := top.media || mediaKeys[string(key)]
			if isMedia && !top.media {
				media++
			}
			if c == '{' {
				tokens += 4
			}
			stack = append(stack, frame{object: c == '{', key: key, media: isMedia})
			expectKey = c == '{'
			i++
		case '}', ']':
			if len(stack) > 1 {
				key = stack[len(stack)-1].key
				stack = stack[:len(stack)-1]
			}
			expectKey = false
			i++
		case ',':
			expectKey = top.object
			i++
		case '"':
			end := stringEnd(body, i)
			raw := body[i : end+1]
			i = end + 1
			if top.object && expectKey {
				key, expectKey = raw[1:len(raw)-1], false
				continue
			}
			switch {
			case top.media:
			case mediaKeys[string(key)]:
				media++
			case skipKeys[string(key)]:
			default:
				if len(text) > 0 {
					text = append(text, '\n')
				}
				if bytes.IndexByte(raw, '\\') < 0 {
					text = append(text, raw[1:len(raw)-1]...)
				} else {
					var s string
					_ = json.Unmarshal(raw, &s)
					text = append(text, s...)
				}
				if len(text) > 1<<16 {
					flush()
				}
			}
		default:
			i++
		}
	}
	flush()
	return tokens + media*MediaTokens, media
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
