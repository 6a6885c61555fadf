package httplimit

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
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
// An error from who refuses the request: an *admit.Error with the status
// its code maps to (admit.CodeUnauthenticated: 401, admit.CodePermission:
// 403) and its message as the problem's detail; any other error with 400
// and a detail of its own, the error's text going to the log only, since
// it may say what the client must not see (a database's address). A Who
// that lacks a scope some limit is per is refused the same way (400),
// never let through unlimited. A store that fails answers 503 with a
// detail that names no server.
//
// Middleware panics when l or who is nil, and the middleware when its
// next handler is: wiring mistakes show at wiring, as net/http's do.
//
// A handler may charge a cost it learns while working with Debit. The
// concurrency slots an admitted request holds are released when the next
// handler returns.
func Middleware(l *admit.Limiter, who func(*http.Request) (admit.Who, error)) func(http.Handler) http.Handler {
	if l == nil {
		panic("httplimit.Middleware: nil *admit.Limiter")
	}
	if who == nil {
		panic("httplimit.Middleware: nil who func: say how a request names its caller")
	}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("httplimit.Middleware: nil next handler")
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			wh, err := who(r)
			if err != nil {
				writeError(w, r, whoError(err, slog.Default()), 1, slog.Default())
				return
			}
			st := states.Get().(*requestState)
			defer states.Put(st)
			if err := l.Decide(r.Context(), wh, 1, &st.d); err != nil {
				writeError(w, r, err, 1, slog.Default())
				return
			}
			st.buf = httpx.SetLimiterHeaders(w.Header(), st.buf, l.Rules(), st.d.Results)
			if !st.d.Allowed {
				writeRefusal(w, r, &st.d, st.d.RetryAfterSeconds())
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
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), debitKey{}, &debitTarget{l, wh})))
		})
	}
}

// Debit charges n ≥ 1 to the limits of the Middleware r passed through,
// for r's own Who: a cost the handler learned while working (tokens an LLM
// call took, bytes sent). It is applied whether it fits or not (see
// admit.Limiter.Debit); its error is the store's, or says that r did not
// come through Middleware.
func Debit(r *http.Request, n int64) error {
	if r == nil {
		return admit.Errorf(admit.CodeInvalid, "httplimit.Debit: the request is nil")
	}
	t, ok := r.Context().Value(debitKey{}).(*debitTarget)
	if !ok {
		return admit.Errorf(admit.CodeInvalid, "httplimit.Debit: the request did not come through httplimit.Middleware")
	}
	_, err := t.l.Debit(r.Context(), t.who, n)
	return err
}

// debitTarget is what Debit charges: the limiter and Who of a request.
type debitTarget struct {
	l   *admit.Limiter
	who admit.Who
}

type debitKey struct{}

// requestState is what Middleware reuses across requests: a decision and
// the headers' buffer.
type requestState struct {
	d   admit.Decision
	buf []byte
}

var states = sync.Pool{New: func() any { return new(requestState) }}

// whoError is the error a request is refused with when who failed: its own
// when it is an admit error, else an invalid request that says nothing of
// the error, which goes to log.
func whoError(err error, log *slog.Logger) error {
	var e *admit.Error
	if errors.As(err, &e) {
		return err
	}
	log.Warn("httplimit: who could not identify the request's caller", "err", err)
	return admit.Errorf(admit.CodeInvalid, "the request does not say who makes it")
}

// writeRefusal answers a refused decision: 429, Retry-After (seconds, as
// retryAfter says) and a problem naming the limit that refused and when to
// come back, in milliseconds.
func writeRefusal(w http.ResponseWriter, r *http.Request, d *admit.Decision, retryAfter int64) {
	endUnreadBody(w, r)
	w.Header().Set("Retry-After", strconv.FormatInt(retryAfter, 10))
	retry := httpx.CeilDiv(d.RetryAfter, time.Millisecond)
	problem.WriteDetails(w, problem.Details{
		Status: http.StatusTooManyRequests, RetryAfterMS: &retry, DeniedBy: d.DeniedBy,
		Detail: "rate limited by " + strconv.Quote(d.DeniedBy) + "; retry after " + strconv.FormatInt(retry, 10) + " ms",
	})
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
		// The store's error names its servers; its outage is logged
		// where it is seen, at a bounded rate.
		detail = "the rate limiter's store is unavailable; retry later"
	case http.StatusInternalServerError:
		log.Error("httplimit: internal error", "err", err)
		detail = "internal error"
	}
	problem.Write(w, status, detail)
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
