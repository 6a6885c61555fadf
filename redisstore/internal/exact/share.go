package exact

import (
	"strconv"
	"strings"

	"github.com/admitdev/admit"
)

// Fair charges (admit.Charge.Share) are decided with their class's share
// in the library (the library, shareDecide), which keeps beside the charge's
// key the records admit.DecideShare reads: the key's pool of classes, the
// class's record and its sub's, and for a concurrency key the slots the
// class and its sub hold. Their keys are the charge's with a suffix that
// no key of the store ends with (every key ends with a length-prefixed
// field), so they share its hash slot.

// The suffixes of a fair charge's records.
const (
	sufPool    = "~p"
	sufClass   = "~c"
	sufSub     = "~s"
	sufHeld    = "~h"
	sufSubHeld = "~g"
)

// shareKeys appends the record keys of the fair charges of group g to
// keys, in the order of the charges: pool, class, sub (when the share has
// one), then for a concurrency charge its holdings, the class's and the
// sub's.
func (s *Room) shareKeys(keys []string, charges []admit.Charge, g group) []string {
	for k, i := range g.idx {
		c := &charges[i]
		if c.Share == nil {
			continue
		}
		base := g.keys[k]
		class := strconv.Itoa(len(c.Share.Class)) + ":" + c.Share.Class
		keys = append(keys, base+sufPool, base+sufClass+class)
		if c.Share.Sub != "" {
			keys = append(keys, base+sufSub+class+c.Share.Sub)
		}
		if c.Rule.Algorithm == admit.Concurrency {
			keys = append(keys, base+sufHeld+class)
			if c.Share.Sub != "" {
				keys = append(keys, base+sufSubHeld+class+c.Share.Sub)
			}
		}
	}
	return keys
}

// shareArg returns a charge's share argument: "" when it has none, else
// its weight, then s when it has a sub.
func shareArg(c *admit.Charge) string {
	if c.Share == nil {
		return ""
	}
	a := itoa(c.Share.Weight)
	if c.Share.Sub != "" {
		a += "s"
	}
	return a
}

// appendShareRecords appends to keys the pool and class records of every
// class holdings among a lease record's fields, which a renewal reads to
// know whether the class must yield (the library, shareYields): so that the
// call declares every key it touches, as Cluster requires.
func appendShareRecords(keys, fields []string) []string {
	for _, f := range fields {
		i := strings.LastIndex(f, sufHeld)
		if i < 0 {
			continue
		}
		base, class := f[:i], f[i+len(sufHeld):]
		keys = append(keys, base+sufPool, base+sufClass+class)
	}
	return keys
}
