package server

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/internal/tracing"
	"github.com/admitdev/admit/policy"
)

// handleAcquire is POST /v1/acquire: like check, but waits up to
// max_wait_ms for the request to be admitted. A request charged to limits
// tenants share waits in its class's queue (see waitQueues), so that
// waiters are served at their classes' shares; otherwise, when every
// charge is a token bucket or GCRA, the store books the capacity now (a
// reservation), so waiters are served in order; otherwise acquire retries
// when the refusing rule says it could pass. Nothing is charged when the
// wait would be too long, or when the client goes away before its turn;
// an answer of 200 is a request admitted and charged, a 429 one charged
// nothing.
func (s *Server) handleAcquire(w http.ResponseWriter, r *http.Request) {
	c := getCall()
	defer putCall(c)
	ctx, span := s.tracer.Start(r.Context(), propagation.HeaderCarrier(r.Header))
	if span.Recording() {
		span.SetAttributes(attribute.String("http.route", "/v1/acquire"))
	}
	span.End(s.acquire(ctx, w, r, c, span))
}

// acquire is handleAcquire in ctx, which holds the decision's span: it
// returns the error it answered with, or that the client went away.
func (s *Server) acquire(ctx context.Context, w http.ResponseWriter, r *http.Request, c *call, span tracing.Span) error {
	start := time.Now()
	var body acquireRequest
	if err := decodeJSON(w, r, &body); err != nil {
		s.fail(w, r, "acquire", err)
		return err
	}
	if body.MaxWaitMS < 0 || body.MaxWaitMS > s.maxWait.Milliseconds() {
		err := admit.Errorf(admit.CodeInvalid, "max_wait_ms %d: must be from 0 to %d", body.MaxWaitMS, s.maxWait.Milliseconds())
		s.fail(w, r, "acquire", err)
		return err
	}
	maxWait := time.Duration(body.MaxWaitMS) * time.Millisecond
	p := s.catalog.Policy()
	if err := s.request(r, c, &body.checkRequest, p, policy.Requests, 0); err != nil {
		s.fail(w, r, "acquire", err)
		return err
	}
	var err error
	switch key := queueKey(c.res.Charges); {
	case s.decider.RefuseBanned(&c.res, &c.d):
		c.out = policy.Banned // refused at once: no booking, no wait
	case key != "" && !c.req.DryRun:
		err = s.acquireShared(ctx, c, key, maxWait)
	case reservable(c.res.Charges) && !c.req.DryRun:
		err = s.acquireReserved(ctx, c, maxWait)
	default:
		err = s.acquirePolling(ctx, c, maxWait)
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr // the client went away; nothing to answer
		}
		s.fail(w, r, "acquire", err)
		return err
	}
	span.Decided(&c.res, &c.d, c.out)
	waited := time.Since(start)
	if !c.d.Allowed {
		waited = 0
	}
	s.answer(w, c, waited)
	s.record(c, "acquire", start)
	return nil
}

func reservable(charges []admit.Charge) bool {
	for i := range charges {
		if !engine.Reservable(charges[i].Rule.Algorithm) {
			return false
		}
	}
	return len(charges) > 0
}

// acquireReserved books the charges and sleeps until the booking's time.
// The answer's levels are read after the wait, at cost 0.
func (s *Server) acquireReserved(ctx context.Context, c *call, maxWait time.Duration) error {
	if s.bookings.refused(c, maxWait) {
		return nil
	}
	sent := time.Now()
	res, err := s.store.Reserve(ctx, c.res.Charges, maxWait)
	if err != nil {
		if admit.ErrorCode(err) == admit.CodeUnavailable {
			return s.failover(ctx, c, err)
		}
		return err
	}
	if !res.OK {
		// Report the refusal as a dry run sees it, with the wait the
		// reservation computed: booked capacity can make that wait
		// longer than the buckets alone say.
		if err := s.look(ctx, c, false); err != nil {
			if admit.ErrorCode(err) != admit.CodeUnavailable {
				return err
			}
			// The store went away after refusing the booking: still a
			// refusal, with levels unknown (or 503 if a rule fails closed).
			if err := s.failover(ctx, c, err); err != nil {
				return err
			}
		}
		if c.d.Allowed {
			c.d.Allowed, c.d.DeniedBy = false, c.res.Rules[0].Name
			c.d.Results[0].Allowed = false
		}
		c.d.RetryAfter = res.Wait
		s.bookings.learn(c, sent, res.Wait)
		return nil
	}
	if res.Wait > 0 {
		if err := sleep(ctx, res.Wait); err != nil {
			_ = s.store.CancelReservation(context.WithoutCancel(ctx), res.ID)
			return err
		}
	}
	if err := s.look(ctx, c, true); err != nil {
		if admit.ErrorCode(err) == admit.CodeUnavailable {
			// Booked, then the store went away: the levels are unknown.
			return s.failover(ctx, c, err)
		}
		return err
	}
	// The booking was charged and its time has come: the request is
	// admitted, whatever the look at the levels meets (later bookings
	// may keep a bucket below zero).
	admitBooked(&c.d)
	return nil
}

// admitBooked makes d, a look at the levels of charges a reservation
// booked, the admission it is.
func admitBooked(d *admit.Decision) {
	for i := range d.Results {
		r := &d.Results[i]
		if !r.Allowed {
			r.Allowed, r.RetryAfter = true, 0
		}
	}
	engine.Summarize(d)
}

// acquireShared decides c, and while it is refused waits in the queue of
// its class (key): when its turn comes it asks again as soon as the last
// refusal says it could pass, until maxWait is spent. It asks the store
// once on arriving, once each time its class could pass while it is
// first, and never while it waits behind others.
func (s *Server) acquireShared(ctx context.Context, c *call, key string, maxWait time.Duration) error {
	deadline := time.Now().Add(maxWait)
	if err := s.decide(ctx, c); err != nil || c.d.Allowed {
		return err
	}
	turn, leave := s.waiters.join(key)
	defer leave()
	if turn == nil {
		return nil // too many waiters: the refusal stands
	}
	wait := time.Until(deadline)
	if wait <= 0 {
		return nil
	}
	t := time.NewTimer(wait)
	select {
	case <-turn:
		t.Stop()
	case <-t.C:
		return nil // its turn never came: the first refusal stands
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
	for {
		wait := max(c.d.RetryAfter, time.Millisecond)
		if time.Now().Add(wait).After(deadline) {
			return nil
		}
		if err := sleep(ctx, wait); err != nil {
			return err
		}
		if err := s.decide(ctx, c); err != nil || c.d.Allowed {
			return err
		}
	}
}

// look decides c's charges without charging anything: at cost 0 (levels
// only) when levels is set, else as a dry run at their cost.
func (s *Server) look(ctx context.Context, c *call, levels bool) error {
	for i := range c.res.Charges {
		if levels {
			c.res.Charges[i].Cost = 0
		} else {
			c.res.Charges[i].DryRun = true
		}
	}
	err := s.store.Decide(ctx, c.res.Charges, &c.d)
	for i := range c.res.Charges {
		c.res.Charges[i].Cost, c.res.Charges[i].DryRun = c.req.Cost, c.req.DryRun
	}
	return err
}

// acquirePolling decides, and while refused waits as long as the refusal
// says before deciding again, until maxWait is spent. A refusal that says
// to come back at once (capacity others keep taking) would make one
// request thousands of decisions: each round waits at least twice as long
// as the last, from 5 ms up to a second, so that a minute's wait costs the
// store at most about 70 decisions.
func (s *Server) acquirePolling(ctx context.Context, c *call, maxWait time.Duration) error {
	deadline := time.Now().Add(maxWait)
	least := 5 * time.Millisecond
	for {
		if err := s.decide(ctx, c); err != nil {
			return err
		}
		wait := max(c.d.RetryAfter, least)
		least = min(2*least, time.Second)
		if c.d.Allowed || c.req.DryRun || time.Now().Add(wait).After(deadline) {
			return nil
		}
		if err := sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// Refused bookings. A booking refused because its wait W passed the
// caller's max_wait would wait at least W − t after t more: time takes
// from the wait only as it passes, other callers' bookings only add to
// it (a cancelled booking, which gives capacity back early, is the
// exception, and only refuses a booking it would have admitted for as
// long as the refusal stands). So the server remembers until when the
// same charges at least as costly are refused whatever their max_wait,
// and answers those itself, with no call: a caller asking again and
// again for capacity booked far ahead costs the store nothing until then.

// maxBookingRefusals bounds the refused bookings a server remembers.
const maxBookingRefusals = 1 << 14

type bookingRefusal struct {
	cost  int64
	until time.Time // the wait's end; refused while now + max_wait is before it
	d     admit.Decision
}

type bookingRefusals struct {
	mu sync.Mutex
	m  map[string]*bookingRefusal
}

// bookingKey names a request's charges.
func bookingKey(c *call) string {
	var b strings.Builder
	for i := range c.res.Charges {
		b.WriteString(c.res.Charges[i].Key)
		b.WriteByte(0)
	}
	return b.String()
}

// refused reports whether a remembered refusal refuses c's booking within
// maxWait, and then fills c's decision with it.
func (r *bookingRefusals) refused(c *call, maxWait time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.m) == 0 {
		return false
	}
	e := r.m[bookingKey(c)]
	now := time.Now()
	if e == nil || c.req.Cost < e.cost || !now.Add(maxWait).Before(e.until) {
		return false
	}
	c.d.Reset()
	c.d.Results = append(c.d.Results, e.d.Results...)
	engine.Summarize(&c.d)
	c.d.Allowed = false
	c.d.RetryAfter = e.until.Sub(now) - maxWait
	if c.d.DeniedBy == "" && len(c.res.Rules) > 0 {
		c.d.DeniedBy = c.res.Rules[0].Name
	}
	return true
}

// learn remembers that c's booking, sent at sent, was refused with the
// wait wait.
func (r *bookingRefusals) learn(c *call, sent time.Time, wait time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]*bookingRefusal{}
	}
	if len(r.m) >= maxBookingRefusals {
		now := time.Now()
		for k, e := range r.m {
			if !now.Before(e.until) {
				delete(r.m, k)
			}
		}
		if len(r.m) >= maxBookingRefusals {
			return
		}
	}
	e := &bookingRefusal{cost: c.req.Cost, until: sent.Add(wait)}
	e.d.Results = append(e.d.Results, c.d.Results...)
	r.m[bookingKey(c)] = e
}

// sleep waits d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
