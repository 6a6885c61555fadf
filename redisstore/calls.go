package redisstore

import (
	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore/internal/link"
)

// newCall starts a call of op on the charges of g; rec, if set, is the
// record key the script writes (a lease or a reservation).
func (s *Store) newCall(op, aux1, aux2, id string, charges []admit.Charge, g group, rec string) link.Call {
	c := link.Call{
		Keys: make([]string, 0, len(g.keys)+1),
		Args: make([]string, 7, 7+stride*len(g.idx)),
	}
	c.Args[0], c.Args[3], c.Args[4], c.Args[5], c.Args[6] = op, aux1, aux2, id, itoa(int64(len(g.idx)))
	c.Args[1], c.Args[2] = s.link.NowArgs()
	c.Keys = append(c.Keys, g.keys...)
	for _, i := range g.idx {
		ch := &charges[i]
		a := argsOf(ch.Rule)
		n := len(c.Args)
		c.Args = append(c.Args, a.fixed[:]...)
		c.Args[n+1] = itoa(ch.Cost)
		if ch.LeaseTTL > 0 {
			c.Args[n+3] = micros(min(ch.LeaseTTL, maxSpan))
		}
	}
	if rec != "" {
		c.Keys = append(c.Keys, rec)
	}
	return c
}
