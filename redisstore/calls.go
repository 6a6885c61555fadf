package redisstore

import (
	"strings"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/redishook"
)

// call is one script call: its keys and arguments.
type call struct {
	keys, args []string
}

// newCall starts a call of op on the charges of g; rec, if set, is the
// record key the script writes (a lease or a reservation).
func (s *Store) newCall(op, aux1, aux2, id string, charges []admit.Charge, g group, rec string) call {
	c := call{
		keys: make([]string, 0, len(g.keys)+1),
		args: make([]string, 7, 7+stride*len(g.idx)),
	}
	c.args[0], c.args[3], c.args[4], c.args[5], c.args[6] = op, aux1, aux2, id, itoa(int64(len(g.idx)))
	c.args[1], c.args[2] = s.link.nowArgs()
	c.keys = append(c.keys, g.keys...)
	for _, i := range g.idx {
		ch := &charges[i]
		a := argsOf(ch.Rule)
		n := len(c.args)
		c.args = append(c.args, a.fixed[:]...)
		c.args[n+1] = itoa(ch.Cost)
		if ch.LeaseTTL > 0 {
			c.args[n+3] = micros(min(ch.LeaseTTL, maxSpan))
		}
	}
	if rec != "" {
		c.keys = append(c.keys, rec)
	}
	return c
}

// functionName is the library's function; redishook.FunctionName says
// what each version changed.
const functionName = redishook.FunctionName

// isTransient reports Redis errors that say "not now" rather than "wrong":
// a master that is gone or read-only after a failover, a server at its
// maxmemory that takes no more writes.
func isTransient(msg string) bool {
	// WRONGPASS, NOAUTH and NOPERM: the ACL changed under a running
	// server; until it is mended, the store is as good as down, and the
	// rules' on_error decides.
	for _, p := range []string{"READONLY", "MASTERDOWN", "NOREPLICAS", "BUSY", "NOTBUSY", "OOM", "WRONGPASS", "NOAUTH", "NOPERM"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
