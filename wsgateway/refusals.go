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
//
// The global rules WebSocket traffic is charged to (shared.go) refuse the
// same way: a window or a bucket until the retry time the store gave, and
// a share no sooner either — the class's part refills at its pace, and the
// others' claims lapse only when the epoch ends, which the retry time
// counts — so a refusal by a global rule is remembered until then, and a
// global concurrency rule's for at most slotRefusalHold, forgotten when any
// connection ends here. A share is the tenant's, so its refusal is kept by
// tenant (its messages' bucket, its session), never for every tenant; an
// anonymous client's share is its address's, and so is the key then
// (client.refusalKey). A refusal by a global rule holds under the policy
// that gave it: a reload asks the store again.

// slotRefusalHold is how long a refusal by a full connection count is
// answered without the store.
const slotRefusalHold = time.Second

// throttle is a refusal of a tenant's messages the store gave.
type throttle struct {
	// rule is the tenant's messages_per_minute when it alone refused;
	// shared the global rules of the policy otherwise.
	rule     *policy.Rule
	shared   *sharedRules
	deniedBy string
	until    time.Time
}

// connectRefusal is a refusal of a session's connections the store gave.
type connectRefusal struct {
	limits   *limits
	deniedBy string
	retry    time.Time // what the store said
	until    time.Time // when the store is asked again
	slots    bool      // by a connection count
	// shared is set when a global rule refused: the refusal holds while
	// the policy does. freed is slotsFreed when it was decided: a refusal
	// by a global concurrency rule (sr.slots) holds until any slot is
	// freed here.
	shared *sharedRules
	sr     sharedRefusal
	freed  uint64
}

// refusedLocally reports whether the messages of key (the tenant's
// message bucket, made the client's: client.refusalKey) are known to be
// refused at now, when the tenant's messages_per_minute is rule and the
// global rules are shared: for how much longer, and by which rule.
func (g *Gateway) refusedLocally(key string, rule *policy.Rule, shared *sharedRules, now time.Time) (time.Duration, string, bool) {
	g.refusalsMu.Lock()
	defer g.refusalsMu.Unlock()
	t, ok := g.throttled[key]
	if !ok || !now.Before(t.until) || t.shared == nil && t.rule != rule || t.shared != nil && t.shared != shared {
		return 0, "", false
	}
	return t.until.Sub(now), t.deniedBy, true
}

// learnRefusal remembers the refusal dec of the messages of key, from a
// decision asked at now of charges whose rules are m's.
func (g *Gateway) learnRefusal(key string, m *msgCharges, now time.Time, dec *admit.Decision) {
	if dec.RetryAfter <= 0 {
		return
	}
	t := throttle{rule: m.rules[0], deniedBy: dec.DeniedBy, until: now.Add(dec.RetryAfter)}
	if sharedRefusalOf(dec, m.rules, 1).refused {
		t.shared = m.shared
	}
	g.refusalsMu.Lock()
	defer g.refusalsMu.Unlock()
	g.throttled[key] = t
}

// connectRefusedLocally reports whether a connection of the tenant's
// session (made the client's: client.refusalKey) is known to be refused
// at now by l or by the global rules shared, and fills dec as its
// refusal.
func (g *Gateway) connectRefusedLocally(tenant, session string, l *limits, shared *sharedRules, now time.Time, dec *admit.Decision) (sharedRefusal, bool) {
	g.refusalsMu.Lock()
	defer g.refusalsMu.Unlock()
	r, ok := g.connects[tenant][session]
	if !ok || r.limits != l || !now.Before(r.until) ||
		r.shared != nil && (r.shared != shared || r.sr.slots && r.freed != g.slotsFreed) {
		return sharedRefusal{}, false
	}
	dec.Reset()
	dec.DeniedBy, dec.RetryAfter = r.deniedBy, max(r.retry.Sub(now), time.Millisecond)
	return r.sr, true
}

// learnConnectRefusal remembers the refusal dec of a connection of the
// tenant's session (see connectRefusedLocally) by l and the global rules
// shared (what they say of it: sr), decided at now; freed is what
// slotsFreed said before the decision was asked. Only sessions the store
// knows get here: the entries are bounded by the live sessions (of an
// anonymous tenant, by session and address) refused within a refusal
// period.
func (g *Gateway) learnConnectRefusal(tenant, session string, l *limits, shared *sharedRules, now time.Time, freed uint64, dec *admit.Decision, sr sharedRefusal) {
	if dec.RetryAfter <= 0 {
		return
	}
	r := connectRefusal{limits: l, deniedBy: dec.DeniedBy, retry: now.Add(dec.RetryAfter), until: now.Add(dec.RetryAfter), sr: sr, freed: freed}
	r.slots = dec.DeniedBy == LimitTenantConnections || dec.DeniedBy == LimitConnectionsPerSession
	if sr.refused {
		r.shared = shared
	}
	if r.slots || sr.slots {
		r.until = now.Add(min(dec.RetryAfter, slotRefusalHold))
	}
	g.refusalsMu.Lock()
	defer g.refusalsMu.Unlock()
	if (r.slots || sr.slots) && g.slotsFreed != freed {
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
