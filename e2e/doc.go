// Package e2e holds Admit's end-to-end tests against built `admit serve`
// processes: the demo page driven in headless Chromium, and a gateway
// killed with SIGKILL whose connection slots another server on the same
// Redis reclaims after the lease TTL. It is a module of its own so that
// the library's go.mod does not carry the browser driver.
package e2e
