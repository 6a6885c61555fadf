// Package ruletext reads the words configuration files name a rule's
// parts by: its algorithm ("token_bucket"), distribution ("leased"),
// failure mode ("open") and a quota's period ("month"), each the inverse
// of the part's String method.
package ruletext

import (
	"strings"

	"github.com/admitdev/admit"
)

// Algorithm returns the algorithm named s. It also accepts
// "leaky_bucket" for GCRA, the leaky bucket as a meter.
func Algorithm(s string) (admit.Algorithm, error) {
	if s == "leaky_bucket" {
		return admit.GCRA, nil
	}
	if a, ok := named(s, admit.Algorithm.String, false); ok && a > 0 {
		return a, nil
	}
	return 0, admit.Errorf(admit.CodeInvalid, "unknown algorithm %q (want token_bucket, gcra, fixed_window, sliding_window, sliding_log, combination, concurrency or quota)", s)
}

// FailureMode parses "open", "closed", "local" or "" (the default).
func FailureMode(s string) (admit.FailureMode, error) {
	if m, ok := named(s, admit.FailureMode.String, false); ok {
		return m, nil
	}
	return 0, admit.Errorf(admit.CodeInvalid, "unknown on_error %q (want open, closed or local)", s)
}

// Distribution parses "exact", "leased" or "" (exact). Counted is for
// adapters that count hits, never named in a file.
func Distribution(s string) (admit.Distribution, error) {
	if s == "" {
		return admit.Exact, nil
	}
	if d, ok := named(s, admit.Distribution.String, false); ok && d != admit.Counted {
		return d, nil
	}
	return 0, admit.Errorf(admit.CodeInvalid, "unknown distribution %q (want exact or leased)", s)
}

// Period returns the period named s, in any case.
func Period(s string) (admit.Period, error) {
	if p, ok := named(s, admit.Period.String, true); ok && p > 0 {
		return p, nil
	}
	return 0, admit.Errorf(admit.CodeInvalid, "unknown period %q (want day, week, month or year)", s)
}

// named returns the value of type T whose String is s, among the 256 a
// byte holds; "invalid" names none.
func named[T ~uint8](s string, name func(T) string, fold bool) (T, bool) {
	if s == "invalid" {
		return 0, false
	}
	for v := range 256 {
		n := name(T(v))
		if n == s || fold && strings.EqualFold(n, s) {
			return T(v), true
		}
	}
	return 0, false
}
