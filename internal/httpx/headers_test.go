package httpx

import (
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
