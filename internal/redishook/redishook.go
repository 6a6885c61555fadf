// Package redishook gives the packages of this module that keep their own
// data in a redisstore's Redis (gateway sessions, the shared catalog, usage
// records) what redisstore keeps out of its API: the store's rueidis
// client and calls through its breaker. Benchmarks replay a decision's
// function call with Command and FunctionName; the command checks the
// names a log may show with PlainName.
//
// Package redisstore sets the hooks when it starts, before any package
// that imports it runs; each takes a *redisstore.Store.
package redishook

import (
	"context"

	"github.com/admitdev/admit"
	"github.com/redis/rueidis"
)

// FunctionName is the name of the store's Redis function (redisstore/internal/exact/lua
// registers it); a new library version that changes the arguments gets a
// new name, so that servers of two versions
// can share a deployment during an upgrade (the states they keep are the
// same). admit_v2 added batches (op "b"); admit_v3 the flag x, a
// decision another Cluster group refused; admit_v4 debits (a cost "dN");
// admit_v6 withdrawals for leased rules (the flag w); admit_v7 a
// bucket's withdrawal that books its refill ahead, which a server of an
// earlier version would take for tokens in hand; admit_v8 keeps a
// window's or a quota's count as an integer in a key of its own per
// period (counted by INCRBY), and op x, reset. admit_v8 carries the
// count an admit_v7 state holds for a quota's period, or a window longer
// than a minute, over into its own key; while servers of both versions
// run, they count those apart. admit_v9 decides fair charges (the flag
// s, a share per charge and the share's keys) and says how a share
// decided each charge in its reply. admit_v10 writes with a bucket's
// state the shape it was written under (its interval, burst and memory),
// and a bucket of another shape adopts the tokens the state holds rather
// than reading its time as its own; an admit_v9 server reads such a state
// as its own, and writes it back without a shape. admit_v11 names a
// decision's debits in its head, a mask of its charges, rather than in
// each debit's cost; the states it reads and writes are admit_v10's.
// admit_v12 takes a quota's period end negated, the length of a window
// that starts at the call (a first-hit window, run as a quota), which an
// admit_v11 library would take for a period long over.
const FunctionName = "admit_v12"

var (
	// Call makes one call to Redis, f, as the store makes its own:
	// through its circuit breaker (refused at once, with
	// CodeUnavailable, while it is open), within its timeout, and
	// counted in its health, so that data kept beside the limits fails as
	// fast as decisions during an outage. An error f returns is
	// CodeUnavailable, unless it is a Redis reply, which f should keep to
	// itself: Call counts it as a bug (CodeInternal).
	Call func(store any, ctx context.Context, f func(ctx context.Context, client rueidis.Client) error) error

	// Client returns the store's client, or nil while a lazily dialled
	// store has not connected yet.
	Client func(store any) rueidis.Client

	// Command returns the keys and arguments of the function call that
	// deciding charges alone makes (in a single group, as outside
	// Cluster). The charges must be valid and take no lease.
	Command func(store any, charges []admit.Charge) (keys, args []string)
)

// PlainName reports whether s, a Sentinel master's name, is one that logs
// and errors may show: letters, digits, '.', '-' and '_', as master names
// are. Any other, a name followed by ":password" say, is shown as "***".
func PlainName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return s != ""
}
