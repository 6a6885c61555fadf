// Package redisidem keeps idempotency keys (policy.IdempotencyStore) in
// Redis, in the deployment of a redisstore.Store, so that a retry reaching
// another server of the deployment is answered as the first request was.
package redisidem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/redisstore"
)

// Store keeps each key as a string, Prefix + "idem:{" + the key's
// SHA-256 + "}" (its own Cluster hash slot): "p" + the fingerprint + the claim's token while its request is
// decided, "d" + the fingerprint + the answer's status + its body once
// answered, expiring with the claim or the answer.
type Store struct {
	store *redisstore.Store
}

var _ policy.IdempotencyStore = (*Store)(nil)

// New returns the idempotency keys of s's deployment.
func New(s *redisstore.Store) *Store { return &Store{store: s} }

func (i *Store) key(k string) string {
	sum := sha256.Sum256([]byte(k))
	return i.store.Prefix() + "idem:{" + hex.EncodeToString(sum[:16]) + "}"
}

// beginScript returns what the key holds, or claims it and returns nil.
var beginScript = rueidis.NewLuaScript(`
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false`)

// abandonScript deletes the key if the claim named by ARGV[1] holds it
// pending.
var abandonScript = rueidis.NewLuaScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 1) == 'p' and string.sub(v, 34) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

func pendingValue(fp [32]byte, token string) string { return "p" + string(fp[:]) + token }

// Begin implements policy.IdempotencyStore in one round trip.
func (i *Store) Begin(ctx context.Context, key string, fp [32]byte, token string, pending time.Duration) (policy.Idempotent, error) {
	var got policy.Idempotent
	err := redishook.Call(i.store, ctx, func(ctx context.Context, c rueidis.Client) error {
		r := beginScript.Exec(ctx, c, []string{i.key(key)}, []string{pendingValue(fp, token), strconv.FormatInt(max(pending.Milliseconds(), 1), 10)})
		v, err := r.ToString()
		if rueidis.IsRedisNil(err) {
			got = policy.Idempotent{State: policy.IdempotentNew, Fingerprint: fp}
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

func decode(v string) (policy.Idempotent, error) {
	var a policy.Idempotent
	if len(v) < 1+32 {
		return a, admit.Errorf(admit.CodeInternal, "redisidem: a key of %d bytes", len(v))
	}
	copy(a.Fingerprint[:], v[1:33])
	switch v[0] {
	case 'p':
		a.State = policy.IdempotentPending
	case 'd':
		if len(v) < 36 {
			return a, admit.Errorf(admit.CodeInternal, "redisidem: an answer of %d bytes", len(v))
		}
		status, err := strconv.Atoi(v[33:36])
		if err != nil {
			return a, admit.Errorf(admit.CodeInternal, "redisidem: an answer's status %q", v[33:36])
		}
		a.State, a.Status, a.Body = policy.IdempotentDone, status, []byte(v[36:])
	default:
		return a, admit.Errorf(admit.CodeInternal, "redisidem: a key holding %q", v[:1])
	}
	return a, nil
}

// Finish implements policy.IdempotencyStore.
func (i *Store) Finish(ctx context.Context, key string, a policy.Idempotent, keep time.Duration) error {
	if a.Status < 100 || a.Status > 999 {
		return admit.Errorf(admit.CodeInvalid, "redisidem: status %d", a.Status)
	}
	v := "d" + string(a.Fingerprint[:]) + strconv.Itoa(a.Status) + string(a.Body)
	return redishook.Call(i.store, ctx, func(ctx context.Context, c rueidis.Client) error {
		return c.Do(ctx, c.B().Set().Key(i.key(key)).Value(v).PxMilliseconds(max(keep.Milliseconds(), 1)).Build()).Error()
	})
}

// Abandon implements policy.IdempotencyStore.
func (i *Store) Abandon(ctx context.Context, key, token string) error {
	return redishook.Call(i.store, ctx, func(ctx context.Context, c rueidis.Client) error {
		return abandonScript.Exec(ctx, c, []string{i.key(key)}, []string{token}).Error()
	})
}
