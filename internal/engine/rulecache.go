package engine

import (
	"runtime"
	"sync"
	"weak"

	"github.com/admitdev/admit"
)

// RuleCache keeps values derived from rules (a store's arguments for a
// rule, a policy's local share of it), each for as long as its rule lives:
// an entry goes when its rule is collected. Every reload or admin change
// compiles new rules, and a cache that held its rules would keep every old
// one, and grow, for as long as the process runs.
//
// The zero RuleCache is empty and ready to use; it is safe for concurrent
// use. A rule must not change once a value is derived from it.
type RuleCache[V any] struct {
	m sync.Map // weak.Pointer[Rule] → V
}

// Get returns the value of r, computing it with derive on first use. Two
// concurrent first uses may both call derive; one result is kept and
// returned to both.
func (c *RuleCache[V]) Get(r *admit.Rule, derive func(*admit.Rule) V) V {
	wp := weak.Make(r)
	if v, ok := c.m.Load(wp); ok {
		return v.(V)
	}
	v, loaded := c.m.LoadOrStore(wp, derive(r))
	if !loaded {
		runtime.AddCleanup(r, func(wp weak.Pointer[admit.Rule]) { c.m.Delete(wp) }, wp)
	}
	return v.(V)
}

// Len returns the number of entries, counting those whose rule is
// collected but not yet cleaned up.
func (c *RuleCache[V]) Len() int {
	n := 0
	c.m.Range(func(any, any) bool { n++; return true })
	return n
}
