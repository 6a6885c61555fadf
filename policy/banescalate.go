package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
)

// An Escalation bans the callers a rule keeps refusing: Refusals refusals
// by the rule named Rule within Within ban the refused request's
// identifier of Scope for Ban, and each later ban of that identifier lasts
// twice the one before, at most Max. An identifier's bans are forgotten
// Forget after its last one ended.
type Escalation struct {
	Name     string
	Rule     string
	Scope    string // BanIP, BanAPIKey, BanUser or BanTenant
	Refusals int64
	Within   time.Duration
	Ban      time.Duration
	Max      time.Duration
	Forget   time.Duration
}

// DefaultBanForget is how long an identifier's past bans are remembered
// after the last one ended when an Escalation does not say.
const DefaultBanForget = 24 * time.Hour

// CheckEscalation checks e's fields, naming the field at fault.
func CheckEscalation(e *Escalation) error {
	bad := func(field, format string, args ...any) error {
		err := admit.Errorf(admit.CodeInvalid, format, args...)
		err.Field = field
		return err
	}
	switch {
	case checkName(e.Name) != nil:
		return bad("name", "%q: %v", e.Name, checkName(e.Name))
	case e.Rule == "":
		return bad("rule", "an escalation names the rule whose refusals it counts")
	case e.Scope != BanIP && e.Scope != BanAPIKey && e.Scope != BanUser && e.Scope != BanTenant:
		return bad("scope", "%q: want ip, api_key, user or tenant", e.Scope)
	case e.Refusals < 1 || e.Refusals > 1_000_000:
		return bad("refusals", "%d: want 1 to 1,000,000", e.Refusals)
	case e.Within < time.Second || e.Within > 24*time.Hour:
		return bad("within", "%s: want 1s to 24h", e.Within)
	case e.Ban < time.Second || e.Ban > MaxBanTTL:
		return bad("ban", "%s: want 1s to %s", e.Ban, MaxBanTTL)
	case e.Max != 0 && (e.Max < e.Ban || e.Max > MaxBanTTL):
		return bad("max", "%s: want from ban (%s) to %s", e.Max, e.Ban, MaxBanTTL)
	case e.Forget < 0 || e.Forget > 10*MaxBanTTL:
		return bad("forget", "%s: want up to %s", e.Forget, 10*MaxBanTTL)
	}
	return nil
}

// escalations are the escalation rules in force, by the rule they count.
type escalations struct {
	byRule map[string][]*escalation
}

type escalation struct {
	Escalation
	counter admit.Rule // counts the refusals of one identifier
}

// refusal is a refusal an escalation counts: the identifier of its scope.
type refusal struct {
	e             *escalation
	tenant, value string
}

// SetEscalations puts es in force (each checked by CheckEscalation),
// replacing those before: a reload's.
func (b *Bans) SetEscalations(es []Escalation) error {
	set := &escalations{byRule: map[string][]*escalation{}}
	for _, e := range es {
		if err := CheckEscalation(&e); err != nil {
			return fmt.Errorf("escalation %q: %w", e.Name, err)
		}
		if e.Max == 0 {
			e.Max = e.Ban
		}
		if e.Forget == 0 {
			e.Forget = DefaultBanForget
		}
		x := &escalation{Escalation: e}
		x.counter = admit.Rule{Name: "escalation:" + e.Name, Algorithm: admit.SlidingWindow, Limit: max(e.Refusals-1, 1), Window: e.Within}
		set.byRule[e.Rule] = append(set.byRule[e.Rule], x)
	}
	b.esc.Store(set)
	return nil
}

// observe hears of a decision the store refused: each refusing rule that
// an escalation counts queues the refusal of the identifier of the
// escalation's scope, unless an untrusted caller named it (an address a
// tenant names is not the address of the client, who is another's) or no
// credential vouches for its tenant. Queued, never waited for: a full
// queue drops the refusal (counted).
func (b *Bans) observe(res *Resolution, dec *admit.Decision) {
	set := b.esc.Load()
	if len(set.byRule) == 0 {
		return
	}
	for r, result := range RuleResults(res.Rules, dec.Results) {
		if result.Allowed || result.Shadow {
			continue
		}
		for _, e := range set.byRule[r.Name] {
			f := refusal{e: e}
			who := &res.who
			switch e.Scope {
			case BanIP:
				if who.untrusted || who.ip == "" || b.isProtected(who.ip) {
					continue
				}
				f.value = who.ip
			case BanAPIKey:
				if !who.keyed {
					continue // a key no tenant holds: banning it bans no one
				}
				f.value = "sha256:" + who.keyHex()
			case BanUser:
				if who.unvouched || who.user == "" {
					continue
				}
				f.tenant, f.value = who.tenant, who.user
			case BanTenant:
				if who.unvouched {
					continue
				}
				f.value = who.tenant
			}
			if f.value == "" {
				continue
			}
			select {
			case b.queue <- f:
			default:
				b.stats.Dropped.Add(1)
			}
		}
	}
}

// escalate counts the queued refusals, each in the store under its
// escalation and identifier, and bans the identifiers past their count.
//
// The bans it makes are put in force here in batches: once the queue is
// empty, or every 100 ms while it is not (a flood of refusals), so that a
// flood of bans costs one rebuild of the bans in force per batch.
func (b *Bans) escalate(ctx context.Context) {
	var dec admit.Decision
	var made []Ban
	var evicted []string
	flushed := time.Now()
	for {
		if len(made) > 0 && (len(b.queue) == 0 || time.Since(flushed) > 100*time.Millisecond) {
			if len(evicted) > 0 {
				// The bans the new ones replaced leave first: the bound
				// holds here as in the store.
				b.drop(evicted...)
			}
			b.put(made...)
			made, evicted, flushed = made[:0], evicted[:0], time.Now()
		}
		var f refusal
		select {
		case <-ctx.Done():
			return
		case f = <-b.queue:
		}
		if b.counter == nil || b.banned(f) || slices.ContainsFunc(made, func(x Ban) bool { return x.ID == f.id() }) {
			continue
		}
		if g := f.group(); g != "" && b.escalatedOf(g)+countGroup(made, g) >= groupLimit(g) {
			b.stats.Full.Add(1) // one tenant's users, or one network, hold their part
			continue
		}
		ch := admit.Charge{Rule: &f.e.counter, Cost: 1}
		ch.Key = admit.Key{Scope: "escalation", Tenant: f.tenant, Subject: f.e.Scope + ":" + f.value, Rule: f.e.Name}.String()
		engine.PrepareChargeOf(&ch, f.tenant)
		if f.e.Refusals > 1 {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := b.counter.Decide(cctx, []admit.Charge{ch}, &dec)
			cancel()
			if err != nil {
				b.stats.Failures.Add(1)
				continue
			}
			if dec.Allowed {
				continue
			}
		}
		ban, ok := b.ban(ctx, f, func(id string) {
			evicted = append(evicted, id)
			made = slices.DeleteFunc(made, func(x Ban) bool { return x.ID == id })
		})
		if !ok {
			continue
		}
		made = append(made, ban)
		if f.e.Refusals > 1 {
			// The count starts over with the ban: once it ends (or is
			// lifted), the caller must be refused Refusals times again,
			// however long Within is.
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if err := b.counter.Reset(cctx, []admit.Charge{ch}); err != nil {
				b.stats.Failures.Add(1)
			}
			cancel()
		}
	}
}

// escalatedOf returns how many of the escalations' bans in force are of
// group (escalationGroup), as this server knows them.
func (b *Bans) escalatedOf(group string) int { return b.set.Load().escalated[group] }

func countGroup(bans []Ban, group string) int {
	n := 0
	for _, x := range bans {
		if escalationGroup(x) == group {
			n++
		}
	}
	return n
}

// groupLimit is the bound of an escalation group's bans.
func groupLimit(group string) int {
	if strings.HasPrefix(group, "net ") {
		return MaxEscalatedPerNetwork
	}
	return MaxEscalatedPerTenant
}

// group is the group the ban of f would count in (escalationGroup).
func (f refusal) group() string {
	return escalationGroup(Ban{Source: "escalation:" + f.e.Name, Scope: f.e.Scope, Tenant: f.tenant, Value: f.value})
}

// id is the id of the ban f's escalation makes of f's identifier.
func (f refusal) id() string { return banID("escalation:"+f.e.Name, f.e.Scope, f.tenant, f.value) }

// banned reports whether f's identifier is banned by f's escalation now.
func (b *Bans) banned(f refusal) bool {
	_, ok := b.Get(f.id())
	return ok
}

// ban bans f's identifier as its escalation says, and returns the ban in
// force; evicted is told of the ban it replaced, if any.
func (b *Bans) ban(ctx context.Context, f refusal, evicted func(id string)) (Ban, bool) {
	e := f.e
	ban := Ban{
		ID: f.id(), Scope: e.Scope, Value: f.value, Tenant: f.tenant, Source: "escalation:" + e.Name,
		Reason: fmt.Sprintf("%d refusals by rule %s within %s", e.Refusals, e.Rule, e.Within),
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	saved, made, err := b.store.Escalate(ctx, Escalated{Key: ban.ID, Ban: ban, Base: e.Ban, Max: e.Max, Forget: e.Forget, Evicted: func(id string) {
		b.stats.Evicted.Add(1)
		evicted(id)
	}}, time.Now())
	switch {
	case errors.Is(err, ErrBansFull):
		b.stats.Full.Add(1)
		return Ban{}, false
	case err != nil:
		b.stats.Failures.Add(1)
		return Ban{}, false
	case made:
		b.stats.Escalated.Add(1)
	}
	return saved, true
}

// EscalatedLength returns the length of an identifier's ban that strikes
// earlier bans precede: base doubled strikes times, at most max.
func EscalatedLength(base, most time.Duration, strikes int) time.Duration {
	d := base
	for range strikes {
		if d >= most/2 {
			return most
		}
		d *= 2
	}
	return min(d, most)
}
