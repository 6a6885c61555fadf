// Package problem writes RFC 9457 problem details, and is the one place
// where Admit's error codes become HTTP statuses. The HTTP API, the
// middleware and the proxy answer errors through it, so that every HTTP
// edge of Admit says the same thing the same way.
package problem

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/admitdev/admit"
)

// Details is a problem details object (RFC 9457) with Admit's extension
// members.
type Details struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// RetryAfterMS and DeniedBy describe a refusal (429).
	RetryAfterMS *int64 `json:"retry_after_ms,omitempty"`
	DeniedBy     string `json:"denied_by,omitempty"`
}

// Write answers with a problem+json body of the given status and detail.
func Write(w http.ResponseWriter, status int, detail string) {
	WriteDetails(w, Details{Status: status, Detail: detail})
}

// WriteDetails answers with p; an empty Type is "about:blank" and an empty
// Title the status text.
func WriteDetails(w http.ResponseWriter, p Details) {
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	if p.Status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="admit"`)
	}
	w.WriteHeader(p.Status)
	b, _ := json.Marshal(p)
	_, _ = w.Write(append(b, '\n'))
}

// Status maps an error to an HTTP status: a body over its bound is 413,
// and Admit's error codes map to 400, 404, 409, 503, 403 and 401; anything
// else is 500.
func Status(err error) int {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge
	}
	switch admit.ErrorCode(err) {
	case admit.CodeInvalid:
		return http.StatusBadRequest
	case admit.CodeNotFound:
		return http.StatusNotFound
	case admit.CodeConflict:
		return http.StatusConflict
	case admit.CodeUnavailable:
		return http.StatusServiceUnavailable
	case admit.CodePermission:
		return http.StatusForbidden
	case admit.CodeUnauthenticated:
		return http.StatusUnauthorized
	case admit.CodeExhausted:
		return http.StatusTooManyRequests
	}
	return http.StatusInternalServerError
}

// TypeAbnormalUsage is the problem type of a refusal by a ban: the
// caller's usage was judged abusive, by an operator or an escalation rule
// (draft-ietf-httpapi-ratelimit-headers).
const TypeAbnormalUsage = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected"
