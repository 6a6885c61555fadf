package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/idempotency"
	"github.com/admitdev/admit/internal/httpx"
)

// DefaultIdempotencyWindow is how long an answer is kept for retries when
// Options.IdempotencyWindow is 0.
const DefaultIdempotencyWindow = idempotency.DefaultWindow

// idempotencyPending is how long a key is held for a request still being
// decided: a server that stopped meanwhile lets its key go then.
const idempotencyPending = idempotency.PendingTTL

// IdempotencyHeader names a request's idempotency key: a retry of a
// charge made with the same key, by the same tenant, within the window
// is answered as the first was and charges nothing.
const IdempotencyHeader = httpx.IdempotencyHeader

// addressScope is the address an anonymous caller's keys are kept under:
// itself, or an IPv6 address's /64, which one host may hold whole.
func addressScope(addr string) string {
	ip, err := netip.ParseAddr(addr)
	if err != nil || !ip.Unmap().Is6() {
		return addr
	}
	p, _ := ip.Prefix(64)
	return p.String()
}

// idemClaim is a request's claim of its idempotency key.
type idemClaim struct {
	store             idempotency.Store
	scope, key, token string
	fingerprint       [32]byte
	keep              time.Duration
	// until is when the claim lets the key go by itself.
	until time.Time
	// down says the keys' store could not be reached to claim the key:
	// the request is decided by the failure modes without the store,
	// since a charge sent to a store that does not answer may still be
	// applied, and its retry, claiming again, would charge it twice.
	down  bool
	cause error
	// held is where this server keeps the key meanwhile: the answer a
	// down claim was decided to, replayed to its retries here until the
	// keys' store takes it.
	held *heldKeys
	hk   string
	// retry keeps an answer the store did not take for later (the
	// server's idemRetrier).
	retry *idemRetrier
}

// claimIdempotency claims r's idempotency key for c's request to
// endpoint. It reports true when it has answered r itself: a replay of
// the key's answer, 409 while the key's first request is being decided,
// 422 when the key was used for another request, 429 when the caller
// holds the most keys it may. A claim is nil when r has no key; it is
// down when the keys' store could not be reached, and the request is
// then decided by the failure modes alone.
//
// A key is its caller's: its tenant's, as trusted (a service or admin
// token) or not, or an anonymous caller's address; one key names one
// request, whichever endpoint it is sent to.
func (s *Server) claimIdempotency(w http.ResponseWriter, r *http.Request, endpoint, key string, c *call, body *checkRequest) (*idemClaim, bool) {
	// An anonymous caller's keys, and those of a tenant the catalog does
	// not know (which any caller may name), are its address's (an IPv6
	// address's /64), kept apart from the tenants' and bounded tighter:
	// no caller fills or reads another's by naming it.
	store, scope := s.idem, ""
	if t := c.res.Tenant; t != nil && t.Source != "default" {
		scope = "tenant:" + t.ID
	} else {
		store, scope = s.anonIdem, "anon:"+addressScope(c.req.Client)
	}
	if !c.req.Untrusted {
		scope = "trusted:" + scope
	}
	canon, _ := json.Marshal(body)
	cl := &idemClaim{store: store, scope: scope, key: key, fingerprint: sha256.Sum256(append([]byte(endpoint+"\x00"), canon...)), keep: s.idemWindow,
		until: time.Now().Add(idempotencyPending), retry: s.idemRetry}
	var t [16]byte
	_, _ = rand.Read(t[:])
	cl.token = hex.EncodeToString(t[:])
	cl.held, cl.hk = s.held, scope+"\x00"+key
	if got, ok := s.held.get(cl.hk, time.Now()); ok {
		// Decided here while the keys' store did not answer: this
		// server's answer stands until the store takes it.
		s.answerClaimed(w, got, cl.fingerprint, key)
		return nil, true
	}
	got, err := store.Begin(r.Context(), cl.scope, cl.key, cl.fingerprint, cl.token, idempotencyPending)
	switch {
	case err != nil && admit.ErrorCode(err) == admit.CodeUnavailable:
		// Decided by the failure modes, the key claimed here: its
		// retries to this server are told to wait, then answered as it
		// was; the store gets the answer (or the claim it may make late
		// is let go) once it answers.
		cl.down, cl.cause = true, err
		s.held.claim(cl.hk, cl.fingerprint, cl.until)
		return cl, false
	case err != nil:
		s.fail(w, r, endpoint, err)
		return nil, true
	case got.State == idempotency.Claimed:
		return cl, false
	}
	s.answerClaimed(w, got, cl.fingerprint, key)
	return nil, true
}

// answerClaimed answers a request whose key is held already, as got says.
func (s *Server) answerClaimed(w http.ResponseWriter, got idempotency.Entry, fingerprint [32]byte, key string) {
	switch {
	case got.State == idempotency.Full:
		w.Header().Set("Retry-After", strconv.FormatInt(httpx.CeilDiv(got.RetryAfter, time.Second), 10))
		writeProblem(w, http.StatusTooManyRequests, "too many "+IdempotencyHeader+"s are kept (by this caller, or by the server in all); send this request without one, or retry once an older key expires")
	case got.Fingerprint != fingerprint:
		writeProblem(w, http.StatusUnprocessableEntity, IdempotencyHeader+" "+key+" was given with another request; a retry must send the same request, and another request another key")
	case got.State == idempotency.Pending:
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusConflict, "the request of "+IdempotencyHeader+" "+key+" is being decided; retry in a moment")
	default:
		w.Header().Set("Idempotent-Replayed", "true")
		writeBody(w, got.Status, got.Body)
	}
}

// finish keeps the answer for retries when it charged something, or may
// have: a failure mode's answer is kept too, since a store that timed out
// may have applied the charge after all; otherwise (a refusal, a dry run,
// nothing to charge, an error) it lets the key go, and a retry decides
// again.
func (cl *idemClaim) finish(ctx context.Context, charged bool, status int, body []byte) {
	if cl == nil {
		return
	}
	if cl.down {
		// Kept here, and for the store once it answers; or let go, here
		// and of the claim the store may make late.
		if !charged {
			cl.held.drop(cl.hk)
			cl.retry.add(cl, idempotency.Entry{}, opAbandon)
			return
		}
		a := idempotency.Entry{State: idempotency.Done, Fingerprint: cl.fingerprint, Status: status, Body: bytes.Clone(body)}
		cl.held.answer(cl.hk, a)
		cl.retry.add(cl, a, opLand)
		return
	}
	ctx = context.WithoutCancel(ctx)
	if !charged {
		_ = cl.store.Abandon(ctx, cl.scope, cl.key, cl.token)
		return
	}
	a := idempotency.Entry{Fingerprint: cl.fingerprint, Status: status, Body: bytes.Clone(body)}
	if err := cl.store.Finish(ctx, cl.scope, cl.key, a, cl.keep); err != nil {
		// The key stays claimed until cl.until: its retries are told to
		// wait meanwhile, and the answer is kept once the store takes it.
		cl.retry.add(cl, a, opFinish)
	}
}

// idemRetrier keeps, until the keys' store takes them, the answers it
// refused (a Redis that paused, or failed over, as they were decided):
// within its claim, a key's retries are told to wait, and once its answer
// is kept, replayed it. Without it, a charge the late store applied after
// all would be charged again by the retry that found the claim gone.
type idemRetrier struct {
	mu      sync.Mutex
	waiting []idemAnswer
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

type idemAnswer struct {
	cl *idemClaim
	a  idempotency.Entry
	op idemOp
}

// idemOp is what an answer waits to do in the keys' store.
type idemOp uint8

const (
	opFinish  idemOp = iota // keep a for the claim
	opAbandon               // let the claim go
	// opLand keeps a, decided without a claim in the store: the key is
	// claimed first (a claim the store made late, ours, let go first),
	// unless another answer holds it already.
	opLand
)

// heldKeys are the keys of requests this server decided while the keys'
// store did not answer, and their answers once decided: their retries
// here are told to wait, then answered so, until the store takes the
// answers. At most maxIdemRetries are held.
type heldKeys struct {
	mu   sync.Mutex
	keys map[string]*heldKey
}

type heldKey struct {
	a     idempotency.Entry
	until time.Time
}

func newHeldKeys() *heldKeys { return &heldKeys{keys: map[string]*heldKey{}} }

// claim holds k, pending, until until; a key past the bound is not held.
func (h *heldKeys) claim(k string, fp [32]byte, until time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.keys) < maxIdemRetries {
		h.keys[k] = &heldKey{a: idempotency.Entry{State: idempotency.Pending, Fingerprint: fp}, until: until}
	}
}

// answer keeps a as k's answer, if k is held.
func (h *heldKeys) answer(k string, a idempotency.Entry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.keys[k]; e != nil {
		e.a = a
	}
}

// get returns what k holds, if it is held and its claim lasts.
func (h *heldKeys) get(k string, now time.Time) (idempotency.Entry, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.keys[k]
	if e == nil {
		return idempotency.Entry{}, false
	}
	if !now.Before(e.until) {
		delete(h.keys, k)
		return idempotency.Entry{}, false
	}
	return e.a, true
}

func (h *heldKeys) drop(k string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	delete(h.keys, k)
	h.mu.Unlock()
}

// maxIdemRetries bounds the answers waiting for the store, and the keys
// held here: past them an answer is dropped, and its key let go with its
// claim.
const maxIdemRetries = 10_000

// idemRetryEvery is how often answers waiting are offered again.
const idemRetryEvery = 200 * time.Millisecond

func newIdemRetrier() *idemRetrier {
	r := &idemRetrier{wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

func (r *idemRetrier) add(cl *idemClaim, a idempotency.Entry, op idemOp) {
	if r == nil {
		return
	}
	r.mu.Lock()
	if len(r.waiting) < maxIdemRetries {
		r.waiting = append(r.waiting, idemAnswer{cl, a, op})
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *idemRetrier) run() {
	defer close(r.done)
	t := time.NewTicker(idemRetryEvery)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-r.wake:
		case <-t.C:
		}
		r.mu.Lock()
		batch := r.waiting
		r.waiting = nil
		r.mu.Unlock()
		var again []idemAnswer
		failed := false
		for _, w := range batch {
			if time.Now().After(w.cl.until) {
				w.cl.held.drop(w.cl.hk) // the claim is gone: so is the key
				continue
			}
			if failed {
				// The store did not answer the last: the rest wait for
				// the next round, rather than each a timeout of this one.
				again = append(again, w)
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			done, answered := r.do(ctx, w)
			if !done {
				again, failed = append(again, w), !answered
			}
			cancel()
		}
		if len(again) > 0 {
			r.mu.Lock()
			r.waiting = append(again, r.waiting...)
			r.mu.Unlock()
		}
	}
}

// do makes w's call to the keys' store, and reports whether it is done
// and whether the store answered.
func (r *idemRetrier) do(ctx context.Context, w idemAnswer) (done, answered bool) {
	cl := w.cl
	switch w.op {
	case opAbandon:
		err := cl.store.Abandon(ctx, cl.scope, cl.key, cl.token)
		return err == nil, err == nil
	case opFinish:
		err := cl.store.Finish(ctx, cl.scope, cl.key, w.a, cl.keep)
		return err == nil, err == nil
	}
	got, err := cl.store.Begin(ctx, cl.scope, cl.key, cl.fingerprint, cl.token, idempotencyPending)
	switch {
	case err != nil:
		return false, false
	case got.State == idempotency.Pending:
		// Ours, made late, or another server's: let ours go, and look
		// again at the next round.
		_ = cl.store.Abandon(ctx, cl.scope, cl.key, cl.token)
		return false, true
	case got.State == idempotency.Claimed:
		if cl.store.Finish(ctx, cl.scope, cl.key, w.a, cl.keep) != nil {
			return false, false
		}
	}
	// Kept, or another answer holds the key (or the caller's keys are
	// full): the store answers its retries from now on.
	cl.held.drop(cl.hk)
	return true, true
}

// close stops the retrier; answers still waiting are dropped.
func (r *idemRetrier) close() {
	r.once.Do(func() { close(r.stop) })
	<-r.done
}
