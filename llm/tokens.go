package llm

import (
	"strings"
	"sync"

	"github.com/tiktoken-go/tokenizer"
)

// The embedded OpenAI encodings, loaded on first use (each holds its
// vocabulary in memory).
var (
	o200k  = sync.OnceValue(func() tokenizer.Codec { c, _ := tokenizer.Get(tokenizer.O200kBase); return c })
	cl100k = sync.OnceValue(func() tokenizer.Codec { c, _ := tokenizer.Get(tokenizer.Cl100kBase); return c })
)

// codecFor returns the embedded encoding of an OpenAI model, nil for
// models of other providers.
func codecFor(model string) tokenizer.Codec {
	m := strings.ToLower(model)
	if i := strings.LastIndexByte(m, '/'); i >= 0 {
		m = m[i+1:] // "openai/gpt-4o" as some gateways name it
	}
	m = strings.TrimPrefix(m, "ft:")
	switch {
	case strings.HasPrefix(m, "gpt-4o"), strings.HasPrefix(m, "gpt-4.1"), strings.HasPrefix(m, "gpt-4.5"),
		strings.HasPrefix(m, "gpt-5"), strings.HasPrefix(m, "gpt-oss"), strings.HasPrefix(m, "chatgpt-"),
		strings.HasPrefix(m, "o1"), strings.HasPrefix(m, "o3"), strings.HasPrefix(m, "o4"),
		strings.HasPrefix(m, "codex-"), strings.HasPrefix(m, "omni-"):
		return o200k()
	case strings.HasPrefix(m, "gpt-4"), strings.HasPrefix(m, "gpt-3.5"), strings.HasPrefix(m, "gpt-35"),
		strings.HasPrefix(m, "text-embedding-"), strings.HasPrefix(m, "davinci-002"), strings.HasPrefix(m, "babbage-002"):
		return cl100k()
	}
	return nil
}

// CountTokens estimates the tokens of text for model, offline: exactly
// with the model's own encoding for OpenAI models (o200k_base or
// cl100k_base, embedded), and as one token per 3 bytes of UTF-8, rounded
// up, for the others, whose tokenizers are not public: about 3.5 to 4
// characters of English make a Claude or Gemini token, and a CJK
// character (3 bytes) about one, so the estimate is above the count
// for most text. Settlement corrects it with the provider's report.
func CountTokens(model, text string) int64 {
	if c := codecFor(model); c != nil {
		if n, err := c.Count(text); err == nil {
			return int64(n)
		}
	}
	return int64(len(text)+2) / 3
}
