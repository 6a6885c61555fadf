// Package e2e holds Admit's browser tests: the demo page of admit serve,
// driven in headless Chromium. It is a module of its own so that the
// library's go.mod does not carry the browser driver.
package e2e
