package leased

import (
	_ "embed"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit/redisstore/internal/exact"
)

// regionScript returns a region script's source: the library's exact
// arithmetic (exact.Arithmetic) and then body, so that the home's
// timeline and a pool's pacing are computed in integers, as one Redis's
// bucket is.
func regionScript(body string) string {
	return "local fmod, floor = math.fmod, math.floor\n" + exact.Arithmetic + body
}

// homeScript is the home's side of a limit held across regions: one call
// grants a region part of the limit and applies the give-backs it
// carries.
//
// KEYS[1] is the limit's hash. A bucket keeps tat (µs, Redis time; the
// end of the timeline handed out), gen (when this incarnation of the key
// was made) and sh, the shape it was written under (N/per/burst): a
// timeline of another shape is adopted as one Redis's bucket adopts a
// state (tokens kept, capped at the new burst; a debt kept as time), and
// mTr, the least interval of its earlier shapes (per/n µs; mT is the same
// as a float, which earlier versions read), is kept until mTu for the
// give-backs of what they granted. A count (a fixed window or a
// quota) keeps e:end, the units granted in the period ending at end (µs;
// the end is also the period's gen), one per period in progress: so a
// period whose length changes counts anew, and finds its count again
// when changed back. Both keep, per region r, d:r (its demand, units a
// second), t:r (when it said so) and s:r (the last give-back applied).
//
// ARGV: region, kind (b or c), want, demand, then for a bucket N, per
// (µs), burst, initial, lookahead (µs) and the most it may owe, for a
// count its limit, its
// window (µs; 0 for a quota) and a quota's period in progress and the
// next (start, end, next end, µs), then give-backs as triples gen,
// units, seq (negative units: a debt).
//
// A home that may evict keys (maxmemory with a policy other than
// noeviction) is refused, with an error saying so: an evicted key would
// grant again what it granted.
//
// A home that lost its keys (a restart without persistence) cannot tell
// a bucket it lost from a new one, and the regions may still spend what
// the lost one granted. So a bucket made new while the server has been
// up for less than τ + lookahead starts at the later of the time its
// initial balance says and the server's start + τ + lookahead: every
// position the lost key handed out came before. A count has no such
// bound: what it granted in its period is simply forgotten, so counts
// need a home that keeps its data (docs/architecture.md).
//
// The reply: granted, first unlock (µs from now), last unlock (a count:
// its period's end; µs from now), gen, the region's share (parts per
// million), T as text ("per/n" µs; 0 for a count), the grant's name as text, how long
// the home has nothing more to grant (µs; 0 when it has), and the region's
// fair level (units a second, as text): the most max-min fairness would
// give it, whatever its demand; negative when the regions together ask for
// more than the limit.
var homeScript = rueidis.NewLuaScript(regionScript(homeScriptSource))

//go:embed lua/region_home.lua
var homeScriptSource string

// poolScript is a region's pool of one bucket: the stretches of the
// timeline the region holds, in its own Redis, which its servers take
// their allowances from.
//
// KEYS[1] is the pool's hash: c, the chunks (cmsgpack: a list of {u, n,
// k, tp, tn, T, e, g}: token j of n unlocks at u + j·T, T = tp/tn µs
// (T is the same as a float, which earlier versions read), k are taken, the rest
// expire at e, all µs of this Redis's clock; g is the home key's gen),
// b, the units to give back home (cmsgpack: {gen = units}), q the last
// give-back's sequence number (never less than the time it was made, so
// that a pool made anew after a restart does not repeat old ones), a and
// at the arrivals counted since at, dem, the region's demand (units a
// second, a moving average), ids, the names of the last grants added, z,
// until when the home said it has nothing to grant, fr, the region's fair
// level as of its last grant, and p, the triples sent home and not yet
// acknowledged.
//
// ARGV[1] is the operation; times are µs of this Redis's clock:
//
//	t want arrivals horizon period span least need shape: take up to want
//	  units that unlock within horizon, the arrivals (units asked of the
//	  server since its last take) counted into the demand; span is the
//	  rule's ("per/n" µs a unit, 0 for a count), least the fewest units
//	  the pool should hold, need what the taker's callers lack. Replies
//	  taken, first due (µs from now: the taken units not ready are due
//	  one per span after it), hold (µs from now), units held after, next
//	  unlock (µs from now; -1 when none is held), whether the pool wants
//	  a refill, gen, how many of the units taken are ready, how long the
//	  home said it has nothing (µs), whether the taker should wait for a
//	  refill (it got less than it needs, the home may have more, and the
//	  region asks for no more than its fair rate), the demand, and now.
//	a period least: prepare a refill: fold the arrivals into the demand,
//	  give back what exceeds twice the target (demand × period, at least
//	  least; latest first) and what expired. Replies held, target,
//	  demand, now, then gen, units, seq triples to send home: every one
//	  not acknowledged yet.
//	k seq: the home has applied the triples numbered up to seq.
//	d gen unlock n T expiry pos until fair shape: add a grant of n units, the
//	  first unlocking at unlock, one per T ("per/n" µs, as the home gave
//	  it) after it, held until expiry, unless the grant (gen and pos name
//	  it) was added already; and set what z sets.
//	r gen n expiry m: add n units given back by a server, all unlocked,
//	  held until expiry (given back home if that has passed); and give
//	  back home m more (its booked units), or, negative, what it owes
//	  (debits it could not pay), which the home charges the limit.
//	z until fair shape: the home has nothing to grant until then (0: it has),
//	  and the region's fair rate, units a second, as of its last grant,
//	  both said of the rule's shape: a take of another shape (the rule
//	  changed) ignores them.
//
// A grant's times are set by its agent, from the offsets the home gave
// and this Redis's clock as the agent's preparation read it: an unlock
// late and an expiry early by the round trip of that reading, however
// late the deposit itself runs.
var poolScript = rueidis.NewLuaScript(regionScript(poolScriptSource))

//go:embed lua/region_pool.lua
var poolScriptSource string
