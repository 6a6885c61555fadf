//go:build race

package admit_test

// raceEnabled: the race detector's sync.Pool drops some of what it is
// given, so calls that reuse pooled buffers allocate now and then.
const raceEnabled = true
