// Package storetest is the conformance suite every admit.Store passes. The
// memory store runs it in its tests; the Redis store runs the same suite
// against real redis-server processes.
//
// A store under test is made by a Factory, which is given the clock the
// store must use, so that timelines are deterministic: every step happens
// at an exact instant after Epoch.
package storetest

import (
	"sync"
	"time"
)

// Epoch is the instant every timeline starts from. It is aligned to the
// day, so window boundaries fall on whole offsets from it.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Clock is a manual clock, safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock set to Epoch.
func NewClock() *Clock { return &Clock{now: Epoch} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set sets the clock to Epoch plus d.
func (c *Clock) Set(d time.Duration) {
	c.mu.Lock()
	c.now = Epoch.Add(d)
	c.mu.Unlock()
}
