package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/problem"
)

// Bounds on request bodies.
const (
	maxBody = 64 << 10
)

// writeProblem answers with a problem+json body.
func writeProblem(w http.ResponseWriter, status int, detail string) { problem.Write(w, status, detail) }

// statusOf maps an error to an HTTP status.
func statusOf(err error) int { return problem.Status(err) }

// writeError answers with the problem err describes. Internal errors are
// logged and described vaguely, the others say exactly what was wrong.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status := statusOf(err)
	detail := err.Error()
	if status == http.StatusInternalServerError {
		s.log.Error("internal error", "method", r.Method, "path", r.URL.Path, "err", err)
		detail = "internal error; see the server log"
	}
	writeProblem(w, status, detail)
}

// decodeJSON decodes r's body into dst strictly: at most maxBody bytes,
// one JSON value of the right shape, no unknown fields, no key twice in
// an object (see httpx.DuplicateKey), nothing after it.
func decodeJSON(w http.ResponseWriter, r *http.Request, dst any) error {
	body := bodies.Get().(*bodyBuffer)
	defer bodies.Put(body) // at most maxBody and what reading it grew
	buf := &body.buf
	buf.Reset()
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxBody)); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return admit.Errorf(admit.CodeInvalid, "reading the body: %v", err)
	}
	data := buf.Bytes()
	// Every body is an object: null (which decodes as {}) or any other
	// value is not one.
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] != '{' {
		return admit.Errorf(admit.CodeInvalid, "malformed JSON body: want a JSON object, got %.16q", t)
	}
	body.rd.Reset(data)
	dec := json.NewDecoder(&body.rd)
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		if errors.Is(err, io.EOF) {
			return admit.Errorf(admit.CodeInvalid, "the body is empty; want a JSON object")
		}
		return admit.Errorf(admit.CodeInvalid, "malformed JSON body: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return admit.Errorf(admit.CodeInvalid, "malformed JSON body: data after the JSON object")
	}
	// Decoded, the last of two values won; whoever read the body before
	// Admit (a proxy, a firewall, the platform's code) may have read the
	// first. Names are matched in any case, as the decoder matches them.
	if key, dup := httpx.DuplicateKey(data, true); dup {
		e := admit.Errorf(admit.CodeInvalid, "malformed JSON body: duplicate key %q", key)
		e.Field = key
		return e
	}
	// Decoded, text that is not UTF-8 became U+FFFD: two different ids
	// would be one.
	if key, bad := httpx.BadText(data); bad {
		e := admit.Errorf(admit.CodeInvalid, "malformed JSON body: %s holds text that is not UTF-8 (bytes that are not, or half a surrogate pair such as \\ud800)", fieldName(key))
		e.Field = strings.ToValidUTF8(key, "?")
		return e
	}
	return nil
}

// query returns r's query parameters, parsed strictly (httpx.Query),
// or answers 400 naming the parameter and returns false.
func (s *Server) query(w http.ResponseWriter, r *http.Request) (url.Values, bool) {
	q, err := httpx.Query(r.URL.RawQuery)
	if err != nil {
		e := admit.Errorf(admit.CodeInvalid, "%v", err)
		var qe *httpx.QueryError
		if errors.As(err, &qe) {
			e.Field = qe.Param
		}
		s.writeError(w, r, e)
		return nil, false
	}
	return q, true
}

// fieldName names a body's field for a message: its key, quoted, or the
// body itself.
func fieldName(key string) string {
	if key == "" {
		return "the body"
	}
	return strconv.Quote(strings.ToValidUTF8(key, "?"))
}

// bodyBuffer is where decodeJSON reads a body, and its reader.
type bodyBuffer struct {
	buf bytes.Buffer
	rd  bytes.Reader
}

// bodies are the buffers request bodies are read into.
var bodies = sync.Pool{New: func() any { return new(bodyBuffer) }}

// writeJSON answers with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, fmt.Sprintf("encoding the answer: %v", err))
		return
	}
	writeBody(w, status, append(b, '\n'))
}

// writeBody answers with b, of type application/json unless a Content-Type
// is set already.
func writeBody(w http.ResponseWriter, status int, b []byte) {
	h := w.Header()
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/json")
	}
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
