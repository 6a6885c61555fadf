// Package redisidem keeps idempotency keys (idempotency.Store) in
// Redis, in the deployment of a redisstore.Store, so that a retry reaching
// another server of the deployment is answered as the first request was.
package redisidem

import (
	_ "embed"

	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/idempotency"
	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/redisstore"
)

// Store keeps each key as a string, Prefix + "idem:{" + the scope's
// SHA-256 + "}" + the key's: "p" + the fingerprint + the claim's token
// while its request is decided, "d" + the fingerprint + the answer's
// status + its body once answered, expiring with the claim or the answer.
// A scope's keys share its Cluster hash slot with a sorted set, Prefix +
// "idem:{" + the scope's SHA-256 + "}", of its keys by when they expire,
// which bounds how many it holds.
type Store struct {
	store    *redisstore.Store
	perScope int
}

var _ idempotency.Store = (*Store)(nil)

// New returns the idempotency keys of s's deployment, at most perScope
// of a scope at once (idempotency.DefaultKeysPerScope when 0).
func New(s *redisstore.Store, perScope int) *Store {
	if perScope <= 0 {
		perScope = idempotency.DefaultKeysPerScope
	}
	return &Store{store: s, perScope: perScope}
}

// keys returns the key of scope's key k, and of scope's set of keys.
func (i *Store) keys(scope, k string) []string {
	ss := sha256.Sum256([]byte(scope))
	ks := sha256.Sum256([]byte(k))
	set := i.store.Prefix() + "idem:{" + hex.EncodeToString(ss[:16]) + "}"
	return []string{set + hex.EncodeToString(ks[:16]), set}
}

// beginScript returns what the key holds; or, when the scope's set holds
// ARGV[3] live keys, the milliseconds until the first expires, as a
// number; or claims the key and returns nil. ARGV[4] names the key in the
// set.
var beginScript = rueidis.NewLuaScript(beginSource)

// finishScript stores the answer ARGV[1] for ARGV[2] ms, and its expiry
// in the scope's set.
var finishScript = rueidis.NewLuaScript(finishSource)

// abandonScript deletes the key, and its place in the scope's set, if the
// claim named by ARGV[1] holds it pending.
var abandonScript = rueidis.NewLuaScript(abandonSource)

func pendingValue(fp [32]byte, token string) string { return "p" + string(fp[:]) + token }

// Begin implements idempotency.Store in one round trip.
func (i *Store) Begin(ctx context.Context, scope, key string, fp [32]byte, token string, pending time.Duration) (idempotency.Entry, error) {
	var got idempotency.Entry
	err := redishook.Call(i.store, ctx, func(ctx context.Context, c rueidis.Client) error {
		ks := i.keys(scope, key)
		r := beginScript.Exec(ctx, c, ks, []string{pendingValue(fp, token), strconv.FormatInt(max(pending.Milliseconds(), 1), 10),
			strconv.Itoa(i.perScope), ks[0][len(ks[1]):]})
		if ms, err := r.AsInt64(); err == nil {
			got = idempotency.Entry{State: idempotency.Full, RetryAfter: time.Duration(ms) * time.Millisecond}
			return nil
		}
		v, err := r.ToString()
		if rueidis.IsRedisNil(err) {
			got = idempotency.Entry{State: idempotency.Claimed, Fingerprint: fp}
			return nil
		}
		if err != nil {
			return err
		}
		got, err = decode(v)
		return err
	})
	return got, err
}

func decode(v string) (idempotency.Entry, error) {
	var a idempotency.Entry
	if len(v) < 1+32 {
		return a, admit.Errorf(admit.CodeInternal, "redisidem: a key of %d bytes", len(v))
	}
	copy(a.Fingerprint[:], v[1:33])
	switch v[0] {
	case 'p':
		a.State = idempotency.Pending
	case 'd':
		if len(v) < 36 {
			return a, admit.Errorf(admit.CodeInternal, "redisidem: an answer of %d bytes", len(v))
		}
		status, err := strconv.Atoi(v[33:36])
		if err != nil {
			return a, admit.Errorf(admit.CodeInternal, "redisidem: an answer's status %q", v[33:36])
		}
		a.State, a.Status, a.Body = idempotency.Done, status, []byte(v[36:])
	default:
		return a, admit.Errorf(admit.CodeInternal, "redisidem: a key holding %q", v[:1])
	}
	return a, nil
}

// Finish implements idempotency.Store.
func (i *Store) Finish(ctx context.Context, scope, key string, a idempotency.Entry, keep time.Duration) error {
	if a.Status < 100 || a.Status > 999 {
		return admit.Errorf(admit.CodeInvalid, "redisidem: status %d", a.Status)
	}
	v := "d" + string(a.Fingerprint[:]) + strconv.Itoa(a.Status) + string(a.Body)
	return redishook.Call(i.store, ctx, func(ctx context.Context, c rueidis.Client) error {
		ks := i.keys(scope, key)
		return finishScript.Exec(ctx, c, ks, []string{v, strconv.FormatInt(max(keep.Milliseconds(), 1), 10), ks[0][len(ks[1]):]}).Error()
	})
}

// Abandon implements idempotency.Store.
func (i *Store) Abandon(ctx context.Context, scope, key, token string) error {
	return redishook.Call(i.store, ctx, func(ctx context.Context, c rueidis.Client) error {
		ks := i.keys(scope, key)
		return abandonScript.Exec(ctx, c, ks, []string{token, ks[0][len(ks[1]):]}).Error()
	})
}

//go:embed lua/begin.lua
var beginSource string

//go:embed lua/finish.lua
var finishSource string

//go:embed lua/abandon.lua
var abandonSource string
