// Package limitador decides Limitador's limits with Admit's stores, so
// that Kuadrant, or anything else that speaks to Limitador, can be
// pointed at Admit unchanged.
//
// A limits file is Limitador's: a YAML list of limits, each with a
// namespace (the Envoy rate limit request's domain), a max_value per
// seconds, CEL conditions that must all hold for the limit to apply, and
// CEL variables whose values give each caller a counter of its own. CEL
// sees the request's descriptors as descriptors, a list of maps of
// strings, and the limit's own name and id as limit.name and limit.id.
//
// Every limit of the request's namespace that applies is counted, and the
// request is refused when any of them would go over: the counters are
// charged together or not at all. A limit's window is fixed and starts at
// its counter's first hit (admit.FirstHitWindow), unless the limit names
// another algorithm of Admit's.
//
// Limiter decides; Service answers Envoy's rate limit service and
// Kuadrant's own RPCs for the namespaces the limits name; Handler serves
// Limitador's HTTP API.
package limitador
