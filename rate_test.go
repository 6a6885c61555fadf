package admit

import (
	"testing"
	"time"

	"github.com/admitdev/admit/internal/bounds"
)

func TestParseRate(t *testing.T) {
	for s, want := range map[string]Rate{
		"100/s":     {100, time.Second},
		"10/min":    {10, time.Minute},
		"1000/h":    {1000, time.Hour},
		"1/d":       {1, 24 * time.Hour},
		"5/30s":     {5, 30 * time.Second},
		"3/1h30m":   {3, 90 * time.Minute},
		"7/2d":      {7, 48 * time.Hour},
		" 2 / 2s ":  {2, 2 * time.Second},
		"1e9/s":     {},
		"1000000/m": {1000000, time.Minute},
	} {
		got, err := ParseRate(s)
		if want == (Rate{}) {
			if err == nil {
				t.Errorf("ParseRate(%q) = %v, want an error", s, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "10", "/s", "x/s", "10/", "10/y", "0/s", "-1/s", "10/0s", "10/-1s", "2000000000/s", "1/400d", "1/dd",
		"1/213504d", "1/2147483647d", "1/366d1h"} { // days × 24 h once wrapped around: 213504d was 25 minutes
		if r, err := ParseRate(s); err == nil {
			t.Errorf("ParseRate(%q) = %v, want an error", s, r)
		}
	}
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"100/s", "5/30s", "1/d", "3/1h30m", "7/2d", "1/0d", "9/9999999999h", "1/213504d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRate(s)
		if err != nil {
			if ErrorCode(err) != CodeInvalid {
				t.Fatalf("ParseRate(%q): error %v is not invalid", s, err)
			}
			return
		}
		if r.validate() != nil {
			t.Fatalf("ParseRate(%q) = %v, which does not validate", s, r)
		}
		back, err := ParseRate(r.String())
		if err != nil || back != r {
			t.Fatalf("ParseRate(%q) = %v; its String %q parses as %v, %v", s, r, r.String(), back, err)
		}
	})
}

// TestParseDurationBounds: a duration is at most bounds.MaxRatePeriod however it
// is written; a count of days that would overflow int64 nanoseconds is
// refused, not wrapped around into minutes.
func TestParseDurationBounds(t *testing.T) {
	for _, s := range []string{"213504d", "106752d", "2147483647d", "367d", "366d1ns", "365d25h"} {
		if d, err := ParseDuration(s); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error", s, d)
		}
	}
	if d, err := ParseDuration("366d"); err != nil || d != bounds.MaxRatePeriod {
		t.Errorf("ParseDuration(366d) = %v, %v; want %v", d, err, bounds.MaxRatePeriod)
	}
}
