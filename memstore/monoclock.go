// monoNow reads the time for decisions with one clock read.
//
// time.Now reads both the wall clock and the monotonic clock, which on a
// virtual machine can be half of a whole in-memory decision (57 ns of 100 on
// the machine docs/benchmarks.md was measured on). A decision needs only
// one: monoNow returns the wall time at the package's start plus the monotonic
// time since, so it never jumps when the wall clock is stepped, which is
// what a rate limiter wants anyway.

package memstore

import (
	"time"
	_ "unsafe" // for go:linkname
)

// nanotime is the runtime's monotonic clock. The runtime keeps this
// linkname working for the many packages that use it.
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

var (
	wallStart = time.Now().UnixNano()
	monoStart = nanotime()
)

// monoNow returns the current time in Unix nanoseconds.
func monoNow() int64 { return wallStart + nanotime() - monoStart }
