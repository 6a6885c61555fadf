package wsgateway

import (
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/policy"
)

// Refusals the gateway remembers, so that a client that keeps asking for
// what it was refused costs the store nothing: a tenant over
// messages_per_minute, and a session whose connections are refused.
//
// A sliding window refuses until its weighted count falls, and nothing
// another server does can make that sooner — it can only count more — so
// until the retry time the store gave, the answer is known without asking
// it: one decision per refusal period on each server, not one per frame or
// upgrade. A changed tier is a new rule, which does not inherit the
// refusal; a bucket reset by the admin API stays refused here until the
// retry time, which admits less, never more, than the limit.
//
// A full connection count (tenant_connections, connections_per_session)
// frees a slot whenever a connection ends, on any server. Its refusal is
// remembered for at most slotRefusalHold, and forgotten when a connection
// of the tenant ends on this server: a slot freed on another server may be
// refused here for that long, never taken twice.

// slotRefusalHold is how long a refusal by a full connection count is
// answered without the store.
const slotRefusalHold = time.Second

// throttle is a refusal of a tenant's messages the store gave.
type throttle struct {
	rule  *policy.Rule
	until time.Time
}

// connectRefusal is a refusal of a session's connections the store gave.
type connectRefusal struct {
	limits   *limits
	deniedBy string
	retry    time.Time // what the store said
	until    time.Time // when the store is asked again
	slots    bool      // by a connection count
}

// refusedLocally reports whether the tenant's messages, whose bucket is
// key, are known to be refused by rule at now, and for how much longer.
func (g *Gateway) refusedLocally(key string, rule *policy.Rule, now time.Time) (time.Duration, bool) {
	g.refusalsMu.Lock()
	defer g.refusalsMu.Unlock()
	t, ok := g.throttled[key]
	if !ok || t.rule != rule || !now.Before(t.until) {
		return 0, false
	}
	return t.until.Sub(now), true
}

// learnRefusal remembers that rule refused the messages of key for retry,
// from a decision asked at now.
func (g *Gateway) learnRefusal(key string, rule *policy.Rule, now time.Time, retry time.Duration) {
	if retry <= 0 {
		return
	}
	g.refusalsMu.Lock()
	defer g.refusalsMu.Unlock()
	g.throttled[key] = throttle{rule: rule, until: now.Add(retry)}
}

// connectRefusedLocally reports whether a connection of the tenant's
// session is known to be refused by l at now, and fills dec as its refusal.
func (g *Gateway) connectRefusedLocally(tenant, session string, l *limits, now time.Time, dec *admit.Decision) bool {
	g.refusalsMu.Lock()
	defer g.refusalsMu.Unlock()
	r, ok := g.connects[tenant][session]
	if !ok || r.limits != l || !now.Before(r.until) {
		return false
	}
	dec.Reset()
	dec.DeniedBy, dec.RetryAfter = r.deniedBy, max(r.retry.Sub(now), time.Millisecond)
	return true
}

// learnConnectRefusal remembers the refusal dec of a connection of the
// tenant's session by l, decided at now; freed is what slotsFreed said
// before the decision was asked. Only sessions the store knows get here:
// the entries are bounded by the live sessions refused within a refusal
// period.
func (g *Gateway) learnConnectRefusal(tenant, session string, l *limits, now time.Time, freed uint64, dec *admit.Decision) {
	if dec.RetryAfter <= 0 {
		return
	}
	r := connectRefusal{limits: l, deniedBy: dec.DeniedBy, retry: now.Add(dec.RetryAfter), until: now.Add(dec.RetryAfter)}
	if r.slots = dec.DeniedBy == LimitTenantConnections || dec.DeniedBy == LimitConnectionsPerSession; r.slots {
		r.until = now.Add(min(dec.RetryAfter, slotRefusalHold))
	}
	g.refusalsMu.Lock()
	defer g.refusalsMu.Unlock()
	if r.slots && g.slotsFreed != freed {
		return // a slot was freed while the store decided: it may fit now
	}
	m := g.connects[tenant]
	if m == nil {
		m = map[string]connectRefusal{}
		g.connects[tenant] = m
	}
	m[session] = r
}

// freedSlots returns how many times a connection's slot was freed on this
// server: a refusal by a full count decided meanwhile is not remembered.
func (g *Gateway) freedSlots() uint64 {
	g.refusalsMu.Lock()
	defer g.refusalsMu.Unlock()
	return g.slotsFreed
}

// slotFreed forgets the refusals of the tenant's connections by a full
// count: one of its connections on this server just freed its slot.
func (g *Gateway) slotFreed(tenant string) {
	g.refusalsMu.Lock()
	defer g.refusalsMu.Unlock()
	g.slotsFreed++
	for s, r := range g.connects[tenant] {
		if r.slots {
			delete(g.connects[tenant], s)
		}
	}
	if len(g.connects[tenant]) == 0 {
		delete(g.connects, tenant)
	}
}

// forgetRefusals drops the refusals that have ended by now: there is at
// most one per tenant refused on this server within a refusal period (two
// minutes at most for a per-minute limit), and one per session.
func (g *Gateway) forgetRefusals(now time.Time) {
	g.refusalsMu.Lock()
	defer g.refusalsMu.Unlock()
	for k, t := range g.throttled {
		if !now.Before(t.until) {
			delete(g.throttled, k)
		}
	}
	for tenant, m := range g.connects {
		for s, r := range m {
			if !now.Before(r.until) {
				delete(m, s)
			}
		}
		if len(m) == 0 {
			delete(g.connects, tenant)
		}
	}
}
