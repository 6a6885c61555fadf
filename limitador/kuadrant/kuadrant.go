// Package kuadrant turns Kuadrant's RateLimitPolicy and TokenRateLimitPolicy
// manifests into the Limitador limits file that the Kuadrant operator would
// write for them.
//
// The operator writes one Limitador limit per rate of each limit a policy
// holds, for each HTTPRoute or GRPCRoute the policy reaches:
//
//   - namespace is the route's "namespace/name" (the domain Kuadrant's
//     wasm-shim sends to Limitador for that route);
//   - the one condition is descriptors[0]["limit.NAME__HASH"] == "1" (a
//     TokenRateLimitPolicy's identifiers start "tokenlimit."), where NAME is
//     the limit's name with every character but letters, digits and _
//     replaced by _, and HASH the first four bytes of the SHA-256 of
//     "policy-namespace/policy-name/limit-name", in hex;
//   - variables are descriptors[0]["EXPRESSION"], one for each counter;
//   - max_value is the rate's limit (0 when negative) and seconds its window
//     in whole seconds, rounded down.
//
// A limit's when predicates and the policy's top-level when are evaluated
// by the wasm-shim, which sends the limit's descriptor entry only when they
// hold: they are not in the limits file. A TokenRateLimitPolicy's limits are
// written alike; the wasm-shim checks them with hits_addend 0 on the request
// and reports the response's usage.total_tokens as the hits.
//
// Which policies reach which route follows the Gateway API topology: a
// policy targets a Gateway, one of its listeners (sectionName), a route or
// one of its rules (sectionName); on each path from a Gateway listener to a
// route rule the policies are merged from the least specific to the most
// specific by their defaults or overrides and their atomic or merge
// strategy, and the limits of the merged policy are written. Import reads
// the routes from the files it is given; what the files do not say (a
// route that is not given, the listeners of a Gateway, the order of two
// policies without a creationTimestamp) it does not guess: a limit whose
// presence depends on it is refused, with the reason, and the rest is
// converted.
package kuadrant

import (
	"fmt"

	"github.com/admitdev/admit/yamlconf"
)

// Bounds on what Import reads. An input over one is refused, not read
// partly.
const (
	// MaxFileSize is the largest file Import reads, in bytes.
	MaxFileSize = 1 << 20
	// MaxFiles is the most files (policies and routes together) Import reads.
	MaxFiles = 256
	// MaxDocuments is the most YAML documents (or List items) Import reads
	// from all its files together.
	MaxDocuments = 2000
	// MaxLimits is the most limits one policy may hold.
	MaxLimits = 256
	// MaxRates is the most rates one limit may hold.
	MaxRates = 16
	// MaxCounters is the most counters one limit may hold.
	MaxCounters = 16
	// MaxPredicates is the most when predicates a list may hold.
	MaxPredicates = 64
	// MaxRules and MaxParentRefs bound a route, as the Gateway API does.
	MaxRules      = 16
	MaxParentRefs = 32
	// MaxWorlds is the most combinations of unknowns (see Import) weighed
	// for one route; past it the route's limits are refused.
	MaxWorlds = 1024
	// MaxEntries is the most Limitador limits Import writes.
	MaxEntries = 100000
)

// File is one manifest file: its name, for positions, and its contents.
type File struct {
	Name string
	Data []byte
}

// Limit is one entry of a Limitador limits file.
type Limit struct {
	Namespace  string
	MaxValue   int64
	Seconds    int64
	Conditions []string // CEL predicates over descriptors, all of which must hold
	Variables  []string // CEL expressions whose values qualify the counter
	Name       string   // the limit's name in its policy
	ID         string   // empty: the operator sets none
}

// Result is what Import converted and what it refused.
type Result struct {
	// Limits are the Limitador limits, ordered by namespace, name,
	// condition and the order of the rates in their policy.
	Limits []Limit
	// Refused names each thing that was not converted, where it is and why.
	Refused yamlconf.Errors
}

// Options tune Import. The zero value is ready to use.
type Options struct {
	// Namespace is the namespace of manifests whose metadata names none,
	// as kubectl apply -n gives it. Empty: such manifests are refused,
	// since a limit's namespace and identifier depend on it.
	Namespace string
}

// Import converts the RateLimitPolicy and TokenRateLimitPolicy manifests of
// policies, with the HTTPRoute and GRPCRoute manifests of routes as the
// topology, into Limitador limits. Each file may hold several YAML
// documents (---) or a List. The files are taken as the whole of the
// cluster's rate limit policies; the Gateways named by routes and policies
// are taken to exist, to be Kuadrant's, and to accept the routes that name
// them.
//
// Whatever cannot be converted is in Result.Refused with its file, line and
// reason, and the rest is converted; the error is non-nil only when the
// input is over a bound (MaxFiles, MaxFileSize) and nothing was read.
func Import(policies, routes []File, opts Options) (Result, error) {
	if n := len(policies) + len(routes); n > MaxFiles {
		return Result{}, fmt.Errorf("kuadrant: %d files; at most %d", n, MaxFiles)
	}
	for _, f := range append(append([]File(nil), policies...), routes...) {
		if len(f.Data) > MaxFileSize {
			return Result{}, fmt.Errorf("kuadrant: %s: %d bytes; at most %d", f.Name, len(f.Data), MaxFileSize)
		}
	}
	in := newInput(opts)
	for _, f := range policies {
		in.readFile(f, false)
	}
	for _, f := range routes {
		in.readFile(f, true)
	}
	limits := in.resolve()
	return Result{Limits: limits, Refused: in.refusals()}, nil
}
