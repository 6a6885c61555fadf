package engine

import (
	"math"
	"testing"
	"time"

	"github.com/admitdev/admit"
)

// TestSpanOfTokensIn: a rate's span rounds up and its tokens down, so
// that what paces tokens outside a bucket never hands one out early, and
// both saturate rather than wrap.
func TestSpanOfTokensIn(t *testing.T) {
	third := admit.Rate{N: 3, Per: time.Second}
	for _, c := range []struct {
		r    admit.Rate
		n    int64
		span time.Duration
	}{
		{third, 0, 0},
		{third, 1, 333333334},
		{third, 3, time.Second},
		{admit.PerSecond(100), 7, 70 * time.Millisecond},
		{admit.Rate{N: 1, Per: 365 * 24 * time.Hour}, math.MaxInt64, math.MaxInt64},
	} {
		if got := SpanOf(c.r, c.n); got != c.span {
			t.Errorf("SpanOf(%v, %d) = %v, want %v", c.r, c.n, got, c.span)
		}
	}
	for _, c := range []struct {
		r      admit.Rate
		d      time.Duration
		tokens int64
	}{
		{third, 333333333, 0},
		{third, 333333334, 1},
		{third, time.Second, 3},
		{admit.Rate{N: math.MaxInt64, Per: time.Nanosecond * math.MaxInt64}, math.MaxInt64, math.MaxInt64},
	} {
		if got := TokensIn(c.r, c.d); got != c.tokens {
			t.Errorf("TokensIn(%v, %v) = %d, want %d", c.r, c.d, got, c.tokens)
		}
	}
}
