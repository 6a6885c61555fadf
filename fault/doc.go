// Package fault holds Admit's end-to-end fault suite: real admit serve and
// admit proxy processes on real redis-server processes, all on loopback,
// started and stopped by PID, and every front end — /v1/check,
// /v1/acquire, /v1/leases, /v1/authz, the proxy, gRPC ShouldRateLimit and
// the WebSocket gateway — driven through each store fault under each
// on_error mode. docs/reliability.md reports what it measures.
package fault
