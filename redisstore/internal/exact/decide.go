package exact

import (
	"context"
	"slices"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/redisstore/internal/link"
)

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
func (s *Room) groups(charges []admit.Charge, split bool) []group {
	var gs []group
	for i := range charges {
		tag := link.Tag(&charges[i])
		j := len(gs) - 1
		if split {
			j = slices.IndexFunc(gs, func(g group) bool { return g.tag == tag })
		}
		if j < 0 {
			gs = append(gs, group{tag: tag})
			j = len(gs) - 1
		}
		gs[j].idx = append(gs[j].idx, i)
		gs[j].keys = append(gs[j].keys, s.link.Key(tag, charges[i].Key))
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

// Reply is one decision's part of the reply of a decide or undo call
// (the library, reply): allowed, four values per charge (allowed + 2 × how,
// remaining, reset, retry) and the lease's expiry; with the call's now.
type Reply struct {
	NU, NSub int64
	V        []int64
}

// callReply splits the reply of a call about one decision: now, then the
// decision's part.
func callReply(v []int64) Reply {
	if len(v) < 2 {
		return Reply{V: v} // fill reports the length
	}
	return Reply{NU: v[0], NSub: v[1], V: v[2:]}
}

// groupReply is the decoded reply of a decide or undo call.
type groupReply struct {
	nu, nsub int64
	allowed  bool
	hows     []string
	lease    int64 // the lease's expiry in µs, or 0
}

// fill decodes reply rp into the results of g's charges.
func fill(rp Reply, charges []admit.Charge, g group, d *admit.Decision, onlyRemaining bool) (groupReply, error) {
	v := rp.V
	if len(v) != 2+4*len(g.idx) {
		return groupReply{}, admit.Errorf(admit.CodeInternal, "redisstore: script replied %d values for %d charges", len(v), len(g.idx))
	}
	r := groupReply{nu: rp.NU, nsub: rp.NSub, allowed: v[0] == 1, lease: v[len(v)-1], hows: make([]string, len(g.idx))}
	for k, i := range g.idx {
		x := v[1+4*k:]
		res := &d.Results[i]
		rule := charges[i].Rule
		reset, retry := time.Duration(x[2]), time.Duration(x[3])
		if endsInArgs(rule) {
			// A quota's reply says its period's end in µs (the library,
			// quotaEval): the time to it is reckoned here, exactly.
			reset = time.Duration(x[2]*1000 - (rp.NU*1000 + rp.NSub))
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
		if x[1] < 0 { // a count's debit past its limit (the library, step)
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

// Decide decides charges in Redis, group by group.
func (s *Room) Decide(ctx context.Context, charges []admit.Charge, d *admit.Decision) error {
	s.Decisions.Add(1)
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
	if s.RefuseLocally(charges, now, d) {
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
				leaseID = NewID()
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
		s.LearnRefusals(charges, d, now)
	} else if len(leaseTags) > 0 {
		d.Lease.ID = joinID(leaseID, leaseTags)
	} else if dry {
		s.LearnRefusals(charges, d, now) // what refused a look refuses a decision
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
func (s *Room) giveBack(ctx context.Context, x *exactCall, refused int) error {
	charges, d, leaseID := x.charges, x.d, x.leaseID
	for _, gd := range x.done {
		v, err := s.link.Run(ctx, s.undoCall(charges, gd, leaseID))
		if err != nil {
			s.UndoFailures.Add(1)
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

func (s *Room) undoCall(charges []admit.Charge, gd groupDone, leaseID string) link.Call {
	rec := ""
	if leaseID != "" && hasLeases(charges, gd.g) {
		rec = s.leaseKey(gd.g.tag, leaseID)
	}
	c := s.newCall(opUndo, itoa(gd.reply.nu), itoa(gd.reply.nsub), leaseID, charges, gd.g, rec)
	for k, i := range gd.g.idx {
		c.Args[argOf(k, chHow)] = gd.reply.hows[k]
		if charges[i].Debit {
			c.Args[argOf(k, chHow)] = "-1" // a debit stays charged
		}
		if endsInArgs(charges[i].Rule) {
			// Where a quota's rule has no other parameter (the library,
			// strided), its period's ends, for the look after the undo.
			c.Args[argOf(k, chPeriodStart)], c.Args[argOf(k, chPeriodEnd)] = s.quotaEnds(charges[i].Rule)
		}
	}
	return c
}

// undo gives back groups already charged when a decision fails half way.
// It runs on a context of its own: the caller's may be what expired.
func (s *Room) undo(charges []admit.Charge, done []groupDone, leaseID string) {
	if len(done) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.link.Timeout)
	defer cancel()
	for _, gd := range done {
		if _, err := s.link.Run(ctx, s.undoCall(charges, gd, leaseID)); err != nil {
			s.UndoFailures.Add(1)
		}
	}
}

// quotaRefundMargin is how close to its end a quota period takes no more
// refunds, for the clocks of this server and Redis's to disagree by.
const quotaRefundMargin = 2 * time.Second

// Command is redishook.Command.
func (s *Room) Command(charges []admit.Charge) (keys, args []string) {
	ras, _ := validate(charges, false)
	return s.batchArgs([]*job{s.newJob(context.Background(), jobSpec{charges: charges, ras: ras, g: s.groups(charges, false)[0], how: decideCharge})})
}

// Refund gives back charges, checked as refunds (engine.CheckRefund) and
// none of them counted, as charged by a decision made at the store's time
// at. A window's or bucket's charge is given back in Redis, by Redis's
// clock, exactly as a Cluster decision that failed half way gives back
// what it charged. A quota's is given back only when the period at fell
// in is the current one by this server's clock and does not end within 2
// seconds: the script cannot tell a quota's periods apart, and a refund
// must never reach the next period.
func (s *Room) Refund(ctx context.Context, charges []admit.Charge, at time.Time) error {
	now := s.link.Now()
	keep := make([]admit.Charge, 0, len(charges))
	for _, c := range charges {
		if c.Cost == 0 {
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
	s.ForgetRefusals(keep, false)
	u := at.UnixMicro()
	for _, g := range s.groups(keep, s.link.Cluster) {
		c := s.newCall(opUndo, itoa(u), itoa(at.UnixNano()-u*1000), "", keep, g, "")
		for k, i := range g.idx {
			c.Args[argOf(k, chHow)] = "0"
			if endsInArgs(keep[i].Rule) {
				c.Args[argOf(k, chPeriodStart)], c.Args[argOf(k, chPeriodEnd)] = s.quotaEnds(keep[i].Rule)
			}
		}
		if _, err := s.link.Run(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// Reset resets charges' keys in Redis: a window's count is kept in a key
// named for the window, which only the script knows from Redis's clock; a
// call stays within a slot.
func (s *Room) Reset(ctx context.Context, charges []admit.Charge) error {
	s.ForgetRefusals(charges, false)
	if _, err := validate(charges, false); err != nil {
		return err
	}
	for _, g := range s.groups(charges, s.link.Cluster) {
		c := s.newCall(opReset, "", "", "", charges, g, "")
		for k, i := range g.idx {
			if endsInArgs(charges[i].Rule) {
				c.Args[argOf(k, chPeriodStart)], c.Args[argOf(k, chPeriodEnd)] = s.quotaEnds(charges[i].Rule)
			}
		}
		if _, err := s.link.Run(ctx, c); err != nil {
			return err
		}
	}
	return nil
}
