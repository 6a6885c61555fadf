package wsgateway

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/admitdev/admit"
)

// Session is a gateway session: what a client creates before it connects,
// and what ties the connections of one browser tab group together.
type Session struct {
	Tenant    string    `json:"tenant"`
	ID        string    `json:"session_id"`
	ExpiresAt time.Time `json:"expires_at"`
	// Lease is the slot the session holds in its tenant's
	// tenant_sessions limit, kept with the session so that any server
	// renews and releases it; "" when it holds none.
	Lease string `json:"-"`
}

// Event is what the subscribers of a session receive, in the order the
// session's store gave out sequence numbers.
type Event struct {
	// Seq and Frame describe a frame for the session's connections: the
	// frame given to Publish, its sequence number appended (AppendFrame).
	// Frame is nil for a closing event. Subscribers share it: read only.
	Seq   int64
	Frame []byte
	// ExpiresAt is the session's deadline after the event, when known.
	ExpiresAt time.Time
	// Closed says why the session ended ("deleted"); empty otherwise.
	Closed string
}

// Sessions keeps the gateway's sessions and carries each session's events
// to every server holding one of its connections. An implementation is
// safe for concurrent use. The memory implementation (NewMemorySessions)
// serves one process; redisstore.Sessions shares sessions among servers.
//
// A session that does not exist or has expired is admit.CodeNotFound.
type Sessions interface {
	// Create stores a new session s (its ID and Lease chosen by the
	// caller) that expires after ttl without activity; the answer carries
	// its deadline. Get, Touch and Create answer the session's Lease.
	Create(ctx context.Context, s Session, ttl time.Duration) (Session, error)
	// Get returns the session with the given id, whatever its tenant.
	Get(ctx context.Context, id string) (Session, error)
	// Touch moves the session's deadline to ttl from now.
	Touch(ctx context.Context, id string, ttl time.Duration) (Session, error)
	// Delete removes the session and sends its subscribers a closing
	// event.
	Delete(ctx context.Context, id string) error
	// Publish gives a frame the session's next sequence number, moves its
	// deadline to ttl from now and delivers it to the session's
	// subscribers. The frame is a JSON object without its closing brace;
	// subscribers receive it completed by AppendFrame. Frames of one
	// session reach every subscriber in the order of their sequence
	// numbers.
	Publish(ctx context.Context, id string, ttl time.Duration, frame []byte) (seq int64, err error)
	// Subscribe calls fn with every later event of the session until the
	// returned stop function is called. fn must not block: it runs on
	// the delivery path of every subscriber of the store.
	Subscribe(ctx context.Context, id string, fn func(Event)) (stop func(), err error)
}

// AppendFrame appends an open frame (a JSON object without its closing
// brace) completed by its sequence number to dst: {...,"seq":N}.
func AppendFrame(dst, open []byte, seq int64) []byte {
	dst = append(dst, open...)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendInt(dst, seq, 10)
	return append(dst, '}')
}

// MemorySessions keeps sessions in this process: the store of a single
// gateway server. It is safe for concurrent use; the zero value is not
// usable, create one with NewMemorySessions.
type MemorySessions struct {
	now func() time.Time

	mu        sync.Mutex
	sessions  map[string]*memSession
	lastSweep time.Time
	max       int
}

// DefaultMaxSessions bounds the live sessions of a MemorySessions unless
// SetMaxSessions says otherwise: a flood of session creations (new tenants
// of a default tier, say) cannot grow the process without bound.
const DefaultMaxSessions = 1_000_000

// SetMaxSessions bounds the live sessions m holds; creating one more is
// refused with admit.CodeUnavailable until sessions expire or are deleted.
// n ≤ 0 means DefaultMaxSessions. Call it before m is used.
func (m *MemorySessions) SetMaxSessions(n int) {
	if n <= 0 {
		n = DefaultMaxSessions
	}
	m.max = n
}

// Len returns how many sessions m holds, expired ones not yet swept
// included.
func (m *MemorySessions) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sessions)
}

type memSession struct {
	s    Session
	seq  int64
	subs map[*func(Event)]struct{}
}

var _ Sessions = (*MemorySessions)(nil)

// NewMemorySessions returns an empty MemorySessions reading time from now
// (time.Now when nil).
func NewMemorySessions(now func() time.Time) *MemorySessions {
	if now == nil {
		now = time.Now
	}
	return &MemorySessions{now: now, sessions: map[string]*memSession{}, max: DefaultMaxSessions}
}

// live returns the session id if it has not expired; an expired one is
// removed. m.mu is held.
func (m *MemorySessions) live(id string, now time.Time) *memSession {
	ms := m.sessions[id]
	if ms == nil {
		return nil
	}
	if !now.Before(ms.s.ExpiresAt) {
		delete(m.sessions, id)
		return nil
	}
	return ms
}

func notFound(id string) error {
	return admit.Errorf(admit.CodeNotFound, "session %q does not exist or has expired", id)
}

// Create implements Sessions.
func (m *MemorySessions) Create(_ context.Context, s Session, ttl time.Duration) (Session, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if now.Sub(m.lastSweep) >= time.Second || len(m.sessions) >= m.max && now.Sub(m.lastSweep) >= 100*time.Millisecond {
		// Sessions nobody touches again go here: at most once a second
		// (ten times a second when full), so creating sessions stays
		// O(1) amortized.
		m.lastSweep = now
		for id, ms := range m.sessions {
			if !now.Before(ms.s.ExpiresAt) {
				delete(m.sessions, id)
			}
		}
	}
	if len(m.sessions) >= m.max {
		return Session{}, admit.Errorf(admit.CodeUnavailable, "the gateway holds %d live sessions, its most (gateway.max_sessions); try again when some have expired", len(m.sessions))
	}
	if m.live(s.ID, now) != nil {
		return Session{}, admit.Errorf(admit.CodeConflict, "session %q exists", s.ID)
	}
	s.ExpiresAt = now.Add(ttl)
	m.sessions[s.ID] = &memSession{s: s}
	return s, nil
}

// Get implements Sessions.
func (m *MemorySessions) Get(_ context.Context, id string) (Session, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if ms := m.live(id, now); ms != nil {
		return ms.s, nil
	}
	return Session{}, notFound(id)
}

// Touch implements Sessions.
func (m *MemorySessions) Touch(_ context.Context, id string, ttl time.Duration) (Session, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	ms := m.live(id, now)
	if ms == nil {
		return Session{}, notFound(id)
	}
	ms.s.ExpiresAt = now.Add(ttl)
	return ms.s, nil
}

// Delete implements Sessions.
func (m *MemorySessions) Delete(_ context.Context, id string) error {
	now := m.now()
	m.mu.Lock()
	ms := m.live(id, now)
	if ms == nil {
		m.mu.Unlock()
		return notFound(id)
	}
	delete(m.sessions, id)
	subs := ms.subs
	m.mu.Unlock()
	for fn := range subs {
		(*fn)(Event{Closed: "deleted"})
	}
	return nil
}

// Publish implements Sessions. Subscribers are called with m's lock held,
// which is what orders the frames of a session.
func (m *MemorySessions) Publish(_ context.Context, id string, ttl time.Duration, frame []byte) (int64, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	ms := m.live(id, now)
	if ms == nil {
		return 0, notFound(id)
	}
	ms.seq++
	ms.s.ExpiresAt = now.Add(ttl)
	ev := Event{Seq: ms.seq, Frame: AppendFrame(nil, frame, ms.seq), ExpiresAt: ms.s.ExpiresAt}
	for fn := range ms.subs {
		(*fn)(ev)
	}
	return ms.seq, nil
}

// Subscribe implements Sessions.
func (m *MemorySessions) Subscribe(_ context.Context, id string, fn func(Event)) (func(), error) {
	p := &fn
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	ms := m.live(id, now)
	if ms == nil {
		return nil, notFound(id)
	}
	if ms.subs == nil {
		ms.subs = map[*func(Event)]struct{}{}
	}
	ms.subs[p] = struct{}{}
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(ms.subs, p)
	}, nil
}
