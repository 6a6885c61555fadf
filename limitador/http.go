package limitador

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/problem"
)

// MaxBodySize bounds the body of a POST to Limitador's HTTP API.
const MaxBodySize = 64 << 10

// HandlerOptions configure Handler.
type HandlerOptions struct {
	// Authorize, if set, says whether r may use the API (every path but
	// /status, which health checks read): false answers 401. Nil lets
	// every request in, as Limitador does.
	Authorize func(r *http.Request) bool
	// Denied is the detail of the 401 Authorize's refusal answers.
	Denied string
}

// Handler serves Limitador's HTTP API over lim: GET /status,
// /limits/{namespace} and /counters/{namespace}, and POST /check,
// /report and /check_and_report, with Limitador's paths, JSON and status
// codes. Its errors are problem+json (Limitador's are text).
func Handler(lim *Limiter, opts HandlerOptions) http.Handler {
	h := &handler{lim: lim, opts: opts, listing: make(chan struct{}, 1)}
	m := http.NewServeMux()
	m.HandleFunc("GET /status", h.status)
	m.HandleFunc("GET /limits/{namespace}", h.guard(h.limits))
	m.HandleFunc("GET /counters/{namespace}", h.guard(h.counters))
	m.HandleFunc("POST /check", h.guard(h.post(Check)))
	m.HandleFunc("POST /report", h.guard(h.post(Report)))
	m.HandleFunc("POST /check_and_report", h.guard(h.post(CheckAndReport)))
	return m
}

// Paths are the paths Handler serves (patterns of http.ServeMux).
var Paths = []string{"/status", "/limits/{namespace}", "/counters/{namespace}", "/check", "/report", "/check_and_report"}

type handler struct {
	lim  *Limiter
	opts HandlerOptions
	// listing holds the one GET /counters answered at a time: each reads
	// up to MaxCountersAnswered counters from the store.
	listing chan struct{}
}

// listingWrite bounds how long an answer of GET /counters may take to
// be written: a client that does not read it keeps it no longer; and
// listingWait how long a listing waits for the one before it.
const (
	listingWrite = 10 * time.Second
	listingWait  = 10 * time.Second
)

func (h *handler) guard(f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h.opts.Authorize != nil && !h.opts.Authorize(r) {
			httpx.CloseUnreadBody(w, r)
			problem.Write(w, http.StatusUnauthorized, h.opts.Denied) // with WWW-Authenticate
			return
		}
		f(w, r)
	}
}

// naiveTime writes t as Limitador's status does: UTC, without a zone.
func naiveTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.999999999") }

func (h *handler) status(w http.ResponseWriter, r *http.Request) {
	st := h.lim.Status()
	writeJSON(w, http.StatusOK, struct {
		StartedAt       string `json:"started_at"`
		ConfigAppliedAt string `json:"config_applied_at"`
		ConfigVersion   uint64 `json:"config_version"`
		ConfigErrSince  uint64 `json:"config_err_since"`
	}{naiveTime(st.StartedAt), naiveTime(st.ConfigAppliedAt), st.ConfigVersion, st.ConfigErrSince})
}

// limitJSON is a limit as Limitador's API writes it. The fields of Admit's
// own algorithms are written only when a limit names one.
type limitJSON struct {
	ID         *string  `json:"id"`
	Namespace  string   `json:"namespace"`
	MaxValue   int64    `json:"max_value"`
	Seconds    int64    `json:"seconds"`
	Name       *string  `json:"name"`
	Conditions []string `json:"conditions"`
	Variables  []string `json:"variables"`
	Algorithm  string   `json:"algorithm,omitempty"`
	Period     string   `json:"period,omitempty"`
	TimeZone   string   `json:"time_zone,omitempty"`
	// Distribution is "leased" for a leased limit.
	Distribution string `json:"distribution,omitempty"`
}

func limitView(l *Limit) limitJSON {
	opt := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	v := limitJSON{ID: opt(l.ID), Namespace: l.Namespace, MaxValue: l.MaxValue, Seconds: l.Seconds, Name: opt(l.Name),
		Conditions: slices.Clone(l.Conditions), Variables: slices.Clone(l.Variables), Algorithm: l.Algorithm, Period: l.Period, TimeZone: l.TimeZone, Distribution: l.Distribution}
	if v.Conditions == nil {
		v.Conditions = []string{}
	}
	if v.Variables == nil {
		v.Variables = []string{}
	}
	return v
}

func (h *handler) limits(w http.ResponseWriter, r *http.Request) {
	lims := h.lim.Limits().Namespace(r.PathValue("namespace"))
	out := make([]limitJSON, len(lims))
	for i, l := range lims {
		out[i] = limitView(l)
	}
	writeJSON(w, http.StatusOK, out)
}

type counterJSON struct {
	Limit            limitJSON         `json:"limit"`
	SetVariables     map[string]string `json:"set_variables"`
	Remaining        int64             `json:"remaining"`
	ExpiresInSeconds int64             `json:"expires_in_seconds"`
}

func (h *handler) counters(w http.ResponseWriter, r *http.Request) {
	// The others wait their turn, a while: each listing reads the store.
	wait := time.NewTimer(listingWait)
	defer wait.Stop()
	select {
	case h.listing <- struct{}{}:
		defer func() { <-h.listing }()
	case <-wait.C:
		w.Header().Set("Retry-After", "1")
		problem.Write(w, http.StatusTooManyRequests, "the counters are listed one request at a time on a server, and others are being listed; retry")
		return
	case <-r.Context().Done():
		return
	}
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(listingWrite))
	cs, truncated, err := h.lim.Counters(r.Context(), r.PathValue("namespace"))
	if err != nil {
		writeError(w, err)
		return
	}
	if truncated {
		w.Header().Set("Admit-Truncated", "the counters past "+strconv.Itoa(MaxCountersAnswered)+" or "+strconv.Itoa(MaxCountersListed>>20)+" MiB are left out")
	}
	out := make([]counterJSON, len(cs))
	for i, c := range cs {
		out[i] = counterJSON{Limit: limitView(c.Limit), SetVariables: c.Variables, Remaining: c.Remaining, ExpiresInSeconds: int64(c.ExpiresIn / time.Second)}
	}
	writeJSON(w, http.StatusOK, out)
}

// checkRequest is the body of POST /check, /report and /check_and_report.
// Pointers tell a field left out from a zero.
type checkRequest struct {
	Namespace       *string            `json:"namespace"`
	Values          *map[string]string `json:"values"`
	Delta           *uint64            `json:"delta"`
	ResponseHeaders *string            `json:"response_headers"`
}

func (h *handler) post(mode Mode) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		req, err := readCheck(w, r)
		if err != nil {
			writeError(w, err)
			return
		}
		ns, delta := *req.Namespace, *req.Delta
		var which Headers
		if mode == CheckAndReport && req.ResponseHeaders != nil {
			// Limitador writes draft-03's for "DraftVersion03" and nothing
			// for any other value; "IETF" asks for the current fields.
			switch *req.ResponseHeaders {
			case "DraftVersion03":
				which = HeadersDraft03
			case "IETF":
				which = HeadersIETF
			}
		}
		res, err := h.lim.Decide(r.Context(), mode, ns, []map[string]string{*req.Values}, delta, mode == CheckAndReport && req.ResponseHeaders != nil)
		if err != nil {
			if admit.ErrorCode(err) == admit.CodeUnavailable {
				h.lim.opts.Metrics.SetPartitioned(true)
			}
			writeError(w, err)
			return
		}
		h.lim.opts.Metrics.SetPartitioned(false)
		m := h.lim.opts.Metrics
		if mode == CheckAndReport && h.lim.Owns(ns) {
			if res.Limited {
				m.limited(ns, res.LimitName)
			} else {
				m.authorized(ns, true, delta)
			}
		}
		setHeaders(w.Header(), which, res.Counters)
		if res.Limited {
			if mode == Check {
				// Limitador's check answers its error's text.
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = io.WriteString(w, "Too many requests")
				return
			}
			writeJSON(w, http.StatusTooManyRequests, nil)
			return
		}
		writeJSON(w, http.StatusOK, nil)
	}
}

func readCheck(w http.ResponseWriter, r *http.Request) (*checkRequest, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(strings.ToLower(ct), "application/json") {
		return nil, admit.Errorf(admit.CodeInvalid, "the body is JSON (Content-Type: application/json), not %s", ct)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodySize))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, admit.Errorf(admit.CodeInvalid, "the body is larger than %d bytes", MaxBodySize)
		}
		return nil, admit.Errorf(admit.CodeInvalid, "reading the body: %v", err)
	}
	if k, dup := httpx.DuplicateKey(body, false); dup {
		return nil, admit.Errorf(admit.CodeInvalid, "the body gives %q twice", k)
	}
	if json.Valid(body) {
		// Bytes that are not UTF-8 would decode as U+FFFD, making two
		// callers one counter.
		if k, bad := httpx.BadText(body); bad {
			return nil, admit.Errorf(admit.CodeInvalid, "the body's %q is not UTF-8 text", k)
		}
	}
	var req checkRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, admit.Errorf(admit.CodeInvalid, "the body is not a check: %v (want {\"namespace\": …, \"values\": {…}, \"delta\": N})", err)
	}
	var missing []string
	if req.Namespace == nil {
		missing = append(missing, "namespace")
	}
	if req.Values == nil {
		missing = append(missing, "values")
	}
	if req.Delta == nil {
		missing = append(missing, "delta")
	}
	if len(missing) > 0 {
		return nil, admit.Errorf(admit.CodeInvalid, "missing field %s", strings.Join(missing, ", "))
	}
	if *req.Values == nil {
		*req.Values = map[string]string{}
	}
	if len(*req.Values) > MaxEntries {
		return nil, admit.Errorf(admit.CodeInvalid, "%d values; a request has at most %d", len(*req.Values), MaxEntries)
	}
	for k, v := range *req.Values {
		if len(k) > MaxEntryLen || len(v) > MaxEntryLen {
			return nil, admit.Errorf(admit.CodeInvalid, "a value's key or value is longer than %d bytes", MaxEntryLen)
		}
	}
	return &req, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		problem.Write(w, http.StatusInternalServerError, fmt.Sprintf("encoding the answer: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

func writeError(w http.ResponseWriter, err error) {
	code := problem.Status(err)
	detail := err.Error()
	if code == http.StatusInternalServerError {
		detail = "internal error; see the server log"
	}
	problem.Write(w, code, detail)
}
