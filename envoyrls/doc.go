// Package envoyrls is Envoy's rate limit service (envoy.service.ratelimit.v3,
// gRPC) decided by Admit: a drop-in for envoyproxy/ratelimit that reads its
// YAML configuration (domains, nested descriptors, shadow mode, replaces,
// quota mode) and also answers descriptors against Admit's own tenants,
// tiers and rules (the catalog domain). Every descriptor of a request is
// decided in one store decision, all or nothing by default.
//
// Service implements the RateLimitService; Server serves it over gRPC with
// the standard health service and, on request, server reflection.
// docs/envoy.md describes the configuration, the differences from
// envoyproxy/ratelimit and the Envoy and Istio wiring the tests run.
package envoyrls
