package admit

import (
	"strconv"
	"strings"
	"time"

	"github.com/admitdev/admit/internal/bounds"
)

// Rate is N events per Per, such as 100 per second. Tokens accrue
// continuously: a Rate of 5 per 30s adds one token every 6 seconds, not 5
// at once. The zero Rate is invalid.
type Rate struct {
	N   int64
	Per time.Duration
}

// PerSecond returns a rate of n events per second.
func PerSecond(n int64) Rate { return Rate{N: n, Per: time.Second} }

// ParseRate parses a rate written as N/unit, where unit is s, min, h or d
// (also sec, second, m, minute, hour, day), or a Go duration with an
// optional day suffix: "100/s", "10/min", "1000/h", "1/d", "5/30s", "3/1h30m",
// "7/2d".
func ParseRate(s string) (Rate, error) {
	num, unit, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return Rate{}, Errorf(CodeInvalid, "rate %q: want N/unit, such as 100/s or 5/30s", s)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil {
		return Rate{}, Errorf(CodeInvalid, "rate %q: count %q is not a whole number", s, num)
	}
	per, err := parsePeriod(strings.TrimSpace(unit))
	if err != nil {
		return Rate{}, Errorf(CodeInvalid, "rate %q: %v", s, err)
	}
	r := Rate{N: n, Per: per}
	if err := r.validate(); err != nil {
		return Rate{}, err
	}
	return r, nil
}

func parsePeriod(u string) (time.Duration, error) {
	switch u {
	case "s", "sec", "second":
		return time.Second, nil
	case "m", "min", "minute":
		return time.Minute, nil
	case "h", "hour":
		return time.Hour, nil
	case "d", "day":
		return 24 * time.Hour, nil
	}
	return ParseDuration(u)
}

// ParseDuration is time.ParseDuration with one more unit, d for 24 hours,
// accepted only as a whole number of days before any other units ("2d",
// "1d12h"). The result must be positive.
func ParseDuration(s string) (time.Duration, error) {
	var days time.Duration
	whole := s
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.ParseInt(s[:i], 10, 32)
		if err != nil || n < 0 {
			return 0, Errorf(CodeInvalid, "unit %q: days must be a whole number", s)
		}
		// Checked before the product, which would wrap around.
		if n > int64(bounds.MaxRatePeriod/(24*time.Hour)) {
			return 0, Errorf(CodeInvalid, "duration %q is longer than %v", whole, bounds.MaxRatePeriod)
		}
		days, s = time.Duration(n)*24*time.Hour, s[i+1:]
		if s == "" {
			s = "0s"
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, Errorf(CodeInvalid, "unit %q is not s, min, h, d or a duration such as 30s", s)
	}
	if d > bounds.MaxRatePeriod || d+days > bounds.MaxRatePeriod {
		return 0, Errorf(CodeInvalid, "duration %q is longer than %v", whole, bounds.MaxRatePeriod)
	}
	d += days
	if d <= 0 {
		return 0, Errorf(CodeInvalid, "duration must be positive")
	}
	return d, nil
}

// validate reports whether r is within the bounds Admit supports: a count
// from 1 to 4,000,000,000, a period up to 366 days, and at most one event
// per nanosecond.
func (r Rate) validate() error {
	switch {
	case r.N < 1 || r.N > bounds.MaxCount:
		return Errorf(CodeInvalid, "rate %v: count must be from 1 to %d", r, int64(bounds.MaxCount))
	case r.Per <= 0 || r.Per > bounds.MaxRatePeriod:
		return Errorf(CodeInvalid, "rate %v: period must be positive and at most %v", r, bounds.MaxRatePeriod)
	case int64(r.Per) < r.N:
		return Errorf(CodeInvalid, "rate %v: faster than one per nanosecond", r)
	}
	return nil
}

// String formats r the way ParseRate reads it, such as "100/s" or "5/30s".
func (r Rate) String() string {
	var unit string
	switch r.Per {
	case time.Second:
		unit = "s"
	case time.Minute:
		unit = "min"
	case time.Hour:
		unit = "h"
	case 24 * time.Hour:
		unit = "d"
	default:
		unit = r.Per.String()
	}
	return strconv.FormatInt(r.N, 10) + "/" + unit
}
