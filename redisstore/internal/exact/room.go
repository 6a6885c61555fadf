package exact

import (
	"context"
	"sync/atomic"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/redisstore/internal/link"
)

// Room is the exact path of the Redis store: every decision is made in
// Redis by the library's function (Library), the only sender of its
// calls; decisions made at the same time share calls (see batch.go), a
// Cluster decision runs group by group (see decide.go), and a key Redis
// refused is refused here until Redis said it could admit again (see
// refusals.go). Leases and reservations are kept in records (records.go).
type Room struct {
	link *link.Link
	// exactRefusals: see redisstore.Options.ExactRefusals.
	exactRefusals bool
	// tenantTags is the most groups of tenants' keys a lease or
	// reservation may be held in (redisstore.Options.TenantsPerDecision).
	tenantTags int
	refused    refusals
	batchers   []atomic.Pointer[batcher] // see batch.go

	// Decisions counts decisions made, LocalDecisions those made without
	// Redis (LocalRefusals of them refused), UndoFailures the Cluster
	// decisions whose give-back failed.
	Decisions, LocalDecisions, LocalRefusals, UndoFailures atomic.Int64
}

// New returns the exact path of a store calling Redis through l.
func New(l *link.Link, tenantTags int, exactRefusals bool) *Room {
	return &Room{link: l, tenantTags: tenantTags, exactRefusals: exactRefusals, batchers: batchersFor(l.Cluster)}
}

// HasRefusals reports whether s remembers a refusal.
func (s *Room) HasRefusals() bool { return s.refused.n.Load() > 0 }

// Check checks charge i, c, as every decision checks its charges first.
func Check(i int, c *admit.Charge) error {
	_, err := checkCharge(i, c, false)
	return err
}

// decideWithdraw is the how of a withdrawal job (lua/70_ops.lua, withdraw).
const decideWithdraw = "w"

// Withdraw takes c.Cost units of c's key for an allowance a server spends
// on its own, in the call batch of c's hash tag tag, as much as the key
// holds up to c.Cost. The reply says, of the call's now, the key (its
// values 0–4 as a decision's) and the units granted (value 5).
func (s *Room) Withdraw(ctx context.Context, c admit.Charge, tag string) (Reply, error) {
	charges := [1]admit.Charge{c}
	g := group{tag: tag, idx: []int{0}, keys: []string{s.link.Key(tag, c.Key)}}
	return s.decideCall(tag, s.newJob(ctx, jobSpec{charges: charges[:], ras: []*ruleArgs{argsOf(c.Rule)}, g: g, how: decideWithdraw}))
}

// GiveBack gives c.Cost units back to c's key, hash tag tag, as units
// withdrawn by a call whose now was nu µs and nsub ns: a window gives
// them back only if that window still counts.
func (s *Room) GiveBack(ctx context.Context, c admit.Charge, tag string, nu, nsub int64) error {
	charges := []admit.Charge{c}
	gd := groupDone{
		g:     group{tag: tag, idx: []int{0}, keys: []string{s.link.Key(tag, c.Key)}},
		reply: groupReply{nu: nu, nsub: nsub, hows: []string{"0"}},
	}
	_, err := s.link.Run(ctx, s.undoCall(charges, gd, ""))
	return err
}
