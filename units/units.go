// Package units is what a limit counts: requests (or a cost the caller
// names), the tokens of an LLM call weighted by kind, or money in
// millionths of a currency; with the exact decimal arithmetic prices and
// weights are written in.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/wide"
)

// Unit is what a rule counts.
type Unit uint8

const (
	// UnitRequests counts requests (or the cost a caller names): the
	// default.
	UnitRequests Unit = iota
	// UnitTokens counts LLM tokens, a weighted sum of the kinds of Tokens
	// (see Weights). Only LLM calls are charged to such a rule.
	UnitTokens
	// UnitMoney counts money, in millionths of the currency the LLM
	// prices are in (micro-dollars for USD). Only LLM calls are charged
	// to such a rule.
	UnitMoney
)

// String returns the unit's configuration name.
func (u Unit) String() string {
	switch u {
	case UnitTokens:
		return "tokens"
	case UnitMoney:
		return "money"
	}
	return "requests"
}

// TokenKind is a kind of LLM token, priced apart by the providers. The
// kinds are disjoint: a prompt token is input, cached input, a cache
// write (kept 5 minutes or 1 hour) or audio input; an answer token is
// output, reasoning or audio output. WebSearch is not a token but a
// count of the web searches a provider ran for the call, billed by the
// search.
type TokenKind int

// The token kinds, in the order of Tokens.
const (
	Input          TokenKind = iota // prompt tokens read fresh
	CachedInput                     // prompt tokens read from the provider's cache
	CacheWrite                      // prompt tokens written to the provider's cache, kept 5 minutes
	Output                          // answer tokens
	Reasoning                       // reasoning ("thinking") tokens, billed as output
	AudioInput                      // prompt tokens of audio
	AudioOutput                     // answer tokens of audio
	CacheWriteLong                  // prompt tokens written to the provider's cache, kept 1 hour
	WebSearch                       // web searches run by the provider (not tokens)
	NumTokenKinds
)

// TokenKindNames are the kinds' names in configuration, metrics and
// usage records, by TokenKind.
var TokenKindNames = [NumTokenKinds]string{"input", "cached_input", "cache_write", "output", "reasoning",
	"audio_input", "audio_output", "cache_write_1h", "web_search"}

// InputKinds and OutputKinds are the kinds of a prompt's tokens and of an
// answer's.
var (
	InputKinds  = []TokenKind{Input, CachedInput, CacheWrite, CacheWriteLong, AudioInput}
	OutputKinds = []TokenKind{Output, Reasoning, AudioOutput}
)

// Tokens counts tokens by kind.
type Tokens [NumTokenKinds]int64

// Sum returns the tokens of every kind (web searches are not tokens).
func (t Tokens) Sum() int64 {
	var s int64
	for k, n := range t {
		if TokenKind(k) != WebSearch {
			s += n
		}
	}
	return s
}

// Prompt returns the prompt's tokens, of every input kind.
func (t Tokens) Prompt() int64 {
	var s int64
	for _, k := range InputKinds {
		s += t[k]
	}
	return s
}

// Weights weigh token kinds, in thousandths: a rule in tokens counts
// ⌈Σ tokens × weight ÷ 1000⌉.
type Weights [NumTokenKinds]int64

// EveryTokenWeighsOne is the default weighting: every kind of token
// counts 1; web searches, not tokens, count 0.
var EveryTokenWeighsOne = Weights{1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 0}

// Cost returns the weighted count of t, rounded up, at most bounds.MaxCost
// past which no charge goes.
func (w Weights) Cost(t Tokens) int64 {
	var sum wide.U128
	for k, n := range t {
		sum = sum.Add(wide.Mul(uint64(max(n, 0)), uint64(w[k])))
	}
	return min(sum.DivUp(1000), bounds.MaxCost)
}

// ParseWeights parses a weights map: kind name → a number from 0 to 1000
// with at most three decimals. Kinds not named weigh as
// EveryTokenWeighsOne has them.
func ParseWeights(m map[string]string) (Weights, error) {
	w := EveryTokenWeighsOne
	for name, v := range m {
		k := tokenKind(name)
		if k < 0 {
			return w, fmt.Errorf("unknown token kind %q (want %s)", name, strings.Join(TokenKindNames[:], ", "))
		}
		n, err := ParseDecimal(v, 3)
		if err != nil || n > 1_000_000 {
			return w, fmt.Errorf("weight of %s: %q is not a number from 0 to 1000 with at most 3 decimals", name, v)
		}
		w[k] = n
	}
	return w, nil
}

func tokenKind(name string) TokenKind {
	for k, n := range TokenKindNames {
		if n == name {
			return TokenKind(k)
		}
	}
	return -1
}

// ParseDecimal parses a non-negative decimal number with at most places
// decimals, such as "0.15", into an integer count of 10^-places: exactly,
// without floating point. It refuses signs, exponents and numbers past
// 10^12.
func ParseDecimal(s string, places int) (int64, error) {
	whole, frac, dot := strings.Cut(strings.TrimSpace(s), ".")
	if whole == "" && (!dot || frac == "") || len(frac) > places || len(whole) > 12 || dot && frac == "" {
		return 0, fmt.Errorf("%q: want a number with at most %d decimals", s, places)
	}
	for _, part := range []string{whole, frac} {
		for i := 0; i < len(part); i++ {
			if part[i] < '0' || part[i] > '9' {
				return 0, fmt.Errorf("%q: want a number with at most %d decimals", s, places)
			}
		}
	}
	w, _ := strconv.ParseInt("0"+whole, 10, 64)
	f, _ := strconv.ParseInt("0"+frac+strings.Repeat("0", places-len(frac)), 10, 64)
	return w*int64(math.Pow10(places)) + f, nil
}

// FormatDecimal writes n in units of 10^-places as a decimal number,
// without trailing zeros: FormatDecimal(150000, 6) is "0.15".
func FormatDecimal(n int64, places int) string {
	p := int64(math.Pow10(places))
	neg := n < 0
	if neg {
		n = -n
	}
	s := strconv.FormatInt(n/p, 10)
	if f := n % p; f != 0 {
		fs := strconv.FormatInt(f, 10)
		s += "." + strings.TrimRight(strings.Repeat("0", places-len(fs))+fs, "0")
	}
	if neg {
		s = "-" + s
	}
	return s
}
