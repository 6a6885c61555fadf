package httplimit

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/idempotency"
	"github.com/admitdev/admit/internal/httpx"
)

// A MiddlewareOption changes how Middleware decides and charges.
type MiddlewareOption func(*middlewareOptions)

type middlewareOptions struct {
	idem   idempotency.Store
	window time.Duration
}

// IdempotentDebits makes the debits of a request that carries an
// Idempotency-Key header safe to retry: the i-th Debit of a request is
// charged once for its key, its caller, its method and its path, however
// often the request is retried within window (zero means
// idempotency.DefaultWindow). A retry that debits more times than
// the first attempt did pays for the debits beyond; the amount of a debit
// made again is not compared (the first one stands). Middlewares that
// share store share the keys: on a idempotency/redisidem store, a retry that
// reaches another server is charged nothing either.
//
// A key is the caller's own, kept apart per the Who's tenant and user, or
// its IP when it names neither: a key another caller chose charges that
// caller's debits alone. A key used again with another method or path
// makes Debit fail with admit.CodeConflict, as does a retry whose debit
// the first attempt is still making. A malformed key (empty, longer than
// 255 bytes, given twice, not printable ASCII) refuses the request with
// 400 before the next handler sees it. Where store cannot be reached, a
// debit is charged as if its request had no key; where the caller holds
// the most keys store keeps of one caller, Debit fails with
// admit.CodeExhausted, charging nothing.
//
// Each request's admission is decided and charged as any request's: the
// work a retry is let in to do is done again.
func IdempotentDebits(store idempotency.Store, window time.Duration) MiddlewareOption {
	if store == nil {
		panic("httplimit.IdempotentDebits: nil idempotency.Store")
	}
	if window < 0 {
		panic("httplimit.IdempotentDebits: negative window")
	}
	return func(o *middlewareOptions) {
		o.idem = store
		o.window = window
		if o.window == 0 {
			o.window = idempotency.DefaultWindow
		}
	}
}

// debitKeys are the idempotency keys of one request's debits.
type debitKeys struct {
	store  idempotency.Store
	window time.Duration
	// scope is the caller, prefix the key; request names the method and
	// path the key is for.
	scope, prefix string
	request       [32]byte
	n             atomic.Uint64 // the debits made so far
}

// debitKeys returns the keys of r's debits, nil when r has no
// Idempotency-Key.
func (o *middlewareOptions) debitKeys(r *http.Request, w admit.Who) (*debitKeys, error) {
	k, err := httpx.IdempotencyKey(r)
	if err != nil || k == "" {
		return nil, err
	}
	caller := "t" + strconv.Itoa(len(w.Tenant)) + ":" + w.Tenant + "u" + strconv.Itoa(len(w.User)) + ":" + w.User
	if w.Tenant == "" && w.User == "" {
		caller = "ip:" + w.IP
	}
	h := sha256.New()
	h.Write([]byte(r.Method))
	h.Write([]byte{0})
	h.Write([]byte(r.URL.Path))
	d := &debitKeys{store: o.idem, window: o.window, scope: "httplimit:" + caller, prefix: k + "\x00"}
	h.Sum(d.request[:0])
	return d, nil
}

// debit charges n to l for w once for the request's next debit.
func (d *debitKeys) debit(ctx context.Context, l *admit.Limiter, w admit.Who, n int64) error {
	i := d.n.Add(1)
	key := d.prefix + strconv.FormatUint(i, 10)
	// The fingerprint is the request's and the debit's place in it: the
	// i-th debit of another path under the same key conflicts.
	var fp [32]byte
	var b [40]byte
	copy(b[:], d.request[:])
	binary.BigEndian.PutUint64(b[32:], i)
	fp = sha256.Sum256(b[:])
	var t [16]byte
	_, _ = rand.Read(t[:])
	token := hex.EncodeToString(t[:])
	got, err := d.store.Begin(ctx, d.scope, key, fp, token, idempotency.PendingTTL)
	switch {
	case err != nil && admit.ErrorCode(err) == admit.CodeUnavailable:
		_, err := l.Debit(ctx, w, n)
		return err
	case err != nil:
		return err
	case got.State == idempotency.Full:
		return exhausted(got.RetryAfter)
	case got.State != idempotency.Claimed && got.Fingerprint != fp:
		return conflict("the request's " + httpx.IdempotencyHeader + " was given with another method or path; a retry must send the same request, and another request another key")
	case got.State == idempotency.Pending:
		return conflict("debit " + strconv.FormatUint(i, 10) + " of the request's " + httpx.IdempotencyHeader + " is being charged by another attempt; retry in a moment")
	case got.State == idempotency.Done:
		return nil
	}
	if _, err := l.Debit(ctx, w, n); err != nil {
		_ = d.store.Abandon(context.WithoutCancel(ctx), d.scope, key, token)
		return err
	}
	// A key not kept charges a later retry again: the store that lost it
	// is failing, and the debit stands.
	_ = d.store.Finish(context.WithoutCancel(ctx), d.scope, key, idempotency.Entry{Fingerprint: fp, Status: http.StatusOK}, d.window)
	return nil
}

// exhausted is the error of a debit whose caller holds the most keys it
// may: the debit is not charged, and may be made again without a key, or
// with it once wait has passed.
func exhausted(wait time.Duration) error {
	e := admit.Errorf(admit.CodeExhausted, "httplimit.Debit: the caller holds the most %ss it may keep at once; the first expires in %v", httpx.IdempotencyHeader, wait.Round(time.Second))
	e.Field = httpx.IdempotencyHeader
	return e
}

func conflict(msg string) error {
	e := admit.Errorf(admit.CodeConflict, "httplimit.Debit: %s", msg)
	e.Field = httpx.IdempotencyHeader
	return e
}
