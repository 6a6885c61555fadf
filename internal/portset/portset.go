// Package portset remembers the loopback ports this process's test
// helpers handed out for servers that listen later, so that none is
// handed out twice: a port free both times it is tried is still one port,
// and the second server to listen on it cannot start.
package portset

import "sync"

var handed = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// Take reports whether port was never taken before in this process, and
// takes it.
func Take(port int) bool {
	handed.Lock()
	defer handed.Unlock()
	if handed.ports[port] {
		return false
	}
	handed.ports[port] = true
	return true
}
