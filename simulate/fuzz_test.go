package simulate

import (
	"strings"
	"testing"

	"github.com/admitdev/admit/policy"
)

// FuzzParse feeds the pattern, rule and log parsers anything: they return
// a value or an error, never panic, and a pattern they accept stays within
// MaxEvents: estimated, and generated (within a smaller bound, here).
func FuzzParse(f *testing.F) {
	for _, s := range []string{"constant rate=1/s", "bursts n=5 every=10s", "ramp from=0/s to=20/s duration=1m",
		"token_bucket rate=2/2s burst=5", "time,tenant\n1,a\n", `{"time":1,"cost":3}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if p, err := ParsePattern(s); err == nil {
			if p.expected() > MaxEvents {
				t.Errorf("%q: accepted %v requests", s, p.expected())
			}
			ev, err := p.Events(Identity{}, 1000)
			if len(ev) > 1000 || err == nil && p.Kind != "poisson" && p.Kind != "ramp" && float64(len(ev)) != p.expected() {
				t.Errorf("%q: %d requests (%v), estimated %v", s, len(ev), err, p.expected())
			}
		}
		if rs, err := ParseRule(s); err == nil {
			_, _ = Compile([]policy.RuleSpec{rs})
		}
		_, _, _ = ReadLog(strings.NewReader(s), "", nil)
	})
}
