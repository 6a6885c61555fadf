package monoclock

import (
	"testing"
	"time"
)

func TestNowTracksWallClock(t *testing.T) {
	before := time.Now().UnixNano()
	now := Now()
	after := time.Now().UnixNano()
	// The two clocks may drift apart by NTP slewing over days, not within
	// a test.
	if now < before-int64(time.Millisecond) || now > after+int64(time.Millisecond) {
		t.Fatalf("Now() = %d, wall clock between %d and %d", now, before, after)
	}
	if Now() < now {
		t.Fatal("Now went backwards")
	}
}

func BenchmarkNow(b *testing.B) {
	for range b.N {
		_ = Now()
	}
}
