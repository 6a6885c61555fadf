// Package problem writes RFC 9457 problem details, and is the one place
// where Admit's error codes become HTTP statuses. The HTTP API, the
// middleware and the proxy answer errors through it, so that every HTTP
// edge of Admit says the same thing the same way.
package problem

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/admitdev/admit"
)

// The problem types of draft-ietf-httpapi-ratelimit-headers, which
// registers them with IANA. Their problems name the policies (the rules,
// as the RateLimit-Policy field names them) that the request went past in
// the extension member "violated-policies".
const (
	// QuotaExceeded is the type of a request refused by one or more
	// limits: what a 429 of Admit's says.
	QuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	// AbnormalUsageDetected is the type of a request refused for a
	// pattern of requests that looks unintended or malicious: a ban
	// after repeated refusals, say.
	AbnormalUsageDetected = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected"
)

// titles are the titles of the problem types Admit writes: a type's title
// is the same for every problem of the type (RFC 9457, section 3.1.3).
var titles = map[string]string{
	QuotaExceeded:         "Quota exceeded",
	AbnormalUsageDetected: "Abnormal usage detected",
}

// Title returns the title of a problem of type typ and status: the
// type's own for a type Admit defines (QuotaExceeded's "Quota exceeded"),
// else the status text.
func Title(typ string, status int) string {
	if t, ok := titles[typ]; ok {
		return t
	}
	return http.StatusText(status)
}

// Details is a problem details object (RFC 9457) with Admit's extension
// members.
type Details struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// ViolatedPolicies names the policies a refused request went past
	// (the problem types QuotaExceeded and AbnormalUsageDetected).
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	// RetryAfterMS and DeniedBy describe a refusal (429): when to come
	// back, and the one limit that decided it (the one that asks for the
	// longest wait).
	RetryAfterMS *int64 `json:"retry_after_ms,omitempty"`
	DeniedBy     string `json:"denied_by,omitempty"`
}

// Refusal returns the problem of d, a refused decision: status 429, type
// QuotaExceeded, the limits that refused it as its violated policies
// (Violated), DeniedBy and RetryAfterMS from d, and detail.
func Refusal(d *admit.Decision, detail string) Details {
	return RefusalBy(d.DeniedBy, Violated(d), d.RetryAfter, detail)
}

// RefusalBy is Refusal for a refusal that is not an admit.Decision: by the
// limits violated, of which deniedBy asks for the longest wait, retryAfter.
// violated nil names deniedBy alone.
func RefusalBy(deniedBy string, violated []string, retryAfter time.Duration, detail string) Details {
	if violated == nil && deniedBy != "" {
		violated = []string{deniedBy}
	}
	retry := int64(0)
	if retryAfter > 0 {
		retry = int64((retryAfter + time.Millisecond - 1) / time.Millisecond)
	}
	return Details{
		Type: RefusalType(deniedBy), Status: http.StatusTooManyRequests, Detail: detail,
		ViolatedPolicies: violated, DeniedBy: deniedBy, RetryAfterMS: &retry,
	}
}

// RefusalType returns the problem type of a refusal by deniedBy:
// AbnormalUsageDetected for a ban's (package policy names a ban's rule
// "ban:" and the ban's id), QuotaExceeded for a limit's.
func RefusalType(deniedBy string) string {
	if strings.HasPrefix(deniedBy, "ban:") {
		return AbnormalUsageDetected
	}
	return QuotaExceeded
}

// Violated returns the names of the limits that refused d: its
// non-shadow results that did not fit, debits excepted (a debit is
// charged whether it fits or not, and refuses nothing). A decision whose
// Results are not kept (admit.Limiter.AllowN's) names DeniedBy alone; an
// admitted one, none.
func Violated(d *admit.Decision) []string {
	var names []string
	for i := range d.Results {
		if r := &d.Results[i]; !r.Allowed && !r.Shadow && !r.Debit {
			names = append(names, r.Rule)
		}
	}
	if names == nil && !d.Allowed && d.DeniedBy != "" {
		names = []string{d.DeniedBy}
	}
	return names
}

// Write answers with a problem+json body of the given status and detail.
func Write(w http.ResponseWriter, status int, detail string) {
	WriteDetails(w, Details{Status: status, Detail: detail})
}

// WriteDetails answers with p; an empty Type is "about:blank" and an empty
// Title the type's (QuotaExceeded's "Quota exceeded"), or for a type
// without one the status text.
func WriteDetails(w http.ResponseWriter, p Details) {
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Title == "" {
		p.Title = Title(p.Type, p.Status)
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
