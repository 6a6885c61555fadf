package memstore

import (
	"testing"
	"time"
)

func TestMonoNowTracksWallClock(t *testing.T) {
	before := time.Now().UnixNano()
	now := monoNow()
	after := time.Now().UnixNano()
	// The two clocks may drift apart by NTP slewing over days, not within
	// a test.
	if now < before-int64(time.Millisecond) || now > after+int64(time.Millisecond) {
		t.Fatalf("monoNow() = %d, wall clock between %d and %d", now, before, after)
	}
	if monoNow() < now {
		t.Fatal("monoNow went backwards")
	}
}

func BenchmarkMonoNow(b *testing.B) {
	for range b.N {
		_ = monoNow()
	}
}
