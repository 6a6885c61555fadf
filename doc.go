// Package admit is the vocabulary of the Admit rate limiter: rates, rules
// and their algorithms, charges, decisions, leases, reservations and the
// Store interface that keeps bucket state.
//
// A request resolves to a list of charges — one bucket key, the rule that
// governs it, and a cost — and a Store decides them together: either every
// non-shadow charge admits the request and every admitting charge is
// charged, or nothing is charged. That is how hierarchical limits (user →
// tenant → global) stay exact.
//
// The algorithms are pure transitions (Step, Log.Eval, LeaseSet.Eval) with
// the time passed in as Unix nanoseconds, in integer arithmetic with no
// float and no drift: the memory store, the Redis store's scripts and the
// simulator share one definition and one set of test vectors.
//
// This package imports no store, network or configuration library; those
// live in subpackages (memstore, storetest) and later in the server.
package admit
