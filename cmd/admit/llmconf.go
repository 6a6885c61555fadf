package main

import (
	"fmt"
	"maps"
	"math/big"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/admitdev/admit/llm"
	"github.com/admitdev/admit/units"
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

// LLMPriceConfig is a model's prices: per million tokens of each kind,
// per thousand web searches, and the model's long-context and
// service-tier prices.
type LLMPriceConfig struct {
	LLMRatesConfig
	// LongContext prices the calls whose prompt passes a number of tokens.
	LongContext *LLMLongContextConfig `json:"long_context"`
	// ServiceTiers price the calls a provider reports it served at a
	// tier, by the tier's name ("priority", "flex").
	ServiceTiers map[string]LLMTierConfig `json:"service_tiers"`
}

// LLMRatesConfig are prices per million tokens of each kind, as decimal
// amounts of the currency, and per thousand web searches. At a model's
// own rates, input and output are required; cached input, cache writes
// and audio input cost what input costs unless set, hour-long cache
// writes what cache writes cost, reasoning and audio output what output
// costs, and web searches nothing.
type LLMRatesConfig struct {
	Input        string `json:"input"`
	CachedInput  string `json:"cached_input"`
	CacheWrite   string `json:"cache_write"`
	CacheWrite1h string `json:"cache_write_1h"`
	Output       string `json:"output"`
	Reasoning    string `json:"reasoning"`
	AudioInput   string `json:"audio_input"`
	AudioOutput  string `json:"audio_output"`
	WebSearch    string `json:"web_search"`
}

// LLMLongContextConfig prices a call whose prompt (input of every kind)
// has more than Above tokens, the whole call, as Anthropic and Google
// bill long prompts. A kind it does not set costs what the rates it
// replaces say, scaled as the kind it defaults to is (see
// LLMRatesConfig).
type LLMLongContextConfig struct {
	Above int64 `json:"above"`
	LLMRatesConfig
}

// LLMTierConfig prices a service tier; a kind it does not set costs the
// model's rate, scaled as the kind it defaults to is. A tier without its
// own long context prices a long prompt at the higher of its rates and
// the model's long-context rates.
type LLMTierConfig struct {
	LLMRatesConfig
	LongContext *LLMLongContextConfig `json:"long_context"`
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

// prices returns the configured prices in millionths per million tokens
// (and per million web searches).
func (c *LLMConfig) prices() (map[string]llm.Price, error) {
	out := map[string]llm.Price{}
	for _, model := range slices.Sorted(maps.Keys(c.Prices)) {
		pc := c.Prices[model]
		path := "llm.prices." + model
		var p llm.Price
		var err error
		if p.Rates, err = pc.rates(path, nil); err != nil {
			return nil, err
		}
		if p.LongContextAbove, p.LongContext, err = pc.LongContext.rates(path+".long_context", &p.Rates); err != nil {
			return nil, err
		}
		for _, name := range slices.Sorted(maps.Keys(pc.ServiceTiers)) {
			tc := pc.ServiceTiers[name]
			tpath := path + ".service_tiers." + name
			if name == "" || len(name) > 32 {
				return nil, &fieldError{tpath, "a tier's name is from 1 to 32 characters, as the provider reports it (priority, flex)"}
			}
			tier := &llm.Price{}
			if tier.Rates, err = tc.rates(tpath, &p.Rates); err != nil {
				return nil, err
			}
			if tc.LongContext != nil {
				if tier.LongContextAbove, tier.LongContext, err = tc.LongContext.rates(tpath+".long_context", &tier.Rates); err != nil {
					return nil, err
				}
			} else if p.LongContextAbove > 0 {
				tier.LongContextAbove = p.LongContextAbove
				for k := range tier.LongContext {
					tier.LongContext[k] = max(tier.Rates[k], p.LongContext[k])
				}
			}
			if p.Tiers == nil {
				p.Tiers = map[string]*llm.Price{}
			}
			p.Tiers[name] = tier
		}
		out[model] = p
	}
	return out, nil
}

// rates parses rc at path. At a model's own rates (base nil), kinds it
// does not set cost what the kinds they default to cost; in a long
// context or a tier (base the rates it replaces), they cost what base
// says, scaled as the kind they default to is: a long context that
// doubles input doubles cache reads and audio input too.
func (rc *LLMRatesConfig) rates(path string, base *llm.Rates) (llm.Rates, error) {
	var r llm.Rates
	for _, f := range []struct {
		kind units.TokenKind
		v    string
		def  units.TokenKind // -1: required; NumTokenKinds: 0
	}{{units.Input, rc.Input, -1}, {units.Output, rc.Output, -1}, {units.CachedInput, rc.CachedInput, units.Input},
		{units.CacheWrite, rc.CacheWrite, units.Input}, {units.CacheWriteLong, rc.CacheWrite1h, units.CacheWrite},
		{units.Reasoning, rc.Reasoning, units.Output}, {units.AudioInput, rc.AudioInput, units.Input},
		{units.AudioOutput, rc.AudioOutput, units.Output}, {units.WebSearch, rc.WebSearch, units.NumTokenKinds}} {
		name := units.TokenKindNames[f.kind]
		if f.v == "" {
			switch {
			case base != nil && f.def >= 0 && f.def < units.NumTokenKinds && base[f.def] > 0:
				// Scaled as the kind it defaults to is in this block.
				n := new(big.Int).Mul(big.NewInt(base[f.kind]), big.NewInt(r[f.def]))
				n.Add(n, big.NewInt(base[f.def]-1))
				r[f.kind] = min(n.Quo(n, big.NewInt(base[f.def])).Int64(), 1_000_000_000_000_000)
			case base != nil:
				r[f.kind] = base[f.kind]
			case f.def < 0:
				return r, &fieldError{path + "." + name, "missing: the price of a million " + name + " tokens, like \"0.15\""}
			case f.def < units.NumTokenKinds:
				r[f.kind] = r[f.def]
			}
			continue
		}
		n, err := units.ParseDecimal(f.v, 6)
		if f.kind == units.WebSearch {
			// Priced per thousand searches; kept per million.
			if err != nil || n > 1_000_000_000_000 {
				return r, &fieldError{path + "." + name, fmt.Sprintf("%q: want an amount per thousand searches from 0 to 1000000 with at most 6 decimals", f.v)}
			}
			r[f.kind] = n * 1000
			continue
		}
		if err != nil || n > 1_000_000_000_000 {
			return r, &fieldError{path + "." + name, fmt.Sprintf("%q: want an amount per million tokens from 0 to 1000000 with at most 6 decimals", f.v)}
		}
		r[f.kind] = n
	}
	return r, nil
}

// rates parses a long-context block: its threshold and its rates, kinds
// it does not set costing what base says. A nil block prices nothing
// apart.
func (lc *LLMLongContextConfig) rates(path string, base *llm.Rates) (int64, llm.Rates, error) {
	if lc == nil {
		return 0, llm.Rates{}, nil
	}
	if lc.Above < 1 || lc.Above > 100_000_000 {
		return 0, llm.Rates{}, &fieldError{path + ".above", fmt.Sprintf("%d: want the prompt tokens past which the long-context prices apply, from 1 to 100000000 (200000 for Claude and Gemini)", lc.Above)}
	}
	r, err := lc.LLMRatesConfig.rates(path, base)
	return lc.Above, r, err
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
