package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/admitdev/admit"
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
// one JSON value of the right shape, no unknown fields, nothing after it.
func decodeJSON(w http.ResponseWriter, r *http.Request, dst any) error {
	body := http.MaxBytesReader(w, r.Body, maxBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		if errors.Is(err, io.EOF) {
			return admit.Errorf(admit.CodeInvalid, "the body is empty; want a JSON object")
		}
		return admit.Errorf(admit.CodeInvalid, "malformed JSON body: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return admit.Errorf(admit.CodeInvalid, "malformed JSON body: data after the JSON object")
	}
	return nil
}

// writeJSON answers with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, fmt.Sprintf("encoding the answer: %v", err))
		return
	}
	writeBody(w, status, append(b, '\n'))
}

func writeBody(w http.ResponseWriter, status int, b []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
