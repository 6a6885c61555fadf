package server

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/httplimit"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/internal/tracing"
	"github.com/admitdev/admit/policy"
)

// checkRequest is the body of POST /v1/check.
type checkRequest struct {
	Tenant     string            `json:"tenant"`
	User       string            `json:"user"`
	Action     string            `json:"action"`
	Cost       *int64            `json:"cost"`
	DryRun     bool              `json:"dry_run"`
	Debit      bool              `json:"debit"`
	IP         string            `json:"ip"`
	APIKey     string            `json:"api_key"`
	Session    string            `json:"session"`
	Attributes map[string]string `json:"attributes"`
}

// acquireRequest is the body of POST /v1/acquire.
type acquireRequest struct {
	checkRequest
	MaxWaitMS int64 `json:"max_wait_ms"`
}

// call is the per-request working set, pooled so that a decision's buffers
// are reused.
type call struct {
	req policy.Request
	res policy.Resolution
	d   admit.Decision
	buf []byte
	// claim names the decision in its answer and the decision log.
	claim string
	// out says whether the store decided, or a failure mode without it.
	out policy.Outcome
}

var calls = sync.Pool{New: func() any { return new(call) }}

func getCall() *call { return calls.Get().(*call) }

func putCall(c *call) {
	c.req, c.out = policy.Request{}, policy.Stored
	calls.Put(c)
}

// request fills c.req from a decoded body and the request's credentials,
// authenticates it (policy.AuthenticateRequest: the key in the body's api_key,
// X-API-Key or Authorization: Bearer; a service or admin token makes the
// caller trusted, and without one the request is untrusted) and resolves it
// (Resolve checks the bounds of every field).
func (s *Server) request(r *http.Request, c *call, b *checkRequest, p *policy.Policy, kind policy.Kind, ttl time.Duration) error {
	c.req = policy.Request{
		Tenant: b.Tenant, User: b.User, Action: b.Action, IP: b.IP, APIKey: b.APIKey,
		Session: b.Session, Attributes: b.Attributes, Cost: 1, DryRun: b.DryRun, Debit: b.Debit,
		Kind: kind, LeaseTTL: ttl,
	}
	if b.Cost != nil {
		c.req.Cost = *b.Cost
	}
	trusted := s.callerOf(r).trusted()
	c.req.Untrusted = !trusted
	c.req.Client = b.IP
	if !trusted || b.IP == "" {
		// An untrusted caller shares an anonymous part of the limits
		// tenants share by the address Admit sees, not one it names.
		if a := httplimit.ClientIP(r, s.trustedProxies, s.forwarded); a.IsValid() {
			c.req.Client = a.String()
		}
	}
	if c.req.APIKey == "" {
		c.req.APIKey = s.presentedKey(r, trusted)
	}
	if err := p.AuthenticateRequest(&c.req, trusted); err != nil {
		return err
	}
	return p.Resolve(&c.req, &c.res)
}

// presentedKey returns the API key r carries in X-API-Key, or in
// Authorization: Bearer unless that holds a service or the admin token
// (trusted).
func (s *Server) presentedKey(r *http.Request, trusted bool) string {
	if k := r.Header.Get("X-API-Key"); k != "" {
		return k
	}
	if k, ok := httplimit.Bearer(r); ok && !trusted {
		return k
	}
	return ""
}

func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request) {
	s.check(w, r, "check", false)
}

// handleReport is POST /v1/report: the body of a check, charged as a debit
// (the cost of work done, known after it), which is never refused.
func (s *Server) handleReport(w http.ResponseWriter, r *http.Request) {
	s.check(w, r, "report", true)
}

func (s *Server) check(w http.ResponseWriter, r *http.Request, endpoint string, debit bool) {
	c := getCall()
	defer putCall(c)
	ctx, span := s.tracer.Start(r.Context(), propagation.HeaderCarrier(r.Header))
	if span.Recording() {
		span.SetAttributes(attribute.String("http.route", "/v1/"+endpoint))
	}
	span.End(s.checkIn(ctx, w, r, c, endpoint, debit, span))
}

// checkIn is check in ctx, which holds the decision's span: it returns
// the error it answered with, if any.
func (s *Server) checkIn(ctx context.Context, w http.ResponseWriter, r *http.Request, c *call, endpoint string, debit bool, span tracing.Span) error {
	start := time.Now()
	var body checkRequest
	if err := decodeJSON(w, r, &body); err != nil {
		s.fail(w, r, endpoint, err)
		return err
	}
	if debit && body.Cost == nil {
		e := admit.Errorf(admit.CodeInvalid, "cost is required: a report says what the work cost")
		e.Field = "cost"
		s.fail(w, r, endpoint, e)
		return e
	}
	body.Debit = body.Debit || debit
	key, err := httpx.IdempotencyKey(r)
	if err != nil {
		s.fail(w, r, endpoint, err)
		return err
	}
	p := s.catalog.Policy()
	if err := s.request(r, c, &body, p, policy.Requests, 0); err != nil {
		s.fail(w, r, endpoint, err)
		return err
	}
	var claim *idemClaim
	if key != "" {
		var answered bool
		if claim, answered = s.claimIdempotency(w, r, endpoint, key, c, &body); answered {
			return nil
		}
	}
	decide := s.decide
	if claim != nil && claim.down {
		decide = func(ctx context.Context, c *call) error { return s.failover(ctx, c, claim.cause) }
	}
	if err := decide(ctx, c); err != nil {
		claim.finish(r.Context(), false, 0, nil)
		s.fail(w, r, endpoint, err)
		return err
	}
	span.Decided(&c.res, &c.d, c.out)
	status := s.answer(w, c, -1)
	claim.finish(r.Context(), charged(c), status, c.buf)
	s.record(c, endpoint, start)
	return nil
}

// charged reports whether c's decision charged something, or may have:
// admitted (a debit always is) at a cost above 0 by at least one rule, by
// the store or by a failure mode after the store failed (it may have
// applied the charge and answered too late).
func charged(c *call) bool {
	if !c.d.Allowed || c.req.DryRun || c.req.Cost <= 0 || len(c.d.Results) == 0 {
		return false
	}
	switch c.out {
	case policy.Stored, policy.FailedOpen, policy.FailedLocal:
		return true
	}
	return false
}

// fail answers an error and counts it.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, endpoint string, err error) {
	s.metrics.errors.WithLabelValues(endpoint, strconv.Itoa(statusOf(err))).Inc()
	s.writeError(w, r, err)
}

// decide decides c's charges, applying the rules' failure modes when the
// store cannot answer.
func (s *Server) decide(ctx context.Context, c *call) error {
	out, err := s.decider.Decide(ctx, &c.res, &c.d)
	c.out = out
	s.count(out, err)
	return err
}

// failover decides c after the store failed with cause.
func (s *Server) failover(ctx context.Context, c *call, cause error) error {
	out, err := s.decider.Failover(ctx, &c.res, &c.d, cause)
	c.out = out
	s.count(out, err)
	return err
}

// count counts a decision's outcome in the store metrics.
func (s *Server) count(out policy.Outcome, err error) {
	switch {
	case out == policy.FailedOpen:
		s.metrics.storeErrors.Inc()
		s.metrics.failOpen.Inc()
	case out == policy.FailedLocal:
		s.metrics.storeErrors.Inc()
		s.metrics.failLocal.Inc()
	case err != nil && admit.ErrorCode(err) == admit.CodeUnavailable:
		s.metrics.storeErrors.Inc()
	}
}

// record counts a decision in the metrics and the decision log.
func (s *Server) record(c *call, endpoint string, start time.Time) {
	s.metrics.observe(c, endpoint, time.Since(start))
	s.activity.add(start, endpoint, c.req.User, c.req.Action, &c.res, &c.d)
	if s.decisions != nil {
		s.decisions.add(c, time.Now())
	}
}

// debt reports whether a debit left its rule over its limit, and the
// longest wait until a request would pass again. A report that does so is
// answered 200, since it was charged, with over_limit and that wait in
// its body: a client that retries 429s would charge it again.
func debt(results []admit.Result) (time.Duration, bool) {
	wait, over := time.Duration(0), false
	for i := range results {
		if r := &results[i]; r.Debit && !r.Allowed && !r.Shadow {
			wait, over = max(wait, r.RetryAfter), true
		}
	}
	return wait, over
}

// answer writes the decision of c: 200 or 429, its headers and its JSON,
// in c.buf, and returns its status. waited is acquire's wait, or negative
// for none.
func (s *Server) answer(w http.ResponseWriter, c *call, waited time.Duration) int {
	h := w.Header()
	c.buf = httpx.SetHeaders(h, c.buf, c.res.Rules, c.res.Charges, c.d.Results)
	status := http.StatusOK
	overLimit := false
	if !c.d.Allowed {
		status = http.StatusTooManyRequests
		h.Set("Retry-After", strconv.FormatInt(httpx.RetrySeconds(c.d.RetryAfter), 10))
	} else if wait, over := debt(c.d.Results); over {
		c.d.RetryAfter, overLimit = wait, true
	}
	c.claim = s.claimBase + strconv.FormatUint(s.claimSeq.Add(1), 10)
	c.buf = appendDecision(c.buf[:0], c, c.claim, waited, overLimit)
	if status == http.StatusTooManyRequests {
		// A refusal is a problem too (appendDecision).
		h.Set("Content-Type", "application/problem+json")
	}
	writeBody(w, status, c.buf)
	return status
}
