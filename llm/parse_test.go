package llm

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/admitdev/admit/policy"
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
	if want := (policy.Tokens{20, 5, 0, 25, 0}); m.usage != want {
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
	if want := (policy.Tokens{20, 10, 0, 9, 7}); g.usage != want {
		t.Fatalf("gemini usage %v, want %v", g.usage, want)
	}
	o := meter{api: ChatCompletions}
	o.observeTail([]byte(`{"choices":[{"message":{"content":"say \"usage\": {}"}}],"usage":{"prompt_tokens":12,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":2},"completion_tokens_details":{"reasoning_tokens":3}}}`))
	if want := (policy.Tokens{10, 2, 0, 5, 3}); o.usage != want {
		t.Fatalf("openai usage %v, want %v", o.usage, want)
	}
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
