// Package redissessions keeps the WebSocket gateway's sessions in Redis,
// in the deployment of a redisstore.Store, so that every gateway server
// shares them.
package redissessions

import (
	_ "embed"

	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/redisstore"
	"github.com/admitdev/admit/wsgateway"
)

// Sessions keeps the WebSocket gateway's sessions in Redis, shared by every
// gateway server of a deployment, and carries each session's frames to the
// servers that hold its connections.
//
// A session is a hash (its tenant and frame sequence) that expires after
// its TTL without activity, and a set of the servers subscribed to it;
// both share the session's hash tag, so each call is one script on one
// node. Publish gives a frame its sequence number and PUBLISHes it to every
// server of the set from inside that script: the scripts of one session
// run one after the other on its node, so every server receives its frames
// in sequence order. Each server listens on one channel of its own, so its
// subscriptions cost nothing in Redis; a server that left a session stays
// in the set until the session expires and ignores its frames.
//
// Pub/sub delivers at most once: frames published while a server is
// disconnected from Redis are lost to its connections.
//
// Sessions is safe for concurrent use. Close stops listening.
type Sessions struct {
	store   *redisstore.Store // its client, breaker and failure counts
	prefix  string
	node    string // this server's id
	channel string // this server's channel
	timeout time.Duration

	mu   sync.RWMutex
	subs map[string]map[*func(wsgateway.Event)]struct{}

	ready  chan struct{} // closed once this server's channel is subscribed
	cancel context.CancelFunc
	done   chan struct{}
}

var _ wsgateway.Sessions = (*Sessions)(nil)

// New returns the gateway sessions of s's deployment and starts listening
// for this server's frames.
func New(s *redisstore.Store) *Sessions {
	var b [8]byte
	_, _ = rand.Read(b[:])
	node := hex.EncodeToString(b[:])
	ss := &Sessions{
		store: s, prefix: s.Prefix(), node: node, channel: s.Prefix() + "ws:node:" + node,
		// A session is read and touched on every connection and message:
		// it waits no longer than a decision, and shares the store's
		// breaker, so that a connection attempt fails as fast as a
		// decision while Redis is down.
		timeout: s.Timeout(),
		subs:    map[string]map[*func(wsgateway.Event)]struct{}{},
		done:    make(chan struct{}),
		ready:   make(chan struct{}),
	}
	ctx, cancel := context.WithCancel(context.Background())
	ss.cancel = cancel
	go ss.listen(ctx)
	return ss
}

// Close stops listening. It does not close the store's client.
func (ss *Sessions) Close() error {
	ss.cancel()
	<-ss.done
	return nil
}

func (ss *Sessions) keys(id string) []string {
	tag := ss.prefix + "{ws:" + id + "}"
	return []string{tag + "s", tag + "n"}
}

// The scripts. KEYS[1] is the session hash, KEYS[2] its servers' set.
// Times are Redis's (TIME), in milliseconds; every script that finds no
// session answers nil.
var (
	sessCreate    = rueidis.NewLuaScript(sessCreateSource)
	sessGet       = rueidis.NewLuaScript(sessGetSource)
	sessTouch     = rueidis.NewLuaScript(sessTouchSource)
	sessSubscribe = rueidis.NewLuaScript(sessSubscribeSource)

	// ARGV: id, ttl ms, channel prefix, frame.
	sessPublish = rueidis.NewLuaScript(sessPublishSource)

	// ARGV: id, channel prefix.
	sessDelete = rueidis.NewLuaScript(sessDeleteSource)
)

// exec runs a session script through the store (see redisstore.Store.Call):
// refused at once while its breaker is open, and counted for and against
// it. Replies, errors included, are the caller's to read.
func (ss *Sessions) exec(ctx context.Context, script *rueidis.Lua, id string, args ...string) (rueidis.RedisResult, error) {
	var res rueidis.RedisResult
	err := redishook.Call(ss.store, ctx, func(ctx context.Context, client rueidis.Client) error {
		res = script.Exec(ctx, client, ss.keys(id), args)
		err := res.Error()
		if _, reply := rueidis.IsRedisErr(err); reply || rueidis.IsRedisNil(err) {
			return nil // Redis answered
		}
		return err
	})
	return res, err
}

func sessionErr(op, id string, err error) error {
	if rueidis.IsRedisNil(err) {
		return admit.Errorf(admit.CodeNotFound, "session %q does not exist or has expired", id)
	}
	return admit.Errorf(admit.CodeUnavailable, "redissessions: %s session: %w", op, err)
}

func ms(d time.Duration) string { return strconv.FormatInt(max(1, d.Milliseconds()), 10) }

// Create implements wsgateway.Sessions.
func (ss *Sessions) Create(ctx context.Context, s wsgateway.Session, ttl time.Duration) (wsgateway.Session, error) {
	res, err := ss.exec(ctx, sessCreate, s.ID, s.Tenant, ms(ttl), s.Lease)
	if err != nil {
		return wsgateway.Session{}, err
	}
	exp, err := res.AsInt64()
	if rueidis.IsRedisNil(err) {
		return wsgateway.Session{}, admit.Errorf(admit.CodeConflict, "session %q exists", s.ID)
	}
	if err != nil {
		return wsgateway.Session{}, sessionErr("creating a", s.ID, err)
	}
	s.ExpiresAt = time.UnixMilli(exp)
	return s, nil
}

// session decodes a {tenant, expires ms, lease} reply.
func session(op, id string, res rueidis.RedisResult) (wsgateway.Session, error) {
	v, err := res.ToArray()
	if err != nil {
		return wsgateway.Session{}, sessionErr(op, id, err)
	}
	var tenant, lease string
	var exp int64
	if len(v) == 3 {
		tenant, err = v[0].ToString()
		if err == nil {
			exp, err = v[1].AsInt64()
		}
		if err == nil {
			lease, err = v[2].ToString()
		}
	}
	if len(v) != 3 || err != nil {
		return wsgateway.Session{}, fmt.Errorf("redissessions: %s session %q: an unexpected reply %v", op, id, v)
	}
	return wsgateway.Session{Tenant: tenant, ID: id, ExpiresAt: time.UnixMilli(exp), Lease: lease}, nil
}

// Get implements wsgateway.Sessions.
func (ss *Sessions) Get(ctx context.Context, id string) (wsgateway.Session, error) {
	res, err := ss.exec(ctx, sessGet, id)
	if err != nil {
		return wsgateway.Session{}, err
	}
	return session("reading a", id, res)
}

// Touch implements wsgateway.Sessions.
func (ss *Sessions) Touch(ctx context.Context, id string, ttl time.Duration) (wsgateway.Session, error) {
	res, err := ss.exec(ctx, sessTouch, id, ms(ttl))
	if err != nil {
		return wsgateway.Session{}, err
	}
	return session("refreshing a", id, res)
}

// Delete implements wsgateway.Sessions.
func (ss *Sessions) Delete(ctx context.Context, id string) error {
	res, err := ss.exec(ctx, sessDelete, id, id, ss.prefix+"ws:node:")
	if err != nil {
		return err
	}
	if _, err := res.AsInt64(); err != nil {
		return sessionErr("deleting a", id, err)
	}
	return nil
}

// Publish implements wsgateway.Sessions.
func (ss *Sessions) Publish(ctx context.Context, id string, ttl time.Duration, frame []byte) (int64, error) {
	res, err := ss.exec(ctx, sessPublish, id, id, ms(ttl), ss.prefix+"ws:node:", string(frame))
	if err != nil {
		return 0, err
	}
	seq, err := res.AsInt64()
	if err != nil {
		return 0, sessionErr("publishing to a", id, err)
	}
	return seq, nil
}

// Subscribe implements wsgateway.Sessions: it adds this server to the
// session's set (so that the session's frames come here) and fn to the
// local subscribers.
func (ss *Sessions) Subscribe(ctx context.Context, id string, fn func(wsgateway.Event)) (func(), error) {
	p := &fn
	ss.mu.Lock()
	m := ss.subs[id]
	if m == nil {
		m = map[*func(wsgateway.Event)]struct{}{}
		ss.subs[id] = m
	}
	m[p] = struct{}{}
	ss.mu.Unlock()
	stop := func() {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		if m := ss.subs[id]; m != nil {
			delete(m, p)
			if len(m) == 0 {
				delete(ss.subs, id)
			}
		}
	}
	// The local subscriber and this server's channel come first: a
	// frame published right after the server joins the set finds them.
	wait := time.NewTimer(ss.timeout)
	defer wait.Stop()
	select {
	case <-ss.ready:
	case <-wait.C:
		stop()
		return nil, admit.Errorf(admit.CodeUnavailable, "redissessions: subscribing to session %q: this server's channel is not subscribed yet", id)
	case <-ctx.Done():
		stop()
		return nil, sessionErr("subscribing to a", id, ctx.Err())
	}
	res, err := ss.exec(ctx, sessSubscribe, id, ss.node)
	if err != nil {
		stop()
		return nil, err
	}
	if _, err := res.AsInt64(); err != nil {
		stop()
		return nil, sessionErr("subscribing to a", id, err)
	}
	return stop, nil
}

// listen receives this server's frames until ctx ends, subscribing again
// after a lost connection.
func (ss *Sessions) listen(ctx context.Context) {
	defer close(ss.done)
	var once sync.Once
	hooked := rueidis.WithOnSubscriptionHook(ctx, func(s rueidis.PubSubSubscription) {
		if s.Kind == "subscribe" {
			once.Do(func() { close(ss.ready) })
		}
	})
	for ctx.Err() == nil {
		if client := redishook.Client(ss.store); client != nil {
			_ = client.Receive(hooked, client.B().Subscribe().Channel(ss.channel).Build(), func(m rueidis.PubSubMessage) {
				ss.dispatch([]byte(m.Message))
			})
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// dispatch decodes "id seq expires frame" or "id closed" and calls the
// session's local subscribers.
func (ss *Sessions) dispatch(msg []byte) {
	id, rest, ok := bytes.Cut(msg, []byte(" "))
	if !ok {
		return
	}
	var ev wsgateway.Event
	if string(rest) == "closed" {
		ev.Closed = "deleted"
	} else {
		seqB, rest, ok1 := bytes.Cut(rest, []byte(" "))
		expB, frame, ok2 := bytes.Cut(rest, []byte(" "))
		seq, err1 := strconv.ParseInt(string(seqB), 10, 64)
		exp, err2 := strconv.ParseInt(string(expB), 10, 64)
		if !ok1 || !ok2 || err1 != nil || err2 != nil {
			return
		}
		ev = wsgateway.Event{Seq: seq, ExpiresAt: time.UnixMilli(exp), Frame: wsgateway.AppendFrame(nil, frame, seq)}
	}
	ss.mu.RLock()
	defer ss.mu.RUnlock()
	for fn := range ss.subs[string(id)] {
		(*fn)(ev)
	}
}

//go:embed lua/create.lua
var sessCreateSource string

//go:embed lua/get.lua
var sessGetSource string

//go:embed lua/touch.lua
var sessTouchSource string

//go:embed lua/subscribe.lua
var sessSubscribeSource string

//go:embed lua/publish.lua
var sessPublishSource string

//go:embed lua/delete.lua
var sessDeleteSource string
