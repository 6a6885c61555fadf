package exact

import (
	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore/internal/link"
)

// A strided call (the library's ops r, u and x; lua/70_ops.lua, strided)
// sends a head of seven arguments, then each charge's stride.
const (
	argOp      = iota // the op: opReserve, opUndo or opReset
	argNowU           // the injected clock's µs, or "" for Redis TIME
	argNowN           // and its ns beyond
	argAux1           // the op's first: a reservation's longest wait, an undo's µs
	argAux2           // the op's second: an undo's ns
	argID             // the lease or reservation id
	argCharges        // how many charges follow
	argHead           // where the first charge's stride starts
)

// The places in a charge's stride (see ruleArgs.fixed).
const (
	chAlgorithm   = 0
	chCost        = 1
	chShadow      = 2
	chLeaseTTL    = 3
	chHow         = 4            // an undo's: what the decision did to the charge (-1 a debit, kept)
	chParams      = 5            // the rule's ten parameters
	chPeriodStart = chParams + 1 // a quota's period, where its parameters leave room
	chPeriodEnd   = chParams + 2
)

// The strided ops.
const (
	opReserve = "r"
	opUndo    = "u"
	opReset   = "x"
)

// argOf returns the place of field of charge k's stride in a strided
// call's arguments.
func argOf(k, field int) int { return argHead + stride*k + field }

// newCall starts a call of op on the charges of g; rec, if set, is the
// record key the script writes (a lease or a reservation).
func (s *Room) newCall(op, aux1, aux2, id string, charges []admit.Charge, g group, rec string) link.Call {
	c := link.Call{
		Keys: make([]string, 0, len(g.keys)+1),
		Args: make([]string, argHead, argHead+stride*len(g.idx)),
	}
	c.Args[argOp], c.Args[argAux1], c.Args[argAux2], c.Args[argID], c.Args[argCharges] = op, aux1, aux2, id, itoa(int64(len(g.idx)))
	c.Args[argNowU], c.Args[argNowN] = s.link.NowArgs()
	c.Keys = append(c.Keys, g.keys...)
	for k, i := range g.idx {
		ch := &charges[i]
		c.Args = append(c.Args, argsOf(ch.Rule).fixed[:]...)
		c.Args[argOf(k, chCost)] = itoa(ch.Cost)
		if ch.LeaseTTL > 0 {
			c.Args[argOf(k, chLeaseTTL)] = micros(min(ch.LeaseTTL, maxSpan))
		}
	}
	if rec != "" {
		c.Keys = append(c.Keys, rec)
	}
	return c
}
