// Package weakmap is a concurrent cache keyed weakly by pointers: an entry
// goes when its key is collected. Admit derives data from compiled rules
// (store arguments, local shares); every reload or admin change compiles
// new rules, and a cache with strong keys would keep every old rule, and
// grow, for as long as the process runs.
package weakmap

import (
	"runtime"
	"sync"
	"weak"
)

// Map maps *K to V. Its zero value is empty and ready to use; it is safe for
// concurrent use.
type Map[K, V any] struct {
	m sync.Map // weak.Pointer[K] → V
}

// Get returns the value of k, computing it with make on first use. Two
// concurrent first uses may both call make; one result is kept and
// returned to both.
func (c *Map[K, V]) Get(k *K, make func(*K) V) V {
	wp := weak.Make(k)
	if v, ok := c.m.Load(wp); ok {
		return v.(V)
	}
	v, loaded := c.m.LoadOrStore(wp, make(k))
	if !loaded {
		runtime.AddCleanup(k, func(wp weak.Pointer[K]) { c.m.Delete(wp) }, wp)
	}
	return v.(V)
}

// Len returns the number of entries, counting those whose key is
// collected but not yet cleaned up.
func (c *Map[K, V]) Len() int {
	n := 0
	c.m.Range(func(any, any) bool { n++; return true })
	return n
}
