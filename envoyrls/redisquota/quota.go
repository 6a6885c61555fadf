// Package redisquota keeps the Envoy quota service's ledgers in Redis, in
// the deployment of a redisstore.Store, so that every server of the
// deployment divides a limit among the Envoys of all of them.
package redisquota

import (
	_ "embed"

	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/envoyrls"
	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/redisstore"
)

// Ledger is an envoyrls.QuotaLedger in Redis. A limit's state is a hash of
// its version and its bytes; an update reads both with Redis's clock, and
// writes the next version only if no other server wrote in between
// (else it tries again with what that one wrote). Every update is at most
// a few scripts on the node of the limit's key, each through the store's
// breaker and within its timeout.
type Ledger struct {
	store  *redisstore.Store
	prefix string
}

var _ envoyrls.QuotaLedger = (*Ledger)(nil)

// New returns the ledger of s's deployment.
func New(s *redisstore.Store) *Ledger { return &Ledger{store: s, prefix: s.Prefix() + "rlqs:"} }

var (
	//go:embed lua/read.lua
	readSource string
	//go:embed lua/write.lua
	writeSource string

	readScript  = rueidis.NewLuaScript(readSource)
	writeScript = rueidis.NewLuaScript(writeSource)
)

// maxTries bounds the writes an update tries while other servers write the
// same limit: each loses only to a write that succeeded.
const maxTries = 8

// ErrContended is returned when an update lost maxTries times in a row to
// other servers' updates of the same limit; its code is
// admit.CodeConflict.
var ErrContended = admit.Errorf(admit.CodeConflict, "redisquota: the ledger changed under every try")

// Update implements envoyrls.QuotaLedger.
func (l *Ledger) Update(ctx context.Context, key string, ttl time.Duration, fn func(time.Time, []byte) ([]byte, bool, error)) error {
	keys := []string{l.prefix + key}
	res, err := l.exec(ctx, readScript, keys)
	if err != nil {
		return err
	}
	for range maxTries {
		now, version, state, err := readReply(res)
		if err != nil {
			return err
		}
		next, store, err := fn(now, state)
		if err != nil || !store {
			return err
		}
		res, err = l.exec(ctx, writeScript, keys, version, string(next), strconv.FormatInt(max(1, ttl.Milliseconds()), 10))
		if err != nil {
			return err
		}
		if n, err := res.AsInt64(); err == nil && n == 1 {
			return nil
		}
	}
	return ErrContended
}

// exec runs a script through the store's breaker.
func (l *Ledger) exec(ctx context.Context, script *rueidis.Lua, keys []string, args ...string) (rueidis.RedisResult, error) {
	var res rueidis.RedisResult
	err := redishook.Call(l.store, ctx, func(ctx context.Context, client rueidis.Client) error {
		res = script.Exec(ctx, client, keys, args)
		return res.Error()
	})
	return res, err
}

// readReply decodes {seconds, microseconds, version, state}.
func readReply(res rueidis.RedisResult) (now time.Time, version string, state []byte, err error) {
	v, err := res.ToArray()
	if err == nil && len(v) != 4 {
		err = fmt.Errorf("%d items", len(v))
	}
	var sec, usec int64
	var s string
	if err == nil {
		sec, err = v[0].AsInt64()
	}
	if err == nil {
		usec, err = v[1].AsInt64()
	}
	if err == nil {
		version, err = v[2].ToString()
	}
	if err == nil {
		s, err = v[3].ToString()
	}
	if err != nil {
		return time.Time{}, "", nil, fmt.Errorf("redisquota: an unexpected reply: %w", err)
	}
	if s != "" {
		state = []byte(s)
	}
	return time.Unix(sec, usec*1000), version, state, nil
}
