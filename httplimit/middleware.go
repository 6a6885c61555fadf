package httplimit

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/problem"
)

// Middleware returns middleware that decides every request against l, for
// the Who that who finds in it, before the next handler sees it. It answers
// as admit proxy does: an admitted request goes on with the RateLimit and
// RateLimit-Policy headers set; a refused one gets 429 Too Many Requests
// with Retry-After and a problem+json body naming the limit; a store that
// fails a rule that fails closed gets 503 with Retry-After. Retry-After
// is the wait itself, rounded up to whole seconds (admit proxy adds a
// random share of a second, Options.RetryJitter).
//
// An error from who refuses the request with the status its code maps to
// (an *admit.Error's: admit.CodeUnauthenticated 401, admit.CodePermission
// 403, admit.CodeUnavailable 503; any other error 400). The client sees
// the message of an *admit.Error that who returns as it is, wrapping
// nothing, such as admit.Errorf(admit.CodeUnauthenticated, "no API key"),
// unless its code is internal or unavailable; of any other
// error (one that wraps a cause, or is wrapped) only a detail of its own,
// the error going to the log, since its text may say what the client must
// not see (a database's address). A Who that lacks a scope some limit is
// per, or an IP that is not one, is refused with 400 and says which. A
// store that fails answers 503 with a detail that names no server, and
// the outage is logged (at most once every 10 seconds); any other error of
// the limiter (a limit the store cannot decide, a closed Limiter) is the
// program's, not the client's: 500, logged.
//
// Middleware panics when l or who is nil or l was not made by
// admit.NewLimiter, and the middleware when its
// next handler is: wiring mistakes show at wiring, as net/http's do.
//
// A handler may charge a cost it learns while working with Debit. The
// concurrency slots an admitted request holds are released when the next
// handler returns. Options change how: IdempotentDebits makes the debits
// of a request that carries an Idempotency-Key safe to retry.
func Middleware(l *admit.Limiter, who func(*http.Request) (admit.Who, error), opts ...MiddlewareOption) func(http.Handler) http.Handler {
	if l == nil {
		panic("httplimit.Middleware: nil *admit.Limiter")
	}
	if len(l.Rules()) == 0 {
		panic("httplimit.Middleware: an *admit.Limiter with no limits; make it with admit.NewLimiter")
	}
	if who == nil {
		panic("httplimit.Middleware: nil who func: say how a request names its caller")
	}
	var o middlewareOptions
	for _, opt := range opts {
		opt(&o)
	}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("httplimit.Middleware: nil next handler")
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			wh, err := who(r)
			if err != nil {
				writeWhoError(w, r, whoError(err, slog.Default()))
				return
			}
			var idem *debitKeys
			if o.idem != nil {
				if idem, err = o.debitKeys(r, wh); err != nil {
					writeError(w, r, err, 1, slog.Default())
					return
				}
			}
			st := states.Get().(*requestState)
			defer states.Put(st)
			if err := l.Decide(r.Context(), wh, 1, &st.d); err != nil {
				writeError(w, r, decideError(err), 1, slog.Default())
				return
			}
			st.buf = httpx.SetLimiterHeaders(w.Header(), st.buf, l.Rules(), &st.d)
			if !st.d.Allowed {
				writeRefusal(w, r, &st.d, httpx.RetrySeconds(st.d.RetryAfter))
				return
			}
			if st.d.Lease.ID != "" {
				// An unreleased lease expires: the error is not the
				// client's to see.
				defer func() { _ = l.Release(context.WithoutCancel(r.Context()), &st.d) }()
			}
			// The context holds a target of its own, not st: st goes back
			// to the pool when this returns, and a goroutine of the handler
			// may call Debit later.
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), debitKey{}, &debitTarget{l: l, who: wh, idem: idem})))
		})
	}
}

// Debit charges n ≥ 1 to the limits of the Middleware r passed through,
// for r's own Who: a cost the handler learned while working (tokens an LLM
// call took, bytes sent). It is applied whether it fits or not (see
// admit.Limiter.Debit); its error is the store's, or says that r did not
// come through Middleware. Where the Middleware has IdempotentDebits and
// r an Idempotency-Key, a retry's debits that an earlier attempt made
// charge nothing (see IdempotentDebits).
func Debit(r *http.Request, n int64) error {
	if r == nil {
		return admit.Errorf(admit.CodeInvalid, "httplimit.Debit: the request is nil")
	}
	t, ok := r.Context().Value(debitKey{}).(*debitTarget)
	if !ok {
		return admit.Errorf(admit.CodeInvalid, "httplimit.Debit: the request did not come through httplimit.Middleware")
	}
	if n < 1 {
		// The limiter's own error, before a key is claimed for nothing.
		_, err := t.l.Debit(r.Context(), t.who, n)
		return err
	}
	if t.idem == nil {
		_, err := t.l.Debit(r.Context(), t.who, n)
		return err
	}
	return t.idem.debit(r.Context(), t.l, t.who, n)
}

// debitTarget is what Debit charges: the limiter and Who of a request,
// and the idempotency keys of its debits when it has them.
type debitTarget struct {
	l    *admit.Limiter
	who  admit.Who
	idem *debitKeys
}

type debitKey struct{}

// requestState is what Middleware reuses across requests: a decision and
// the headers' buffer.
type requestState struct {
	d   admit.Decision
	buf []byte
}

var states = sync.Pool{New: func() any { return new(requestState) }}

// whoError is what the client is told when who failed: who's own
// *admit.Error when it is one that wraps nothing (a message written for
// the client) of a code the client can act on, else a message of the
// middleware's for the code found, the error going to log (an outage at
// most once every outageLogEvery).
func whoError(err error, log *slog.Logger) *admit.Error {
	if e, ok := err.(*admit.Error); ok && e != nil && e.Err == nil && e.Code != admit.CodeInternal && e.Code != admit.CodeUnavailable {
		return e
	}
	code := admit.CodeInvalid
	var e *admit.Error
	if errors.As(err, &e) && e != nil {
		code = e.Code
	}
	// A new error of the code found, which carries nothing of err: its
	// status is its code's alone (no wrapped error, such as a body too
	// large, may choose another and show err's text).
	switch code {
	case admit.CodeUnauthenticated:
		log.Warn("httplimit: who refused the request's credential", "err", logText(err))
		return admit.Errorf(code, "the request's credential is missing or unknown")
	case admit.CodePermission:
		log.Warn("httplimit: who refused the request's caller", "err", logText(err))
		return admit.Errorf(code, "the caller may not make this request")
	case admit.CodeUnavailable:
		if lastWhoOutageLog.due() {
			log.Error("httplimit: who could not reach what identifies callers", "err", logText(err))
		}
		return admit.Errorf(code, "the request's caller cannot be identified now; retry later")
	case admit.CodeInternal:
		log.Error("httplimit: who failed", "err", logText(err))
		return admit.Errorf(code, "internal error")
	}
	log.Warn("httplimit: who could not identify the request's caller", "err", logText(err))
	return admit.Errorf(admit.CodeInvalid, "the request does not say who makes it")
}

// writeWhoError answers a request who could not identify with e, which
// whoError made (and logged the cause of): the status of its code, its
// message, and Retry-After when it is an outage.
func writeWhoError(w http.ResponseWriter, r *http.Request, e *admit.Error) {
	endUnreadBody(w, r)
	status := problem.Status(e)
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	problem.Write(w, status, e.Message)
}

// whoFields are the fields of a limiter's errors about the Who a request
// names: the client's to fix.
var whoFields = map[string]bool{"tenant": true, "user": true, "action": true, "ip": true}

// decideError is the error a request is refused with when the limiter
// failed: a store's outage as it is (503), an error about the request's
// Who as it is (400, the limiter's own message), and anything else (a
// limit the store cannot decide, a closed Limiter) the program's: an
// internal error, which writeError logs and does not show.
func decideError(err error) error {
	var e *admit.Error
	if errors.As(err, &e) && e != nil && (e.Code == admit.CodeUnavailable || e.Code == admit.CodeInternal || e.Code == admit.CodeInvalid && whoFields[e.Field]) {
		return err
	}
	return &admit.Error{Code: admit.CodeInternal, Message: "the rate limiter failed: " + err.Error(), Err: err}
}

// writeRefusal answers a refused decision: 429, Retry-After (seconds, as
// retryAfter says) and a problem of type quota-exceeded naming the limits
// that refused (violated-policies), the one that asks for the longest
// wait (denied_by) and when to come back, in milliseconds.
func writeRefusal(w http.ResponseWriter, r *http.Request, d *admit.Decision, retryAfter int64) {
	endUnreadBody(w, r)
	w.Header().Set("Retry-After", strconv.FormatInt(retryAfter, 10))
	retry := httpx.CeilDiv(d.RetryAfter, time.Millisecond)
	problem.WriteDetails(w, problem.Refusal(d, "rate limited by "+strconv.Quote(d.DeniedBy)+"; retry after "+strconv.FormatInt(retry, 10)+" ms"))
}

// writeError answers a request that could not be decided, as problem+json
// with the status its error code maps to. An unavailable store (a rule
// that fails closed) also gets retryAfter seconds; an internal error is
// logged to log and not shown.
func writeError(w http.ResponseWriter, r *http.Request, err error, retryAfter int64, log *slog.Logger) {
	endUnreadBody(w, r)
	status := problem.Status(err)
	detail := err.Error()
	switch status {
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfter, 10))
		// The store's error names its servers: the log has it, once
		// every outageLogEvery at most, however many requests fail.
		if lastOutageLog.due() {
			log.Error("httplimit: the rate limiter's store is unavailable", "err", logText(err))
		}
		detail = "the rate limiter's store is unavailable; retry later"
	case http.StatusInternalServerError:
		log.Error("httplimit: internal error", "err", logText(err))
		detail = "internal error"
	}
	problem.Write(w, status, detail)
}

// logText is err's text with the text of its causes, which an
// *admit.Error's message may leave out.
func logText(err error) string {
	s := err.Error()
	for e := errors.Unwrap(err); e != nil; e = errors.Unwrap(e) {
		if t := e.Error(); !strings.Contains(s, t) {
			s += ": " + t
		}
	}
	return s
}

// outageLogEvery bounds how often a store's outage is logged: it fails
// every request while it lasts.
const outageLogEvery = 10 * time.Second

// lastOutageLog and lastWhoOutageLog are when the store's outage, and
// an outage of what who asks, were last logged.
var lastOutageLog, lastWhoOutageLog logClock

// logClock is when something was last logged, in Unix nanoseconds.
type logClock struct{ at atomic.Int64 }

// due reports whether outageLogEvery has passed since c was last due, and
// if so makes now the last time: of concurrent callers, one is told.
func (c *logClock) due() bool {
	now, last := time.Now().UnixNano(), c.at.Load()
	return now-last >= int64(outageLogEvery) && c.at.CompareAndSwap(last, now)
}

// endUnreadBody closes the connection of a request refused before its
// body was read (httpx.CloseUnreadBody). Behind BodyTimeout, which keeps
// the connection of a body already received, this is left to it.
func endUnreadBody(w http.ResponseWriter, r *http.Request) {
	if _, ok := r.Context().Value(slowBodyKey{}).(*slowBody); ok {
		return
	}
	httpx.CloseUnreadBody(w, r)
}
