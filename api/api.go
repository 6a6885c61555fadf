// Package api holds the OpenAPI 3.1 description of Admit's HTTP API, which
// admit serve serves at /openapi.yaml.
package api

import _ "embed"

// OpenAPI is openapi.yaml: every path, body, answer and error of the HTTP
// API. e2e/openapi_test.go checks a running server's answers against it.
//
//go:embed openapi.yaml
var OpenAPI []byte
