package httpx

import (
	"math"
	"testing"
	"time"
)

// TestRetrySeconds: Retry-After is a wait rounded up to whole seconds, and
// never 0, which a client would retry at once.
func TestRetrySeconds(t *testing.T) {
	for _, tc := range []struct {
		retry time.Duration
		want  int64
	}{
		{0, 1},
		{time.Millisecond, 1},
		{time.Second, 1},
		{time.Second + 1, 2},
		{5020 * time.Millisecond, 6},
		{90 * time.Second, 90},
	} {
		if got := RetrySeconds(tc.retry); got != tc.want {
			t.Errorf("RetrySeconds(%v) = %d, want %d", tc.retry, got, tc.want)
		}
	}
}

// TestCeilDivLargest: whole units rounded up, without overflowing for the
// largest durations (a saturated span).
func TestCeilDivLargest(t *testing.T) {
	for _, c := range []struct {
		d, unit time.Duration
		want    int64
	}{
		{0, time.Second, 0},
		{-time.Second, time.Second, 0},
		{time.Second, time.Second, 1},
		{time.Second + 1, time.Second, 2},
		{math.MaxInt64, time.Second, math.MaxInt64/int64(time.Second) + 1},
	} {
		if got := CeilDiv(c.d, c.unit); got != c.want {
			t.Errorf("CeilDiv(%d, %v) = %d, want %d", c.d, c.unit, got, c.want)
		}
	}
}
