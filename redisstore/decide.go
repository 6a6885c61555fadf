package redisstore

import (
	"context"
	"slices"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/redisstore/internal/link"
)

// tagOf returns the hash tag of a charge's key: its tenant's hash
// (engine.TenantHash, stable across processes and versions, as a tag must
// be; a collision only puts two tenants in one slot), "g" for keys without
// a tenant.
func tagOf(c *admit.Charge) string {
	h, ok := engine.TenantHash(c)
	if !ok {
		return "g"
	}
	var b [16]byte
	const digits = "0123456789abcdef"
	for i := range b {
		b[15-i] = digits[h&15]
		h >>= 4
	}
	return string(b[:])
}

func (s *Store) redisKey(tag, key string) string {
	return s.link.Prefix + "{" + tag + "}" + key
}

// group is the charges of one decision that share a hash tag, with their
// Redis keys.
type group struct {
	tag  string
	idx  []int
	keys []string
}

// groups splits charges into the groups one call each can decide: by tag
// when split (in Cluster, where a call reaches one slot), in order of first
// appearance with the global tag last; otherwise all in one group, tagged
// like its first charge. Each charge's tag and key are computed here once
// for the whole decision.
func (s *Store) groups(charges []admit.Charge, split bool) []group {
	var gs []group
	for i := range charges {
		tag := tagOf(&charges[i])
		j := len(gs) - 1
		if split {
			j = slices.IndexFunc(gs, func(g group) bool { return g.tag == tag })
		}
		if j < 0 {
			gs = append(gs, group{tag: tag})
			j = len(gs) - 1
		}
		gs[j].idx = append(gs[j].idx, i)
		gs[j].keys = append(gs[j].keys, s.redisKey(tag, charges[i].Key))
	}
	if split {
		slices.SortStableFunc(gs, func(a, b group) int {
			switch {
			case a.tag == "g" && b.tag != "g":
				return 1
			case b.tag == "g" && a.tag != "g":
				return -1
			}
			return 0
		})
	}
	return gs
}

// validate checks charges and returns the arguments of each one's rule.
func validate(charges []admit.Charge, reserve bool) ([]*ruleArgs, error) {
	if len(charges) > bounds.MaxCharges {
		return nil, admit.Errorf(admit.CodeInvalid, "%d charges in one decision; at most %d", len(charges), bounds.MaxCharges)
	}
	if err := engine.CheckDebits(charges); err != nil {
		return nil, err
	}
	ras := make([]*ruleArgs, len(charges))
	for i := range charges {
		var err error
		if ras[i], err = checkCharge(i, &charges[i], reserve); err != nil {
			return nil, err
		}
	}
	return ras, nil
}

// checkCharge checks charge i, c, and returns the arguments of its rule.
func checkCharge(i int, c *admit.Charge, reserve bool) (*ruleArgs, error) {
	if c.Rule == nil {
		return nil, admit.Errorf(admit.CodeInvalid, "charge %d has no rule", i)
	}
	if c.Key == "" {
		return nil, engine.ErrEmptyKey
	}
	ra := argsOf(c.Rule)
	if ra.err != nil {
		return nil, ra.err
	}
	if err := engine.CheckCounted(c); err != nil {
		return nil, err
	}
	check := engine.CheckCost
	if c.Debit {
		check = engine.CheckDebit
	}
	if err := check(c.Rule, c.Cost); err != nil {
		return nil, err
	}
	if c.Share != nil {
		if err := engine.CheckShare(c.Share); err != nil {
			return nil, err
		}
		if p, err := engine.Prepare(c.Rule); err == nil && !c.Debit {
			if err := p.CheckShareCost(c.Cost); err != nil {
				return nil, err
			}
		}
	}
	if reserve && c.Share != nil {
		return nil, admit.Errorf(admit.CodeInvalid, "charge %d: a limit tenants share is not reserved ahead; decide its charges (its class's share keeps the order)", i)
	}
	if reserve && c.Debit {
		return nil, admit.Errorf(admit.CodeInvalid, "charge %d: a reservation books capacity ahead; it takes no debits", i)
	}
	if reserve && !engine.Reservable(c.Rule.Algorithm) {
		return nil, admit.Errorf(admit.CodeInvalid, "rule %q: %v cannot reserve; only token_bucket and gcra can", c.Rule.Name, c.Rule.Algorithm)
	}
	return ra, nil
}

// reply is one decision's part of the reply of a decide or undo link.Call
// (lua/library, reply): allowed, four values per charge (allowed + 2 × how,
// remaining, reset, retry) and the lease's expiry; with the call's now.
type reply struct {
	nu, nsub int64
	v        []int64
}

// callReply splits the reply of a call about one decision: now, then the
// decision's part.
func callReply(v []int64) reply {
	if len(v) < 2 {
		return reply{v: v} // fill reports the length
	}
	return reply{nu: v[0], nsub: v[1], v: v[2:]}
}

// groupReply is the decoded reply of a decide or undo call.
type groupReply struct {
	nu, nsub int64
	allowed  bool
	hows     []string
	lease    int64 // the lease's expiry in µs, or 0
}

// fill decodes reply rp into the results of g's charges.
func fill(rp reply, charges []admit.Charge, g group, d *admit.Decision, onlyRemaining bool) (groupReply, error) {
	v := rp.v
	if len(v) != 2+4*len(g.idx) {
		return groupReply{}, admit.Errorf(admit.CodeInternal, "redisstore: script replied %d values for %d charges", len(v), len(g.idx))
	}
	r := groupReply{nu: rp.nu, nsub: rp.nsub, allowed: v[0] == 1, lease: v[len(v)-1], hows: make([]string, len(g.idx))}
	for k, i := range g.idx {
		x := v[1+4*k:]
		res := &d.Results[i]
		rule := charges[i].Rule
		reset, retry := time.Duration(x[2]), time.Duration(x[3])
		if rule.Algorithm == admit.Quota {
			// A quota's reply says its period's end in µs (lua/library,
			// quotaEval): the time to it is reckoned here, exactly.
			reset = time.Duration(x[2]*1000 - (rp.nu*1000 + rp.nsub))
			if x[0]&1 == 0 && admit.SharePath(x[0]>>3&3) != admit.ShareRefused {
				retry = reset // a share's refusal says its wait in ns
			}
		}
		if onlyRemaining {
			if res.Allowed && charges[i].Cost > 0 {
				res.Remaining, res.ResetAfter = x[1], reset
				if charges[i].Share != nil {
					res.Shared = x[0] >> 6
				}
			}
			continue
		}
		*res = admit.Result{
			Rule: rule.Name, Shadow: rule.Shadow, Debit: charges[i].Debit, Limit: rule.Capacity(), Allowed: x[0]&1 == 1,
			Remaining: x[1], ResetAfter: reset, RetryAfter: retry, Share: admit.SharePath(x[0] >> 3 & 3),
		}
		if res.Share != admit.ShareNone || charges[i].Share != nil {
			res.Shared, res.ShareWhole = x[0]>>6, x[0]>>5&1 == 1
		}
		if x[1] < 0 { // a count's debit past its limit (lua/library, step)
			res.Remaining, res.Over = 0, -x[1]
		}
		r.hows[k] = itoa(x[0] >> 1 & 3)
	}
	return r, nil
}

func hasLeases(charges []admit.Charge, g group) bool {
	for _, i := range g.idx {
		if charges[i].Rule.Algorithm == admit.Concurrency && charges[i].Cost > 0 {
			return true
		}
	}
	return false
}

// Decide implements admit.Store. Counted charges are counted with plain
// commands (see counted.go); decisions with a leased charge go through
// allowances (see leased.go); the others are decided in Redis.
func (s *Store) Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	if s.region != nil {
		return s.decideRegion(ctx, charges, d)
	}
	if anyCounted(charges) {
		return s.decideCounted(ctx, charges, d)
	}
	return s.decideOthers(ctx, charges, d)
}

// decideOthers decides charges of which none is counted.
func (s *Store) decideOthers(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	var err error
	if anyLeasable(charges) {
		err = s.decideLeased(ctx, charges, d)
	} else {
		err = s.decideExact(ctx, charges, d)
	}
	if s.refused.n.Load() > 0 && slices.ContainsFunc(charges, func(c admit.Charge) bool { return c.Debit }) {
		// A debit moves a key's wait: a refusal remembered before it
		// would answer the old one. The next decision asks Redis.
		s.forgetRefusals(charges, true)
	}
	return err
}

// decideExact decides charges in Redis, group by group.
func (s *Store) decideExact(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	s.decisions.Add(1)
	d.Reset()
	ras, err := validate(charges, false)
	if err != nil {
		return err
	}
	dry := slices.ContainsFunc(charges, func(c admit.Charge) bool { return c.DryRun })
	if len(charges) == 0 {
		d.Allowed = true // nothing limits the request, as in memstore
		return nil
	}
	now := s.link.Now()
	if s.refuseLocally(charges, now, d) {
		return nil
	}
	d.Results = slices.Grow(d.Results, len(charges))[:len(charges)]
	groups := s.groups(charges, s.link.Cluster)
	if !dry && s.link.Cluster {
		if err := s.checkTenantGroups(groups, func(g group) bool { return hasLeases(charges, g) }); err != nil {
			return err
		}
	}
	leaseID := ""
	var leaseTags []string
	var done []groupDone
	refused := -1
	for gi, g := range groups {
		rec := ""
		if !dry && hasLeases(charges, g) {
			if leaseID == "" {
				leaseID = newID()
			}
			rec = s.leaseKey(g.tag, leaseID)
		}
		how := decideCharge
		if dry {
			how = decideDry
		}
		v, err := s.decideCall(g.tag, s.newJob(ctx, jobSpec{charges: charges, ras: ras, g: g, how: how, lease: leaseID, rec: rec}))
		if err != nil {
			s.undo(charges, done, leaseID)
			return err
		}
		r, err := fill(v, charges, g, d, false)
		if err != nil {
			s.undo(charges, done, leaseID)
			return err
		}
		if gi == 0 {
			d.At = time.UnixMicro(r.nu).Add(time.Duration(r.nsub))
		}
		if r.lease > 0 {
			leaseTags = append(leaseTags, g.tag)
			d.Lease.ExpiresAt = later(d.Lease.ExpiresAt, time.UnixMicro(r.lease))
		}
		if !r.allowed && !dry {
			refused = gi
			break
		}
		done = append(done, groupDone{g: g, reply: r})
	}
	if refused >= 0 {
		d.Lease = admit.Lease{}
		x := exactCall{charges: charges, ras: ras, d: d, groups: groups, done: done, leaseID: leaseID}
		if err := s.giveBack(ctx, &x, refused); err != nil {
			return err
		}
		s.learnRefusals(charges, d, now)
	} else if len(leaseTags) > 0 {
		d.Lease.ID = joinID(leaseID, leaseTags)
	} else if dry {
		s.learnRefusals(charges, d, now) // what refused a look refuses a decision
	}
	engine.Summarize(d)
	return nil
}

type groupDone struct {
	g     group
	reply groupReply
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// exactCall is a decision decided in Redis group by group (in Cluster,
// a group per slot), as far as it went: the groups in done were charged.
type exactCall struct {
	charges []admit.Charge
	ras     []*ruleArgs
	d       *admit.Decision
	groups  []group
	done    []groupDone
	leaseID string
}

// giveBack finishes a Cluster decision x that group refused after the
// groups in x.done were charged: they are given back and report what they
// hold, and the groups after the refusing one, never asked, report as the
// charges of a refused decision do, charging nothing.
func (s *Store) giveBack(ctx context.Context, x *exactCall, refused int) error {
	charges, d, leaseID := x.charges, x.d, x.leaseID
	for _, gd := range x.done {
		v, err := s.link.Run(ctx, s.undoCall(charges, gd, leaseID))
		if err != nil {
			s.undoFailures.Add(1)
			return err
		}
		if _, err := fill(callReply(v), charges, gd.g, d, true); err != nil {
			return err
		}
	}
	for _, g := range x.groups[refused+1:] {
		v, err := s.decideCall(g.tag, s.newJob(ctx, jobSpec{charges: charges, ras: x.ras, g: g, how: decideRefused}))
		if err != nil {
			return err
		}
		if _, err := fill(v, charges, g, d, false); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) undoCall(charges []admit.Charge, gd groupDone, leaseID string) link.Call {
	rec := ""
	if leaseID != "" && hasLeases(charges, gd.g) {
		rec = s.leaseKey(gd.g.tag, leaseID)
	}
	c := s.newCall("u", itoa(gd.reply.nu), itoa(gd.reply.nsub), leaseID, charges, gd.g, rec)
	for k, i := range gd.g.idx {
		c.Args[7+stride*k+4] = gd.reply.hows[k]
		if charges[i].Debit {
			c.Args[7+stride*k+4] = "-1" // a debit stays charged
		}
		if charges[i].Rule.Algorithm == admit.Quota {
			// Where a quota's rule has no other parameter (lua/library,
			// strided), its period's ends, for the look after the undo.
			c.Args[7+stride*k+5+1], c.Args[7+stride*k+5+2] = s.quotaEnds(charges[i].Rule)
		}
	}
	return c
}

// undo gives back groups already charged when a decision fails half way.
// It runs on a context of its own: the caller's may be what expired.
func (s *Store) undo(charges []admit.Charge, done []groupDone, leaseID string) {
	if len(done) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.link.Timeout)
	defer cancel()
	for _, gd := range done {
		if _, err := s.link.Run(ctx, s.undoCall(charges, gd, leaseID)); err != nil {
			s.undoFailures.Add(1)
		}
	}
}

// Refund implements engine.Refunder. A window's or bucket's charge is given
// back in Redis, by Redis's clock, exactly as a Cluster decision that
// failed half way gives back what it charged. A quota's is given back
// only when the period at fell in is the current one by this server's
// clock and does not end within 2 seconds: the script cannot tell
// a quota's periods apart, and a refund must never reach the next period.
func (s *Store) Refund(ctx context.Context, charges []admit.Charge, at time.Time) error {
	if s.region != nil {
		s.refundRegion(charges)
		return nil
	}
	now := s.link.Now()
	keep := make([]admit.Charge, 0, len(charges))
	for i := range charges {
		c := charges[i]
		c.Debit = true // a refund is bounded as a debit is
		if _, err := checkCharge(i, &c, false); err != nil {
			return err
		}
		if err := engine.CheckRefund(c.Rule, c.Cost); err != nil {
			return err
		}
		if c.Cost == 0 {
			continue
		}
		if isCounted(&c) {
			if err := s.refundCounted(&c, at); err != nil {
				return err
			}
			continue
		}
		if c.Rule.Algorithm == admit.Quota {
			_, was := engine.PeriodAt(c.Rule, at)
			_, is := engine.PeriodAt(c.Rule, now)
			if !was.Equal(is) || is.Sub(now) < quotaRefundMargin {
				continue
			}
		}
		c.Debit, c.DryRun = false, false
		keep = append(keep, c)
	}
	if len(keep) == 0 {
		return nil
	}
	s.forgetRefusals(keep, false)
	u := at.UnixMicro()
	for _, g := range s.groups(keep, s.link.Cluster) {
		c := s.newCall("u", itoa(u), itoa(at.UnixNano()-u*1000), "", keep, g, "")
		for k, i := range g.idx {
			c.Args[7+stride*k+4] = "0"
			if keep[i].Rule.Algorithm == admit.Quota {
				c.Args[7+stride*k+5+1], c.Args[7+stride*k+5+2] = s.quotaEnds(keep[i].Rule)
			}
		}
		if _, err := s.link.Run(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// quotaRefundMargin is how close to its end a quota period takes no more
// refunds, for the clocks of this server and Redis's to disagree by.
const quotaRefundMargin = 2 * time.Second

var _ engine.Refunder = (*Store)(nil)

// Reset implements admit.Store.
func (s *Store) Reset(ctx context.Context, charges []admit.Charge) error {
	if s.region != nil {
		return s.resetRegion(ctx, charges)
	}
	if anyCounted(charges) {
		var others []admit.Charge
		for i := range charges {
			if !isCounted(&charges[i]) {
				others = append(others, charges[i])
			} else if err := s.resetCounted(ctx, &charges[i]); err != nil {
				return err
			}
		}
		if len(others) == 0 {
			return nil
		}
		charges = others
	}
	s.forget(charges)
	s.forgetRefusals(charges, false)
	if _, err := validate(charges, false); err != nil {
		return err
	}
	// A window's count is kept in a key named for the window, which only
	// the script knows from Redis's clock; a call stays within a slot.
	for _, g := range s.groups(charges, s.link.Cluster) {
		c := s.newCall("x", "", "", "", charges, g, "")
		for k, i := range g.idx {
			if charges[i].Rule.Algorithm == admit.Quota {
				c.Args[7+stride*k+5+1], c.Args[7+stride*k+5+2] = s.quotaEnds(charges[i].Rule)
			}
		}
		if _, err := s.link.Run(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// command is redishook.Command.
func (s *Store) command(charges []admit.Charge) (keys, args []string) {
	ras, _ := validate(charges, false)
	return s.batchArgs([]*job{s.newJob(context.Background(), jobSpec{charges: charges, ras: ras, g: s.groups(charges, false)[0], how: decideCharge})})
}
