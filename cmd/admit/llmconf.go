package main

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/policy"
)

// LLMConfig is the llm section: the LLM providers admit proxy forwards
// tenants' calls to, and how it meters them. Rules count tokens or money
// with unit: tokens or unit: money (see policy.RuleSpec).
type LLMConfig struct {
	// Providers are "openai" (and any server that speaks its API),
	// "anthropic" and "gemini", each with its base URL and the
	// platform's key, usually from the environment:
	// ${OPENAI_BASE_URL}, ${OPENAI_API_KEY} and so on.
	Providers map[string]LLMProviderConfig `json:"providers"`
	// DefaultMaxOutput is the most output tokens a call that sets no
	// maximum may produce (default 4096); MinOutput the fewest its
	// budgets may leave it before it is refused (default 1).
	DefaultMaxOutput int64 `json:"default_max_output"`
	MinOutput        int64 `json:"min_output"`
	// LowerMaxOutput lowers a call's own maximum to what its budgets
	// leave, where it would be refused.
	LowerMaxOutput bool `json:"lower_max_output"`
	// MaxBody bounds a call's request body, in bytes; default 32 MiB.
	MaxBody int64 `json:"max_body"`
	// DrainOnDisconnect, a duration, keeps a call whose client left going
	// for up to that long, so that the provider's own usage report
	// settles it (default 1m); "0s" cancels it at once. A call that
	// settles without its report is charged its reservation.
	DrainOnDisconnect string `json:"drain_on_disconnect"`
	// Currency names the prices' currency, for records and metrics;
	// default USD.
	Currency string `json:"currency"`
	// Prices are each model's prices per million tokens, as decimal
	// amounts of the currency.
	Prices map[string]LLMPriceConfig `json:"prices"`
}

// LLMProviderConfig is one provider of the llm section.
type LLMProviderConfig struct {
	BaseURL string `json:"base_url"`
	APIKey  string `json:"api_key"`
	// MaxTokensField is the field Admit writes a chat completion's
	// maximum output in when the call sets none: max_completion_tokens
	// (the default, OpenAI's) or max_tokens (servers that predate it).
	MaxTokensField string `json:"max_tokens_field"`
}

// LLMPriceConfig is a model's prices per million tokens. Cached input and
// cache writes cost what input costs unless set; reasoning what output
// costs.
type LLMPriceConfig struct {
	Input       string `json:"input"`
	CachedInput string `json:"cached_input"`
	CacheWrite  string `json:"cache_write"`
	Output      string `json:"output"`
	Reasoning   string `json:"reasoning"`
}

// The providers' own base URLs, for a provider configured without one.
var defaultBaseURLs = map[string]string{
	"openai":    "https://api.openai.com/v1",
	"anthropic": "https://api.anthropic.com",
	"gemini":    "https://generativelanguage.googleapis.com",
}

var providerNames = map[string]llm.Provider{"openai": llm.OpenAI, "anthropic": llm.Anthropic, "gemini": llm.Gemini}

// upstreams returns the configured providers.
func (c *LLMConfig) upstreams() (map[llm.Provider]llm.Upstream, error) {
	out := map[llm.Provider]llm.Upstream{}
	for _, name := range slices.Sorted(maps.Keys(c.Providers)) {
		p := c.Providers[name]
		prov, ok := providerNames[name]
		if !ok {
			return nil, &fieldError{"llm.providers." + name, fmt.Sprintf("unknown provider %q: want openai, anthropic or gemini", name)}
		}
		base := p.BaseURL
		if base == "" {
			base = defaultBaseURLs[name]
		}
		u, err := url.Parse(base)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
			return nil, &fieldError{"llm.providers." + name + ".base_url", fmt.Sprintf("%q: want an http:// or https:// URL with a host", base)}
		}
		if strings.TrimSpace(p.APIKey) == "" {
			return nil, &fieldError{"llm.providers." + name + ".api_key", "empty: the platform's key for " + name + " (is its environment variable set?)"}
		}
		legacy := false
		switch p.MaxTokensField {
		case "", "max_completion_tokens":
		case "max_tokens":
			legacy = true
		default:
			return nil, &fieldError{"llm.providers." + name + ".max_tokens_field", fmt.Sprintf("%q: want max_completion_tokens or max_tokens", p.MaxTokensField)}
		}
		out[prov] = llm.Upstream{BaseURL: u, APIKey: strings.TrimSpace(p.APIKey), LegacyMaxTokens: legacy}
	}
	return out, nil
}

// prices returns the configured prices in millionths per million tokens.
func (c *LLMConfig) prices() (map[string]llm.Price, error) {
	out := map[string]llm.Price{}
	for model, pc := range c.Prices {
		path := "llm.prices." + model
		var p llm.Price
		for _, f := range []struct {
			kind policy.TokenKind
			v    string
			def  policy.TokenKind
		}{{policy.Input, pc.Input, -1}, {policy.Output, pc.Output, -1}, {policy.CachedInput, pc.CachedInput, policy.Input},
			{policy.CacheWrite, pc.CacheWrite, policy.Input}, {policy.Reasoning, pc.Reasoning, policy.Output}} {
			name := policy.TokenKindNames[f.kind]
			if f.v == "" {
				if f.def < 0 {
					return nil, &fieldError{path + "." + name, "missing: the price of a million " + name + " tokens, like \"0.15\""}
				}
				p[f.kind] = p[f.def]
				continue
			}
			n, err := policy.ParseDecimal(f.v, 6)
			if err != nil || n > 1_000_000_000_000 {
				return nil, &fieldError{path + "." + name, fmt.Sprintf("%q: want an amount per million tokens from 0 to 1000000 with at most 6 decimals", f.v)}
			}
			p[f.kind] = n
		}
		out[model] = p
	}
	return out, nil
}

func (d *decoder) checkLLM(c *LLMConfig) {
	for _, err := range []error{errOf(c.upstreams()), errOf(c.prices())} {
		if fe, ok := err.(*fieldError); ok {
			d.failAt(fe.path, "%s", fe.msg)
		}
	}
	if c.DefaultMaxOutput < 0 || c.DefaultMaxOutput > 100_000_000 {
		d.failAt("llm.default_max_output", "%d: want 1 to 100000000", c.DefaultMaxOutput)
	}
	if c.MinOutput < 0 || c.DefaultMaxOutput > 0 && c.MinOutput > c.DefaultMaxOutput {
		d.failAt("llm.min_output", "%d: want 1 to default_max_output", c.MinOutput)
	}
	if _, err := c.drain(); err != nil {
		d.failAt("llm.drain_on_disconnect", "%v", err)
	}
	if c.MaxBody < 0 || c.MaxBody > 1<<30 {
		d.failAt("llm.max_body", "%d: want up to 1 GiB", c.MaxBody)
	}
}

func errOf[T any](_ T, err error) error { return err }

// defaultDrain is how long a call whose client left is read for the
// provider's report, unless drain_on_disconnect says otherwise: long
// enough for most answers to end (their report is what the provider
// bills), bounded so that a call left behind does not hold the proxy.
const defaultDrain = time.Minute

// drain returns drain_on_disconnect.
func (c *LLMConfig) drain() (time.Duration, error) {
	if c.DrainOnDisconnect == "" {
		return defaultDrain, nil
	}
	d, err := time.ParseDuration(c.DrainOnDisconnect)
	if err != nil || d < 0 || d > 10*time.Minute {
		return 0, fmt.Errorf("%q: want a duration from 0 to 10m", c.DrainOnDisconnect)
	}
	return d, nil
}
