// Package admit is a rate limiter for multi-tenant services: limits per
// tenant, user, action or client IP, decided all or nothing, in one
// process (memstore) or shared by many through Redis (redisstore).
//
// # Limiting requests
//
// A Limiter decides requests against its limits. Each Limit is an
// algorithm — Bucket (token bucket), GCRABucket, Window (fixed window),
// Sliding (sliding window), CalendarQuota, Concurrent — kept Per the scopes
// of a Who: PerTenant, PerUser, PerAction, PerIP, or none for one limit
// shared by everyone.
//
//	limiter, err := admit.NewLimiter(memstore.New(nil),
//		admit.Bucket("user", admit.PerSecond(100), 50).Per(admit.PerTenant, admit.PerUser),
//		admit.Bucket("tenant", admit.PerSecond(1000), 200).Per(admit.PerTenant),
//	)
//	d, err := limiter.Allow(ctx, admit.Who{Tenant: "acme", User: "alice"})
//	if !d.Allowed { /* refused by d.DeniedBy; retry after d.RetryAfter */ }
//
// A request is admitted only if every limit admits it, and then each is
// charged; a refused request charges none, so a user refused by its own
// limit costs its tenant nothing. A Who that lacks a scope some limit is
// per is an error, never an unlimited request. AllowN takes a cost, Peek
// answers what Allow would and charges nothing, Debit charges a cost
// known only after the work (it goes into debt rather than refuse). On
// the memory store none allocates for a caller seen lately (a new key is
// built once; a Concurrent limit makes a lease); each reports the limit
// closest to refusing, and Decide fills a reused
// Decision with every limit's Results. An IP is the address it names
// (a port dropped, IPv6 kept per /64). Two Limiters of one program cannot
// keep limits of one name in one store unless named apart
// (NewNamedLimiter). httplimit.Middleware puts a Limiter in front of
// net/http handlers.
//
// Errors are *Error values with a Code (ErrorCode) and, where one is at
// fault, the field (ErrorField): the edge maps them to HTTP and gRPC
// statuses.
//
// # Charges and stores
//
// Underneath, a request is a list of charges — a key, the Rule that governs
// it and a cost — and a Store decides them together: either every
// non-shadow charge admits the request and every admitting charge is
// charged, or nothing is. Policies (package policy), the HTTP server, the
// proxy and the Envoy service work at this level, with keys they build
// (Key) and rules from configuration; so can a program that needs
// reservations, leases by ID or resets (Store).
//
// # For store implementations
//
// A Store decides a set of charges all or nothing (Decide), books
// capacity ahead (Reserve), renews and releases concurrency leases, and
// resets keys; a store that keeps counts also gives back what was charged
// (Refund). The stores of
// this module, memstore and redisstore, share one engine, with one set of
// test vectors; storetest is the conformance suite every store runs.
//
// This package imports no store, network or configuration library.
package admit
