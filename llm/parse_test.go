package llm

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/admitdev/admit/units"
)

func bytesPerToken(text string) int64 { return int64(len(text)) }

func TestCountInput(t *testing.T) {
	body := `{"model":"gpt-4o","messages":[{"role":"system","content":"abc"},{"role":"user","content":[{"type":"text","text":"de\nf"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`
	tokens, media := CountInput([]byte(body), bytesPerToken)
	// Text "abc\nde\nf" (8 bytes, the escape decoded); objects: root, 2
	// messages, 2 parts, image_url = 6 × 4; one image.
	if media != 1 || tokens != 8+6*4+MediaTokens {
		t.Fatalf("CountInput = %d tokens, %d media", tokens, media)
	}
	gem := `{"contents":[{"role":"user","parts":[{"text":"hello"},{"inlineData":{"mimeType":"image/jpeg","data":"/9j/4AAQ"}}]}],"systemInstruction":{"parts":[{"text":"be brief"}]}}`
	tokens, media = CountInput([]byte(gem), bytesPerToken)
	if media != 1 || tokens != int64(len("hello\nbe brief"))+7*4+MediaTokens {
		t.Fatalf("gemini: %d tokens, %d media", tokens, media)
	}
}

func TestParseRequestErrors(t *testing.T) {
	for _, c := range []struct {
		api  API
		body string
	}{
		{ChatCompletions, `{"model":`},
		{ChatCompletions, `[]`},
		{ChatCompletions, `{"messages":[]}`},
		{ChatCompletions, `{"model":"m","max_tokens":"many"}`},
		{ChatCompletions, `{"model":"m","n":0}`},
		{Messages, `{"model":"m","max_tokens":-1}`},
		{GenerateContent, `{"generationConfig":{"maxOutputTokens":"x"}}`},
	} {
		if _, err := ParseRequest(c.api, "", []byte(c.body), CountTokens); err == nil {
			t.Errorf("%v %s: accepted", c.api, c.body)
		}
	}
}

// Anthropic's output count is cumulative and Gemini's usage a running
// total: the last report stands, never a sum.
func TestUsageNeverSummed(t *testing.T) {
	m := meter{api: Messages}
	for _, ev := range []string{
		`{"type":"message_start","message":{"usage":{"input_tokens":20,"cache_read_input_tokens":5,"output_tokens":1}}}`,
		`{"type":"message_delta","usage":{"output_tokens":10}}`,
		`{"type":"message_delta","usage":{"output_tokens":25}}`,
	} {
		m.observe([]byte(ev))
	}
	if want := (units.Tokens{20, 5, 0, 25, 0}); m.usage != want {
		t.Fatalf("anthropic usage %v, want %v", m.usage, want)
	}
	g := meter{api: StreamGenerateContent}
	for _, ev := range []string{
		`{"candidates":[],"usageMetadata":{"promptTokenCount":30,"cachedContentTokenCount":10,"candidatesTokenCount":4,"thoughtsTokenCount":2}}`,
		`{"candidates":[{"content":{"parts":[{"text":"more"}]}}]}`,
		`{"usageMetadata":{"promptTokenCount":30,"cachedContentTokenCount":10,"candidatesTokenCount":9,"thoughtsTokenCount":7}}`,
	} {
		g.observe([]byte(ev))
	}
	if want := (units.Tokens{20, 10, 0, 9, 7}); g.usage != want {
		t.Fatalf("gemini usage %v, want %v", g.usage, want)
	}
}

// Usage is read at its place in the answer's structure, never where a
// model's words put a key of its name: in a string, in the input of a
// tool it calls (an object in Anthropic's answers), at any size of
// answer, in pieces of any size.
func TestUsageByStructure(t *testing.T) {
	big := strings.Repeat("x", 5<<20)
	for _, c := range []struct {
		name string
		api  API
		body string
		want units.Tokens
	}{
		{"openai, usage in the text", ChatCompletions,
			`{"choices":[{"message":{"content":"say \"usage\": {\"prompt_tokens\":1}"}}],"usage":{"prompt_tokens":12,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":2},"completion_tokens_details":{"reasoning_tokens":3}}}`,
			units.Tokens{10, 2, 0, 5, 3}},
		{"anthropic, a tool's input names usageMetadata and usage", Messages,
			`{"type":"message","content":[{"type":"tool_use","name":"report","input":{"usageMetadata":{"promptTokenCount":0},"usage":{"input_tokens":0,"output_tokens":0}}}],"usage":{"input_tokens":900,"output_tokens":25000}}`,
			units.Tokens{900, 0, 0, 25000, 0}},
		{"anthropic, the tool's input after the usage", Messages,
			`{"type":"message","usage":{"input_tokens":900,"output_tokens":25000},"content":[{"type":"tool_use","input":{"usage":{"input_tokens":1,"output_tokens":1}}}]}`,
			units.Tokens{900, 0, 0, 25000, 0}},
		{"openai, an answer of 5 MB", ChatCompletions,
			`{"choices":[{"message":{"content":"` + big + `"},"logprobs":{"content":[{"token":"usage","bytes":[1,2]}]}}],"usage":{"prompt_tokens":7,"completion_tokens":1500000}}`,
			units.Tokens{7, 0, 0, 1500000, 0}},
		{"gemini, a stream as one array", StreamGenerateContent,
			`[{"candidates":[{"content":{"parts":[{"text":"{\"usageMetadata\":{}}"}]}}],"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":1}},` +
				`{"candidates":[{"content":{"parts":[{"functionCall":{"args":{"usageMetadata":{"promptTokenCount":0,"candidatesTokenCount":0}}}}]}}],"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":40}}]`,
			units.Tokens{5, 0, 0, 40, 0}},
	} {
		for _, piece := range []int{1, 7, 4096, 1 << 30} {
			var got *meter
			b := newMeteredBody(io.NopCloser(&pieces{data: []byte(c.body), n: piece}), c.api, false, false, func(m *meter, _ bool) { got = m })
			if _, err := io.Copy(io.Discard, b); err != nil {
				t.Fatal(err)
			}
			if got == nil || got.usage != c.want {
				t.Errorf("%s, in pieces of %d: usage %v, want %v", c.name, piece, got.usage, c.want)
			}
		}
	}
}

// FuzzUsageScan: the usage a scan finds in a JSON object is the object
// its "usage" key holds, as a JSON decoder reads it.
func FuzzUsageScan(f *testing.F) {
	f.Add(`{"usage":{"prompt_tokens":3}}`, uint8(2))
	f.Add(`{"a":{"usage":{"x":1}},"usage":{"input_tokens":4,"s":"}\"{"}}`, uint8(5))
	f.Add(`{"usage":null,"b":[{"usage":{}}]}`, uint8(1))
	f.Fuzz(func(t *testing.T, doc string, piece uint8) {
		var root map[string]json.RawMessage
		if json.Unmarshal([]byte(doc), &root) != nil || root == nil {
			return
		}
		for _, k := range []string{"usageMetadata", "response", "message"} {
			if _, ok := root[k]; ok {
				return
			}
		}
		var s usageScan
		for rest, n := []byte(doc), int(piece%16)+1; len(rest) > 0; rest = rest[min(n, len(rest)):] {
			s.write(rest[:min(n, len(rest))])
		}
		want := bytes.TrimSpace(root["usage"])
		if len(want) == 0 || want[0] != '{' {
			want = nil
		}
		if !bytes.Equal(s.last, want) {
			t.Fatalf("scan found %q, the decoder %q", s.last, want)
		}
	})
}

// FuzzMeteredBody: whatever the upstream sends, in whatever pieces, the
// client gets it byte for byte (nothing to drop), and metering never
// panics.
func FuzzMeteredBody(f *testing.F) {
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n"), uint8(3), true)
	f.Add([]byte(`{"type":"message","usage":{"input_tokens":3,"output_tokens":4}}`), uint8(1), false)
	f.Fuzz(func(t *testing.T, data []byte, piece uint8, stream bool) {
		var ended bool
		b := newMeteredBody(io.NopCloser(&pieces{data: data, n: int(piece%64) + 1}), ChatCompletions, stream, false, func(m *meter, e bool) { ended = e })
		got, err := io.ReadAll(b)
		if err != nil || !bytes.Equal(got, data) || !ended {
			t.Fatalf("relayed %q (%v), sent %q", got, err, data)
		}
	})
}

func FuzzParseRequest(f *testing.F) {
	f.Add(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
	f.Add(`{"contents":[{"parts":[{"text":"x"}]}],"generationConfig":{"maxOutputTokens":9}}`)
	f.Fuzz(func(t *testing.T, body string) {
		for _, api := range []API{ChatCompletions, Responses, Messages, GenerateContent} {
			r, err := ParseRequest(api, "m", []byte(body), func(_, s string) int64 { return int64(len(s)) })
			if err != nil {
				continue
			}
			if _, err := r.Body(7, api == ChatCompletions); err != nil && !strings.Contains(err.Error(), "generationConfig") {
				t.Fatal(err)
			}
		}
	})
}

// pieces reads data n bytes at a time.
type pieces struct {
	data []byte
	n    int
}

func (p *pieces) Read(b []byte) (int, error) {
	if len(p.data) == 0 {
		return 0, io.EOF
	}
	k := copy(b, p.data[:min(p.n, len(p.data))])
	p.data = p.data[k:]
	return k, nil
}

// BenchmarkUsageScan reads a 1 MB answer for its usage.
func BenchmarkUsageScan(b *testing.B) {
	body := []byte(`{"choices":[{"message":{"content":"` + strings.Repeat("word ", 200_000) + `"}}],"usage":{"prompt_tokens":7,"completion_tokens":200000}}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var s usageScan
		for pb.Next() {
			s.reset()
			for rest := body; len(rest) > 0; rest = rest[min(32<<10, len(rest)):] {
				s.write(rest[:min(32<<10, len(rest))])
			}
			if _, ok := s.usage(); !ok {
				b.Fatal("no usage")
			}
		}
	})
}

func parse(t *testing.T, api API, body string) *Request {
	t.Helper()
	r, err := ParseRequest(api, "m", []byte(body), func(_, s string) int64 { return int64(len(s)) })
	if err != nil {
		t.Fatalf("%v %s: %v", api, body, err)
	}
	return r
}

// A completion generates best_of answers for each of its prompts, and
// the provider bills them all: each is a choice reserved for.
func TestCompletionChoices(t *testing.T) {
	for _, c := range []struct {
		body    string
		choices int64
	}{
		{`{"model":"m","prompt":"a","n":2,"best_of":5}`, 5},
		{`{"model":"m","prompt":["a","b","c"],"n":2}`, 6},
		{`{"model":"m","prompt":["a","b","c","d"],"best_of":4,"max_tokens":40}`, 16},
		{`{"model":"m","prompt":[1,2,3,4],"best_of":3}`, 3},      // one prompt of token ids
		{`{"model":"m","prompt":[[1,2],[3],[4,5,6]],"n":4}`, 12}, // three
		{`{"model":"m","prompt":["a","b"],"n":8,"best_of":64}`, 128},
	} {
		if r := parse(t, Completions, c.body); r.Choices != c.choices {
			t.Errorf("%s: %d choices, want %d", c.body, r.Choices, c.choices)
		}
	}
	// The example: 20 prompts × best_of 20 of 40 tokens would be
	// 16,000 output tokens, past the bound of 128 answers.
	prompts := `"p"` + strings.Repeat(`,"p"`, 19)
	_, err := ParseRequest(Completions, "m", []byte(`{"model":"m","prompt":[`+prompts+`],"best_of":20,"max_tokens":40}`), CountTokens)
	if err == nil || !strings.Contains(err.Error(), "400 completions (20 prompts × 20 each") {
		t.Fatalf("20 prompts × best_of 20: %v", err)
	}
	for _, body := range []string{
		`{"model":"m","prompt":"a","best_of":0}`,
		`{"model":"m","prompt":"a","best_of":129}`,
		`{"model":"m","prompt":"a","best_of":"all"}`,
		`{"model":"m","prompt":["a","b"],"n":65}`,
	} {
		if _, err := ParseRequest(Completions, "m", []byte(body), CountTokens); err == nil {
			t.Errorf("%s: accepted", body)
		}
	}
}

// A chat completion may carry both maximums, and servers differ in which
// they read: the larger is reserved, and a maximum the proxy sets is
// written into each. A completion has max_tokens only.
func TestMaxOutputFields(t *testing.T) {
	r := parse(t, ChatCompletions, `{"model":"m","max_completion_tokens":10,"max_tokens":5000}`)
	if r.MaxOutput != 5000 {
		t.Fatalf("chat with both maximums: MaxOutput %d, want the larger 5000", r.MaxOutput)
	}
	b, err := r.Body(300, false)
	if err != nil || !strings.Contains(string(b), `"max_tokens":300`) || !strings.Contains(string(b), `"max_completion_tokens":300`) {
		t.Fatalf("lowered to 300: %s %v", b, err)
	}
	r = parse(t, ChatCompletions, `{"model":"m","max_tokens":null}`)
	if b, _ = r.Body(300, false); !strings.Contains(string(b), `"max_tokens":300`) {
		t.Fatalf("a null max_tokens is left for the server to read: %s", b)
	}
	r = parse(t, Completions, `{"model":"m","prompt":"a","max_completion_tokens":1}`)
	if r.MaxOutput != 0 {
		t.Fatalf("a completion's max_completion_tokens was read as its maximum: %d", r.MaxOutput)
	}
	if b, _ = r.Body(300, false); !strings.Contains(string(b), `"max_tokens":300`) {
		t.Fatalf("completion: %s", b)
	}
}

// Gemini's fields are read under either spelling Google's JSON API
// takes; both spellings of one field are refused; a case variant no
// provider reads is not read either.
func TestGeminiSpellings(t *testing.T) {
	r := parse(t, GenerateContent, `{"generation_config":{"max_output_tokens":700,"candidate_count":3}}`)
	if r.MaxOutput != 700 || r.Choices != 3 {
		t.Fatalf("snake_case: MaxOutput %d, Choices %d", r.MaxOutput, r.Choices)
	}
	b, err := r.Body(200, false)
	if err != nil || string(b) != `{"generation_config":{"candidate_count":3,"max_output_tokens":200}}` {
		t.Fatalf("body %s %v", b, err)
	}
	r = parse(t, GenerateContent, `{"generationConfig":{"candidate_count":4,"maxOutputTokens":9}}`)
	if r.MaxOutput != 9 || r.Choices != 4 {
		t.Fatalf("mixed: MaxOutput %d, Choices %d", r.MaxOutput, r.Choices)
	}
	r = parse(t, GenerateContent, `{"generationConfig":{"MaxOutputTokens":9}}`)
	if r.MaxOutput != 0 {
		t.Fatalf("a field name no provider reads was read: MaxOutput %d", r.MaxOutput)
	}
	for _, body := range []string{
		`{"generationConfig":{},"generation_config":{"maxOutputTokens":5}}`,
		`{"generationConfig":{"maxOutputTokens":5,"max_output_tokens":50000}}`,
		`{"generationConfig":{"candidateCount":1,"candidate_count":8}}`,
		`{"generation_config":{"candidate_count":129}}`,
		`{"generation_config":[]}`,
	} {
		_, err := ParseRequest(GenerateContent, "m", []byte(body), CountTokens)
		if err == nil {
			t.Errorf("%s: accepted", body)
		} else if strings.Contains(body, `":{},"`) && !strings.Contains(err.Error(), "spelled two ways") {
			t.Errorf("%s: %v", body, err)
		}
	}
}

// Prompts given as token ids count one token per id.
func TestCountTokenIDs(t *testing.T) {
	ids := make([]string, 8000)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
	}
	one := "[" + strings.Join(ids, ", ") + "]"
	body := `{"model":"text-embedding-3-small","input":[` + strings.Repeat(one+",", 3) + one + `]}`
	if tokens, _ := CountInput([]byte(body), bytesPerToken); tokens < 32_000 {
		t.Fatalf("4 × 8,000 token ids: %d tokens", tokens)
	}
	r := parse(t, Completions, `{"model":"m","prompt":[5,6,7],"max_tokens":1}`)
	if r.Input < 3 {
		t.Fatalf("3 token ids: %d tokens", r.Input)
	}
}

// Tools and schemas are billed whole: their keys count as text.
func TestCountSchemaKeys(t *testing.T) {
	name := strings.Repeat("k", 3000)
	for _, body := range []string{
		`{"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"` + name + `":{"type":"string"}}}}}]}`,
		`{"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"properties":{"` + name + `":{}}}}}}`,
		`{"text":{"format":{"type":"json_schema","schema":{"properties":{"` + name + `":{}}}}}}`,
		`{"tools":[{"name":"f","input_schema":{"properties":{"` + name + `":{"type":"integer"}}}}]}`,
		`{"tools":[{"functionDeclarations":[{"name":"f","parameters":{"properties":{"` + name + `":{}}}}]}]}`,
		`{"functions":[{"name":"f","parameters":{"properties":{"url":{"type":"string"},"` + name + `":{}}}}]}`,
	} {
		tokens, media := CountInput([]byte(body), bytesPerToken)
		if tokens < 3000 || media != 0 {
			t.Errorf("%.60s…: %d tokens, %d media", body, tokens, media)
		}
	}
}

// A plain-text document or inline file counts as its text, not as one
// media item, however long.
func TestCountTextFiles(t *testing.T) {
	text := strings.Repeat("plain text ", 2000) // 22,000 bytes
	enc := base64.StdEncoding.EncodeToString([]byte(text))
	for _, body := range []string{
		`{"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"` + text + `"}}]}]}`,
		`{"contents":[{"parts":[{"inline_data":{"mime_type":"text/plain","data":"` + enc + `"}}]}]}`,
		`{"contents":[{"parts":[{"inlineData":{"data":"` + enc + `","mimeType":"text/plain"}}]}]}`,
	} {
		tokens, media := CountInput([]byte(body), bytesPerToken)
		if media != 0 || tokens < int64(len(text)) {
			t.Errorf("%.60s…: %d tokens, %d media; the text is %d bytes", body, tokens, media, len(text))
		}
	}
	// Other types stay media.
	body := `{"contents":[{"parts":[{"inline_data":{"mime_type":"application/pdf","data":"` + enc + `"}}]}]}`
	if _, media := CountInput([]byte(body), bytesPerToken); media != 1 {
		t.Fatalf("a PDF: %d media", media)
	}
}

// An image is reserved at least what the most detailed one bills:
// GPT-4o's 768×2048 image in 8 tiles, 85 + 8 × 170.
func TestMediaTokensBound(t *testing.T) {
	if MediaTokens < 85+8*170 {
		t.Fatalf("MediaTokens %d is below the 1,445 tokens of GPT-4o's largest high-detail image", MediaTokens)
	}
}

// A prompt of any size is counted in pieces of at most 64 KB, cut between
// words, so that the tokenizer's memory does not grow with it; the count
// of the pieces stays that of the whole, but for a token or so a cut.
func TestCountInputInPieces(t *testing.T) {
	words := strings.Repeat("lorem ipsum dolor sit amet ", 200_000) // 5.4 MB in one string
	body := []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"` + words + `"},{"role":"user","content":"` + strings.Repeat("é", 100_000) + `"}]}`)
	most, pieces := 0, 0
	var whole int64
	got, _ := CountInput(body, func(text string) int64 {
		most, pieces = max(most, len(text)), pieces+1
		if !utf8.ValidString(text) {
			t.Fatalf("a piece cut inside a character: %q", text[len(text)-4:])
		}
		n := CountTokens("gpt-4o", text)
		whole += n
		return n
	})
	if most > countChunk {
		t.Errorf("the count was given %d bytes at once, want at most %d", most, countChunk)
	}
	exact := CountTokens("gpt-4o", words) + CountTokens("gpt-4o", strings.Repeat("é", 100_000))
	if whole < exact || whole > exact+int64(pieces)*2 {
		t.Errorf("%d pieces counted %d tokens, the whole texts %d", pieces, whole, exact)
	}
	if got < whole {
		t.Errorf("CountInput %d, below its text's %d", got, whole)
	}
}

// BenchmarkCountLargePrompt counts a 5 MB prompt with GPT-4o's encoding.
func BenchmarkCountLargePrompt(b *testing.B) {
	body := []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("lorem ipsum dolor sit amet ", 200_000) + `"}]}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		CountInput(body, func(text string) int64 { return CountTokens("gpt-4o", text) })
	}
}

// A stream whose lines end with CR alone, as server-sent events allow,
// streams event by event (it once waited for its end), and its usage is
// read; so are CRLF lines split between reads.
func TestStreamLineEndings(t *testing.T) {
	for _, nl := range []string{"\r", "\r\n", "\n"} {
		pr, pw := io.Pipe()
		var got *meter
		b := newMeteredBody(pr, ChatCompletions, true, false, func(m *meter, _ bool) { got = m })
		first := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}" + nl + nl
		go func() {
			_, _ = io.WriteString(pw, first)
		}()
		buf := make([]byte, 4096)
		read := make(chan error, 1)
		var n int
		go func() {
			var err error
			n, err = io.ReadAtLeast(b, buf, len(first))
			read <- err
		}()
		select {
		case err := <-read:
			if err != nil || string(buf[:n]) != first {
				t.Fatalf("%q: the first event read as %q (%v)", nl, buf[:n], err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%q: the first event is held back until the stream ends", nl)
		}
		go func() {
			// The rest, its line ends split between writes.
			for _, part := range strings.SplitAfter(`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}`+nl+nl+"data: [DONE]"+nl+nl, "\r") {
				_, _ = io.WriteString(pw, part)
			}
			pw.Close()
		}()
		if _, err := io.Copy(io.Discard, b); err != nil {
			t.Fatal(err)
		}
		if got == nil || got.usage != (units.Tokens{3, 0, 0, 4, 0}) {
			t.Errorf("%q: usage %+v", nl, got)
		}
	}
}

// The service tier is the document's own (or its response's), read by
// its place like usage: a "service_tier" the model writes is not it.
// Anthropic's hour-long cache writes and web searches are read apart.
func TestBilledExtrasByStructure(t *testing.T) {
	for _, c := range []struct {
		name string
		api  API
		body string
		want units.Tokens
		tier string
	}{
		{"openai, a tier in the answer's text and a tool's arguments", ChatCompletions,
			`{"choices":[{"message":{"content":"\"service_tier\":\"flex\"","tool_calls":[{"function":{"arguments":{"service_tier":"flex"}}}]}}],"service_tier":"priority",` +
				`"usage":{"prompt_tokens":40,"completion_tokens":30,"prompt_tokens_details":{"cached_tokens":5,"audio_tokens":15},"completion_tokens_details":{"reasoning_tokens":4,"audio_tokens":20}}}`,
			units.Tokens{units.Input: 20, units.CachedInput: 5, units.AudioInput: 15, units.Output: 6, units.Reasoning: 4, units.AudioOutput: 20}, "priority"},
		{"openai responses", Responses,
			`{"object":"response","output":[{"content":[{"text":"{\"service_tier\":\"flex\"}"}]}],"service_tier":"flex","usage":{"input_tokens":3,"output_tokens":2}}`,
			units.Tokens{units.Input: 3, units.Output: 2}, "flex"},
		{"openai, parts beyond their whole", ChatCompletions,
			`{"usage":{"prompt_tokens":10,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":8,"audio_tokens":8},"completion_tokens_details":{"reasoning_tokens":-3,"audio_tokens":99}}}`,
			units.Tokens{units.CachedInput: 8, units.AudioInput: 2, units.AudioOutput: 10}, ""},
		{"anthropic", Messages,
			`{"type":"message","content":[{"type":"text","text":"x"}],"usage":{"input_tokens":10,"output_tokens":7,"cache_read_input_tokens":3,"cache_creation_input_tokens":50,` +
				`"cache_creation":{"ephemeral_5m_input_tokens":20,"ephemeral_1h_input_tokens":30},"server_tool_use":{"web_search_requests":4},"service_tier":"priority"}}`,
			units.Tokens{units.Input: 10, units.CachedInput: 3, units.CacheWrite: 20, units.CacheWriteLong: 30, units.Output: 7, units.WebSearch: 4}, "priority"},
		{"gemini audio", GenerateContent,
			`{"candidates":[],"usageMetadata":{"promptTokenCount":100,"candidatesTokenCount":50,"promptTokensDetails":[{"modality":"TEXT","tokenCount":36},{"modality":"AUDIO","tokenCount":64}],` +
				`"candidatesTokensDetails":[{"modality":"AUDIO","tokenCount":45}]}}`,
			units.Tokens{units.Input: 36, units.AudioInput: 64, units.Output: 5, units.AudioOutput: 45}, ""},
	} {
		for _, piece := range []int{1, 5, 1 << 30} {
			var got *meter
			b := newMeteredBody(io.NopCloser(&pieces{data: []byte(c.body), n: piece}), c.api, false, false, func(m *meter, _ bool) { got = m })
			if _, err := io.Copy(io.Discard, b); err != nil {
				t.Fatal(err)
			}
			if got == nil || got.usage != c.want || got.tier != c.tier {
				t.Errorf("%s, in pieces of %d: usage %v tier %q, want %v %q", c.name, piece, got.usage, got.tier, c.want, c.tier)
			}
		}
	}
	// Streamed: Anthropic's message_delta carries the cumulative cache
	// writes and searches; OpenAI's last chunk its tier.
	m := &meter{api: Messages}
	m.observe([]byte(`{"type":"message_start","message":{"usage":{"input_tokens":5,"output_tokens":1,"service_tier":"standard"}}}`))
	m.observe([]byte(`{"type":"message_delta","usage":{"output_tokens":9,"cache_creation_input_tokens":12,"cache_creation":{"ephemeral_1h_input_tokens":12},"server_tool_use":{"web_search_requests":2}}}`))
	if want := (units.Tokens{units.Input: 5, units.Output: 9, units.CacheWriteLong: 12, units.WebSearch: 2}); m.usage != want || m.tier != "standard" {
		t.Errorf("anthropic stream: %v %q, want %v standard", m.usage, m.tier, want)
	}
}

// What a request may be billed beyond text is in its reservation: its
// audio (a WAV's duration from its header, other audio at the lowest
// rate a codec plays), an audio answer when it asks for one, an hour's
// cache writes when it may make them, its web searches, the tier it asks
// for and a long prompt's rates.
func TestReserveBilledExtras(t *testing.T) {
	second := make([]byte, 44+32000) // 1 s of 16 kHz 16-bit PCM
	copy(second, "RIFF")
	copy(second[8:], "WAVEfmt ")
	second[16] = 16
	second[20], second[22] = 1, 1
	second[24], second[25] = 0x80, 0x3e // 16000
	second[32], second[34] = 2, 16
	copy(second[36:], "data")
	wav := base64.StdEncoding.EncodeToString(second)
	mp3 := base64.StdEncoding.EncodeToString(mp3Frames(3828)) // 100 s of 128 kbit/s frames
	if got := audioTokensJSON([]byte(`"` + wav + `"`)); got != 33 {
		t.Errorf("a second of WAV: %d tokens, want 33 (32/s, its 44-byte header rounded up)", got)
	}
	if got := audioTokensJSON([]byte(`"` + mp3 + `"`)); got != 3200 {
		t.Errorf("100 s of MP3: %d tokens, want 3200 (32/s)", got)
	}
	// 8-bit mono at 100 Hz: 600 s in 60 KB, by its header.
	slow := bytes.Clone(second[:44])
	slow[24], slow[25], slow[32], slow[34] = 100, 0, 1, 8
	slow = append(slow, make([]byte, 60_000)...)
	if got := audioTokensJSON([]byte(`"` + base64.StdEncoding.EncodeToString(slow) + `"`)); got != (60_044*32+99)/100 {
		t.Errorf("60 KB of 100 Hz WAV: %d tokens, want 600 s worth", got)
	}
	// FLAC of 8 hours of silence, 58 KB: by its stream header.
	flac := []byte("fLaC\x00\x00\x00\x22")
	si := make([]byte, 34)
	binary.BigEndian.PutUint64(si[10:], 8000<<44|uint64(8000*28800))
	flac = append(append(flac, si...), make([]byte, 58_000)...)
	if got := audioTokensJSON([]byte(`"` + base64.StdEncoding.EncodeToString(flac) + `"`)); got != 28800*32 {
		t.Errorf("8 h of FLAC: %d tokens, want %d", got, 28800*32)
	}
	// FLAC whose stream header claims 1 s but whose frames hold an hour:
	// the frames, as a decoder reads them.
	lying := []byte("fLaC\x80\x00\x00\x22")
	si = make([]byte, 34)
	binary.BigEndian.PutUint64(si[10:], 8000<<44|8000)
	lying = append(lying, si...)
	for n := range 7032 { // 4,096 samples at 8 kHz each: 3,600 s
		h := utf8.AppendRune([]byte{0xFF, 0xF8, 0xC4, 0x02}, rune(n))
		h = append(h, crc8(h))
		lying = append(append(lying, h...), 0x00, 0x80, 0x12, 0x34) // a constant subframe, CRC-16
	}
	if got := audioTokensJSON([]byte(`"` + base64.StdEncoding.EncodeToString(lying) + `"`)); got < 3600*32 || got > 3601*32 {
		t.Errorf("FLAC claiming 1 s with an hour of frames: %d tokens, want %d", got, 3600*32)
	}
	// The same behind an ID3 tag, or bare frames without the stream
	// header: a decoder plays both.
	id3 := append([]byte("ID3\x04\x00\x00\x00\x00\x00\x0a"), make([]byte, 10)...)
	for name, clip := range map[string][]byte{"behind an ID3 tag": append(id3, lying...), "bare frames": lying[8+34:]} {
		if got := audioTokensJSON([]byte(`"` + base64.StdEncoding.EncodeToString(clip) + `"`)); got < 3600*32 || got > 3601*32 {
			t.Errorf("an hour of FLAC frames %s: %d tokens, want %d", name, got, 3600*32)
		}
	}
	// Ogg Opus: its packets' frames (20 ms each), whatever its pages'
	// granule positions claim.
	for _, granule := range []uint64{48000 * 60, 48} {
		ogg := oggPage(2, 0, [][]byte{[]byte("OpusHead\x01\x01\x38\x01\x80\xbb\x00\x00\x00\x00\x00")})
		ogg = append(ogg, oggPage(0, 0, [][]byte{[]byte("OpusTags")})...)
		for range 60 {
			ogg = append(ogg, oggPage(0, granule, slices.Repeat([][]byte{{0xF8, 0xFF, 0xFE}}, 50))...)
		}
		if got := audioTokensJSON([]byte(`"` + base64.StdEncoding.EncodeToString(ogg) + `"`)); got != 60*32 {
			t.Errorf("a minute of Opus, granules at %d: %d tokens, want %d", granule, got, 60*32)
		}
	}
	// A WAV of a compressed encoding (ADPCM), an AAC file, base64 that is
	// not: their length is not known, and the bound is the most a call
	// may take.
	adpcm := bytes.Clone(second)
	adpcm[20] = 2
	for name, clip := range map[string]string{"adpcm": base64.StdEncoding.EncodeToString(adpcm),
		"aac": base64.StdEncoding.EncodeToString(append([]byte("\xff\xf1\x50\x80"), make([]byte, 1000)...)), "garbage": "%%%"} {
		if got := audioTokensJSON([]byte(`"` + clip + `"`)); got != MaxMediaTokens {
			t.Errorf("%s: %d tokens, want MaxMediaTokens", name, got)
		}
	}
	parse := func(api API, model, body string) *Request {
		t.Helper()
		r, err := ParseRequest(api, model, []byte(body), func(_, s string) int64 { return int64(len(s)) })
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := parse(ChatCompletions, "", `{"model":"gpt-4o-audio-preview","modalities":["text","audio"],"service_tier":"priority","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"`+mp3+`","format":"mp3"}}]}]}`)
	if r.AudioInput != 3200 || !r.AudioOutput || r.ServiceTier != "priority" || r.Input < 3200 || r.Input > 3200+64 {
		t.Errorf("openai audio: audio %d of input %d, audio out %v, tier %q", r.AudioInput, r.Input, r.AudioOutput, r.ServiceTier)
	}
	// PDFs by their pages: counted where the page objects are plain,
	// else the most pages a provider reads; by URL, the most.
	pdf := func(body string) string {
		return base64.StdEncoding.EncodeToString([]byte("%PDF-1.7\n" + body))
	}
	threePages := pdf("1 0 obj <</Type /Pages /Count 3>> 2 0 obj <</Type/Page>> 3 0 obj <</Type /Page /Parent 1 0 R>> 4 0 obj <</Type\n/Page>>")
	packed := pdf("5 0 obj <</Type /ObjStm /N 100>> stream ... endstream")
	for name, c := range map[string]struct {
		api  API
		body string
		want int64
	}{
		"claude, 3 pages":    {Messages, `{"model":"c","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` + threePages + `"}}]}]}`, 3 * PageTokens},
		"claude, packed":     {Messages, `{"model":"c","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` + packed + `"}}]}]}`, MaxPDFPages * PageTokens},
		"claude, by URL":     {Messages, `{"model":"c","max_tokens":1,"messages":[{"role":"user","content":[{"source":{"url":"https://x/a.pdf","type":"url"},"type":"document"}]}]}`, MaxPDFPages * PageTokens},
		"openai, a data URL": {ChatCompletions, `{"model":"m","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,` + threePages + `"}}]}]}`, 3 * PageTokens},
		"gemini, by URI":     {GenerateContent, `{"contents":[{"parts":[{"file_data":{"mime_type":"application/pdf","file_uri":"gs://b/a.pdf"}}]}]}`, MaxPDFPages * PageTokens},
	} {
		model := ""
		if c.api == GenerateContent {
			model = "gemini-2.5-flash"
		}
		r := parse(c.api, model, c.body)
		if r.Input < c.want || r.Input > c.want+200 || r.Media != 1 {
			t.Errorf("%s: input %d (%d media), want %d and its framing", name, r.Input, r.Media, c.want)
		}
	}
	// The page tree as a reader walks it: a page listed 30 times, a node
	// shared by 3 parents; names written with escapes are not read.
	for name, c := range map[string]struct {
		pdf  string
		want int64
	}{
		"listed 30 times": {"1 0 obj <</Type /Pages /Kids [" + strings.Repeat("2 0 R ", 30) + "] /Count 30>> endobj 2 0 obj <</Type /Page>> endobj", 30},
		"a shared node":   {"1 0 obj <</Type /Pages /Kids [3 0 R 3 0 R 3 0 R]>> endobj 3 0 obj <</Type /Pages /Kids [4 0 R 5 0 R]>> endobj 4 0 obj <</Type /Page>> endobj 5 0 obj <</Type /Page>> endobj", 6},
		"a cycle":         {"1 0 obj <</Type /Pages /Kids [2 0 R]>> endobj 2 0 obj <</Type /Pages /Kids [1 0 R]>> endobj", MaxPDFPages},
		"escaped names":   {"1 0 obj <</Typ#65 /Pag#65>> endobj", 0},
		"indirect kids":   {"1 0 obj <</Type /Pages /Kids 4 0 R>> endobj 4 0 obj [" + strings.Repeat("2 0 R ", 40) + "] endobj 2 0 obj <</Type /Page>> endobj", 40},
		"a string first":  {"1 0 obj <</T (/Kids [2 0 R]) /Type /Pages /Kids [" + strings.Repeat("2 0 R", 40) + "]>> endobj 2 0 obj <</Type /Page>> endobj", 40},
		"a stated count":  {"1 0 obj <</Type /Pages /Kids [2 0 R] /Count 70>> endobj 2 0 obj <</Type /Page>> endobj", 70},
		"a later object of the same number": {"1 0 obj <</Type /Catalog /Pages 2 0 R>> endobj 2 0 obj <</Type /Pages /Kids [" + strings.Repeat("3 0 R ", 40) +
			"] /Count 40>> endobj 3 0 obj <</Type /Page>> endobj % 2 0 obj << /Type /Pages /Kids [3 0 R] /Count 1 >> endobj", 40},
	} {
		if got := pdfPages([]byte("%PDF-1.7\n" + c.pdf)); got != c.want {
			t.Errorf("%s: %d pages, want %d", name, got, c.want)
		}
	}
	// An image as tall as 40 of Gemini's 768-pixel tiles: 258 tokens each.
	png := make([]byte, 33)
	copy(png, "\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR")
	binary.BigEndian.PutUint32(png[16:], 768)
	binary.BigEndian.PutUint32(png[20:], 30000)
	tall := base64.StdEncoding.EncodeToString(png)
	r = parse(GenerateContent, "gemini-2.5-flash", `{"contents":[{"parts":[{"inline_data":{"mime_type":"image/png","data":"`+tall+`"}}]}]}`)
	if want := int64(40 * 258); r.Input < want || r.Input > want+50 {
		t.Errorf("a 768×30000 image: input %d, want %d and framing", r.Input, want)
	}
	small := base64.StdEncoding.EncodeToString(png[:16])
	r = parse(ChatCompletions, "", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,`+small+`"}}]}]}`)
	if r.Input < MediaTokens || r.Input > MediaTokens+50 {
		t.Errorf("an image whose size is not read: input %d, want MediaTokens", r.Input)
	}
	// Read as the provider unescapes it: a media type with \/, a key with
	// \u escapes, base64 with an escaped character.
	flacB64 := base64.StdEncoding.EncodeToString(flac)
	for name, body := range map[string]string{
		"audio\\/flac":    `{"contents":[{"parts":[{"inline_data":{"mime_type":"audio\/flac","data":"` + flacB64 + `"}}]}]}`,
		"mime\\u005ftype": `{"contents":[{"parts":[{"inline\u005fdata":{"mime\u005ftype":"audio/flac","data":"` + flacB64 + `"}}]}]}`,
		"escaped base64":  `{"contents":[{"parts":[{"inline_data":{"mime_type":"audio/flac","data":"` + fmt.Sprintf(`\u%04x`, flacB64[0]) + flacB64[1:] + `"}}]}]}`,
	} {
		if r := parse(GenerateContent, "gemini-2.5-flash", body); r.AudioInput != 28800*32 {
			t.Errorf("%s: audio %d tokens, want %d", name, r.AudioInput, 28800*32)
		}
	}
	// WAV whose block size lies: its frames are its channels' samples.
	for _, align := range []byte{0xFF, 4} {
		lie := bytes.Clone(slow)
		lie[32], lie[33] = align, align&0xF0
		if got := audioTokensJSON([]byte(`"` + base64.StdEncoding.EncodeToString(lie) + `"`)); got != (60_044*32+99)/100 {
			t.Errorf("100 Hz WAV with a block size of %d: %d tokens, want 600 s worth", int(align)|int(align&0xF0)<<8, got)
		}
	}
	// Files by id or URL: a document unless an image; Gemini's by URI of
	// no stated type, the most a call may take.
	for name, c := range map[string]struct {
		api  API
		body string
		want int64
	}{
		"chat file_id":          {ChatCompletions, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-abc"}}]}]}`, documentTokensJSON(nil)},
		"responses file_url":    {Responses, `{"model":"gpt-4o","input":[{"role":"user","content":[{"type":"input_file","file_url":"https://x/a.pdf"}]}]}`, documentTokensJSON(nil)},
		"responses image id":    {Responses, `{"model":"gpt-4o","input":[{"role":"user","content":[{"type":"input_image","file_id":"file-abc"}]}]}`, MediaTokens},
		"gemini fileData":       {GenerateContent, `{"contents":[{"parts":[{"fileData":{"fileUri":"https://youtube.com/watch?v=x"}}]}]}`, MaxMediaTokens},
		"gemini file_data":      {GenerateContent, `{"contents":[{"parts":[{"file_data":{"file_uri":"https://youtube.com/watch?v=x"}}]}]}`, MaxMediaTokens},
		"gemini fileData video": {GenerateContent, `{"contents":[{"parts":[{"fileData":{"mimeType":"video/mp4","fileUri":"gs://b/v.mp4"}}]}]}`, MaxMediaTokens},
	} {
		model := ""
		if c.api == GenerateContent {
			model = "gemini-2.5-flash"
		}
		if r := parse(c.api, model, c.body); r.Input < c.want || r.Input > c.want+100 {
			t.Errorf("%s: input %d, want %d and framing", name, r.Input, c.want)
		}
	}
	// A video, or audio named by URL: the most a call may take.
	r = parse(GenerateContent, "gemini-2.5-flash", `{"contents":[{"parts":[{"file_data":{"mime_type":"audio/mp3","file_uri":"https://x/a.mp3"}},{"inline_data":{"mime_type":"video/mp4","data":"AAAA"}}]}]}`)
	if r.AudioInput != MaxMediaTokens || r.Input < 2*MaxMediaTokens || r.Media != 2 {
		t.Errorf("gemini audio by URL and an inline video: audio %d of input %d, %d media", r.AudioInput, r.Input, r.Media)
	}
	if r := parse(ChatCompletions, "", `{"model":"m","messages":[{"role":"user","content":"audio"}]}`); r.AudioOutput || r.AudioInput != 0 {
		t.Errorf("text only: audio %d, audio out %v", r.AudioInput, r.AudioOutput)
	}
	r = parse(Messages, "", `{"model":"c","max_tokens":10,"tools":[{"type":"web_search_20250305","max_uses":3},{"type":"web_search_20250305"},{"name":"f","input_schema":{}}],"system":[{"type":"text","text":"x","cache_control":{"type":"ephemeral","ttl":"\u0031h"}}],"messages":[]}`)
	if r.Searches != 3+DefaultSearches || !r.CacheLong {
		t.Errorf("anthropic tools: searches %d, cache for an hour %v", r.Searches, r.CacheLong)
	}
	if r := parse(Messages, "", `{"model":"c","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`); r.CacheLong || r.Searches != 0 {
		t.Errorf("plain: cache for an hour %v, searches %d", r.CacheLong, r.Searches)
	}
	r = parse(Responses, "", `{"model":"gpt-5","input":"x","tools":[{"type":"web_search"},{"type":"web_search_preview"}],"max_tool_calls":3}`)
	if r.Searches != 3 {
		t.Errorf("responses: %d searches, want max_tool_calls 3", r.Searches)
	}
	r = parse(GenerateContent, "gemini-2.5-flash", `{"contents":[{"parts":[{"inline_data":{"mime_type":"audio/wav","data":"`+wav+`"}}]}],"tools":[{"google_search":{}}],"generation_config":{"response_modalities":["AUDIO"]}}`)
	if r.AudioInput != 33 || !r.AudioOutput || r.Searches != DefaultSearches {
		t.Errorf("gemini: audio %d, audio out %v, searches %d", r.AudioInput, r.AudioOutput, r.Searches)
	}

	// The bound: every kind at the most the call may be billed it.
	price := Price{Rates: Rates{units.Input: 1, units.CachedInput: 1, units.CacheWrite: 2, units.CacheWriteLong: 5, units.Output: 10,
		units.AudioInput: 40, units.AudioOutput: 80, units.WebSearch: 1000},
		LongContextAbove: 1000, LongContext: Rates{units.Input: 3, units.Output: 30},
		Tiers: map[string]*Price{"priority": {Rates: Rates{units.Input: 7, units.Output: 70}}}}
	req := &Request{Input: 500, AudioInput: 200, Choices: 2, Searches: 3}
	var want units.Tokens
	want[units.CacheWrite], want[units.AudioInput], want[units.Output], want[units.WebSearch] = 300, 200, 200, 3
	if got, cost := heaviest(price.bound("", req.Input), req, 100, func(t units.Tokens) int64 {
		return int64(t[units.CacheWrite]*2 + t[units.AudioInput]*40 + t[units.Output]*10 + t[units.WebSearch]*1000)
	}), int64(300*2+200*40+200*10+3*1000); got != cost {
		t.Errorf("bound %d, want %d (%v)", got, cost, want)
	}
	req.CacheLong, req.AudioOutput = true, true
	r2 := price.bound("", req.Input)
	if got, cost := heaviest(r2, req, 100, r2.Cost), r2.Cost(units.Tokens{units.CacheWriteLong: 300, units.AudioInput: 200, units.AudioOutput: 200, units.WebSearch: 3}); got != cost {
		t.Errorf("with audio out and an hour's cache: bound %d, want %d", got, cost)
	}
	if b := price.bound("priority", 10); b[units.Input] != 7 || b[units.Output] != 70 {
		t.Errorf("priority bound %v", b)
	}
	if b := price.bound("", 5000); b[units.Input] != 3 || b[units.Output] != 30 || b[units.AudioOutput] != 80 {
		t.Errorf("a long prompt's bound %v: each kind at the higher of its rates", b)
	}
	if c := price.Cost("flex", units.Tokens{units.Input: 1000}); c != 1 {
		t.Errorf("an unpriced tier costs the model's rates: %d", c)
	}
	if c := price.Cost("priority", units.Tokens{units.Input: 1_000_000}); c != 7 {
		t.Errorf("priority: %d", c)
	}
	if c := price.Cost("", units.Tokens{units.Input: 600_000, units.CachedInput: 500_000}); c != 2 {
		t.Errorf("a long prompt (1.1M tokens): %d, want the long-context rate 3 × 0.6 rounded up", c)
	}
}

// An image sent to a model that counts images in more, cheaper tokens is
// reserved at that model's worst case: gpt-4o-mini's high-detail image is
// 48,169 tokens, not the 2,048 of other models.
// oggPage returns one Ogg page of packets (each under 255 bytes).
func oggPage(headerType byte, granule uint64, packets [][]byte) []byte {
	p := append([]byte("OggS\x00"), headerType)
	p = binary.LittleEndian.AppendUint64(p, granule)
	p = append(p, make([]byte, 12)...) // serial, sequence, checksum
	p = append(p, byte(len(packets)))
	for _, pk := range packets {
		p = append(p, byte(len(pk)))
	}
	for _, pk := range packets {
		p = append(p, pk...)
	}
	return p
}

// mp3Frames returns n frames of MPEG-1 Layer III at 128 kbit/s, 44.1 kHz:
// 1,152 samples each.
func mp3Frames(n int) []byte {
	frame := make([]byte, 417)
	binary.BigEndian.PutUint32(frame, 0xFFFB9000)
	return bytes.Repeat(frame, n)
}

func TestImageTokensByModel(t *testing.T) {
	body := func(model string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png","detail":"high"}},` +
			`{"type":"input_audio","input_audio":{"data":"AAAA","format":"mp3"}}]}]}`
	}
	count := func(_, s string) int64 { return int64(len(s)) }
	base, err := ParseRequest(ChatCompletions, "", []byte(body("gpt-4o")), count)
	if err != nil {
		t.Fatal(err)
	}
	for model, per := range map[string]int64{"gpt-4o-mini-2024-07-18": 48_169, "gpt-4.1-nano": 3_779, "gpt-4o": MediaTokens} {
		r, err := ParseRequest(ChatCompletions, "", []byte(body(model)), count)
		if err != nil {
			t.Fatal(err)
		}
		// One image, and one audio clip bound by its duration instead.
		if got, want := r.Input-base.Input, per-MediaTokens; r.Media != 2 || got != want {
			t.Errorf("%s: input %d (media %d), %d more than gpt-4o's, want %d", model, r.Input, r.Media, got, want)
		}
	}
}

// FuzzTopFields: the fields topFields finds in place are those
// encoding/json decodes, byte for byte.
func FuzzTopFields(f *testing.F) {
	f.Add(`{"model":"m","max_tokens":10}`)
	f.Add(` { "a" : [1,{"b":"}"}] , "\u0061":"x\"y" ,"n":-1.5e3,"t":true,"z":null} `)
	f.Add(`[1,2]`)
	f.Fuzz(func(t *testing.T, doc string) {
		var want map[string]json.RawMessage
		wantErr := json.Unmarshal([]byte(doc), &want) != nil || want == nil
		got := topFields([]byte(doc))
		if wantErr != (got == nil) {
			t.Fatalf("%q: topFields %v, encoding/json error %v", doc, got, wantErr)
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %d fields, want %d", doc, len(got), len(want))
		}
		for k, v := range want {
			if !bytes.Equal(got[k], v) {
				t.Fatalf("%q: field %q = %q, want %q", doc, k, got[k], v)
			}
		}
	})
}

// A prompt of 15 million token ids is counted in place: the request is
// read without copying or decoding it.
func TestLargePromptNotCopied(t *testing.T) {
	body := []byte(`{"model":"gpt-3.5-turbo-instruct","max_tokens":10,"prompt":[` + strings.TrimSuffix(strings.Repeat("1,", 15_000_000), ",") + `]}`)
	allocs := testing.AllocsPerRun(1, func() {
		r, err := ParseRequest(Completions, "", body, func(_, s string) int64 { return int64(len(s)) })
		if err != nil || r.Input < 15_000_000 || r.Choices != 1 {
			t.Fatalf("%+v %v", r, err)
		}
	})
	if allocs > 100 {
		t.Errorf("%v allocations to read a prompt of token ids", allocs)
	}
}

// An object of more keys than any provider takes is refused before its
// keys are checked for duplicates, which keeps them.
func TestObjectKeysBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[],"logit_bias":{`)
	for i := range maxObjectKeys + 1 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + strconv.Itoa(i) + `":1`)
	}
	b.WriteString(`}}`)
	if _, err := ParseRequest(ChatCompletions, "", []byte(b.String()), func(_, s string) int64 { return 1 }); err == nil || !strings.Contains(err.Error(), "keys") {
		t.Fatalf("an object of %d keys: %v", maxObjectKeys+1, err)
	}
	if n := mostKeys([]byte(`{"a":{"b":1,"c":[{"d":1,"e":2,"f":3}]},"g":"{\"h\":1}"}`)); n != 3 {
		t.Errorf("mostKeys = %d, want 3", n)
	}
}
