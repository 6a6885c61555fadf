package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/policy"
)

// DefaultIdempotencyWindow is how long an answer is kept for retries when
// Options.IdempotencyWindow is 0.
const DefaultIdempotencyWindow = policy.DefaultIdempotencyWindow

// idempotencyPending is how long a key is held for a request still being
// decided: a server that stopped meanwhile lets its key go then.
const idempotencyPending = policy.IdempotencyPending

// IdempotencyHeader names a request's idempotency key: a retry of a
// charge made with the same key, by the same tenant, within the window
// is answered as the first was and charges nothing.
const IdempotencyHeader = httpx.IdempotencyHeader

// idemClaim is a request's claim of its idempotency key.
type idemClaim struct {
	store             policy.IdempotencyStore
	scope, key, token string
	fingerprint       [32]byte
	keep              time.Duration
}

// claimIdempotency claims r's idempotency key for c's request to
// endpoint. It reports true when it has answered r itself: a replay of
// the key's answer, 409 while the key's first request is being decided,
// 422 when the key was used for another request, 429 when the caller
// holds the most keys it may. A claim is nil when r has no key, or the
// keys' store could not be reached (the request is decided as if it had
// none: its store is down too, and what fails over charges nothing).
//
// A key is its caller's: its tenant's, as trusted (a service or admin
// token) or not, or an anonymous caller's address; one key names one
// request, whichever endpoint it is sent to.
func (s *Server) claimIdempotency(w http.ResponseWriter, r *http.Request, endpoint, key string, c *call, body *checkRequest) (*idemClaim, bool) {
	scope := "anon:" + c.req.Client
	if c.res.Tenant != nil {
		scope = "tenant:" + c.res.Tenant.ID
	}
	if !c.req.Untrusted {
		scope = "trusted:" + scope
	}
	canon, _ := json.Marshal(body)
	cl := &idemClaim{store: s.idem, scope: scope, key: key, fingerprint: sha256.Sum256(append([]byte(endpoint+"\x00"), canon...)), keep: s.idemWindow}
	var t [16]byte
	_, _ = rand.Read(t[:])
	cl.token = hex.EncodeToString(t[:])
	got, err := s.idem.Begin(r.Context(), cl.scope, cl.key, cl.fingerprint, cl.token, idempotencyPending)
	switch {
	case err != nil && admit.ErrorCode(err) == admit.CodeUnavailable:
		return nil, false
	case err != nil:
		if admit.ErrorCode(err) == admit.CodeExhausted {
			w.Header().Set("Retry-After", "1")
		}
		s.fail(w, r, endpoint, err)
		return nil, true
	case got.State == policy.IdempotentNew:
		return cl, false
	case got.State == policy.IdempotentFull:
		w.Header().Set("Retry-After", strconv.FormatInt(httpx.CeilDiv(got.RetryAfter, time.Second), 10))
		writeProblem(w, http.StatusTooManyRequests, "the caller holds the most "+IdempotencyHeader+"s it may keep at once; send this request without one, or retry once an older key expires")
	case got.Fingerprint != cl.fingerprint:
		writeProblem(w, http.StatusUnprocessableEntity, IdempotencyHeader+" "+key+" was given with another request; a retry must send the same request, and another request another key")
	case got.State == policy.IdempotentPending:
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusConflict, "the request of "+IdempotencyHeader+" "+key+" is being decided; retry in a moment")
	default:
		w.Header().Set("Idempotent-Replayed", "true")
		writeBody(w, got.Status, got.Body)
	}
	return nil, true
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
	ctx = context.WithoutCancel(ctx)
	if !charged {
		_ = cl.store.Abandon(ctx, cl.scope, cl.key, cl.token)
		return
	}
	_ = cl.store.Finish(ctx, cl.scope, cl.key, policy.Idempotent{Fingerprint: cl.fingerprint, Status: status, Body: body}, cl.keep)
}
