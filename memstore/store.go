// Package memstore is Admit's in-process store, the embedded default: the
// state of every limit of one process, in memory.
//
//	store := memstore.New(nil) // defaults: Options says what they are
//	defer store.Close()
//	limiter, err := admit.NewLimiter(store, admit.Bucket("user", admit.PerSecond(10), 20).Per(admit.PerUser))
//
// A Store is safe for concurrent use; its state is lost when the process
// ends (redisstore shares it between processes). Stats reports its keys
// and memory; idle keys are swept in the background.
//
// # Layout
//
// Keys are hashed with hash/maphash (a random seed per
// process), or carry their hash already (a Limiter's charges do). The top bits
// of the hash choose one of Shards shards; each shard is a mutex over an
// open-addressing table of 24-byte slots (hash and a 16-byte state), so a live
// key costs about 24 to 55 bytes whatever the length of its name, and a
// decision allocates nothing. Sliding logs and concurrency keys keep their
// variable-size state (a ring of times, a set of leases) in a side map of
// their shard.
//
// Keys are identified by their 64-bit hash alone. Two distinct keys share
// state only if their hashes collide: about one chance in 2^64 per pair, or
// three in a million that any pair collides among ten million live keys.
// Key names never reach the table, so memory does not grow with them.
//
// # Atomic decisions over many keys
//
// A decision locks the shards of all its charges in increasing shard order,
// evaluates every charge, commits all of them or none, and unlocks. Every
// goroutine acquires shard locks in the same global order and holds no
// other lock meanwhile, so no cycle of waits — no deadlock — can form.
// Lease and reservation records live in their own maps under their own
// mutexes, which are never held while waiting for a shard lock.
//
// # Expiry and eviction
//
// Every state records the instant it becomes equivalent to a new key's
// (its expiry). Decisions treat older states as new, so expiry is exact
// whenever the sweeper runs; the sweeper only gives the memory back, every
// SweepInterval, shard by shard. When MaxKeys live keys are held, inserting
// a new key evicts one: among eight occupied slots sampled from a random
// position in the shard, the one that will become new soonest (for idle
// keys, the least recently used), never a key of the decision that is
// inserting. Evicting a key forgets part of its history, so it may admit
// more than its limit; the evictions counter says how often that happened.
package memstore

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/engine"
)

// Options configure a Store. The zero Options is valid and gives the
// defaults documented on each field.
type Options struct {
	// Shards is the number of independently locked shards, rounded up to
	// a power of two; default 256.
	Shards int
	// MaxKeys caps the live keys (slots: a combination key takes two);
	// default 10,000,000. The cap is enforced per shard, at
	// ceil(MaxKeys/Shards) each.
	MaxKeys int
	// SweepInterval is how often expired keys are dropped; default 1s.
	// Negative disables the sweeper (see Sweep).
	SweepInterval time.Duration
	// Clock returns the current time. By default the store reads the
	// monotonic clock, anchored to the wall clock when the process
	// started; tests pass a manual clock. A clock set back is not
	// followed back by the keys decided at a later time, nor by others
	// that share their shards: they are decided at that later time until
	// the clock passes it.
	Clock func() time.Time
}

// Store is the in-memory admit.Store. Its zero value is not usable; call
// New. It is safe for concurrent use.
type Store struct {
	shards      []shard
	shift       uint // shard index = hash >> shift
	maxPerShard int
	now         func() int64 // Unix nanoseconds

	keys, evictions, expirations atomic.Int64

	leaseMu   sync.Mutex
	leases    map[string]*leaseRecord
	leaseNext atomic.Uint64

	resMu        sync.Mutex
	reservations map[string]*reservation

	stop      chan struct{}
	closeOnce sync.Once
	sweeper   sync.WaitGroup
}

// shard is 128 bytes, two cache lines, and the shards' array starts on
// one (a large allocation starts on a page): so a shard's mutex and its
// table's header, which every decision reads, share one line, and no
// other shard's. (At 136 bytes, three shards in eight had the two on two
// lines.)
type shard struct {
	mu sync.Mutex
	// last is the latest time a decision in the shard was made at (see
	// at).
	last   int64
	t      table
	logs   map[uint64]*engine.Log
	leases map[uint64]*engine.LeaseSet
	shares map[uint64]*engine.ShareState
	rnd    uint64
	_      [128 - 80]byte
}

// at returns the time to decide at in sh, under its lock, for a clock
// reading now: now, or the time of a decision before it in sh when that
// was later. Decisions read the clock before they take the lock, so that
// the read overlaps the lock's (3.5 ns of 58 on a hot key); a decision
// that waited for the lock longer than another took to read the clock
// and decide would otherwise be made at an earlier time than one it
// follows. So time never runs backwards for a key: a decision is made as
// if it had arrived when it got the lock, or a little before. A reading
// more than maxLockWait before the last is the clock set back, not a
// decision that waited: it stands, and each key's state takes it as the
// engine takes a clock that went back (another key of the shard, decided
// at the later time, must not move this one's time).
func (sh *shard) at(now int64) int64 {
	if now < sh.last && sh.last-now <= maxLockWait {
		return sh.last
	}
	sh.last = now
	return now
}

// maxLockWait is the longest a decision is taken to have waited for its
// shard's lock between reading the clock and deciding.
const maxLockWait = int64(100 * time.Millisecond)

var _ admit.Store = (*Store)(nil)

// New returns a Store with the given options; nil means the defaults. It
// starts the sweeper goroutine, which Close stops.
func New(opts *Options) *Store {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Shards <= 0 {
		o.Shards = 256
	}
	bitsN := bits.Len(uint(o.Shards - 1))
	if bitsN > 16 {
		bitsN = 16
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = 10_000_000
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = time.Second
	}
	n := 1 << bitsN
	s := &Store{
		shards:       make([]shard, n),
		shift:        uint(64 - bitsN),
		maxPerShard:  (o.MaxKeys + n - 1) / n,
		now:          monoNow,
		leases:       map[string]*leaseRecord{},
		reservations: map[string]*reservation{},
		stop:         make(chan struct{}),
	}
	if clock := o.Clock; clock != nil {
		s.now = func() int64 { return clock().UnixNano() }
	}
	if bitsN == 0 {
		s.shift = 63 // a single shard: hash >> 63 is 0 or 1, masked below
	}
	for i := range s.shards {
		s.shards[i].rnd = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	if o.SweepInterval > 0 {
		s.sweeper.Add(1)
		go s.sweepLoop(o.SweepInterval)
	}
	return s
}

// Close stops the sweeper. The store stays usable; Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	s.sweeper.Wait()
	return nil
}

// Stats are the store's counters.
type Stats struct {
	Keys        int64 // live slots
	Evictions   int64 // keys dropped by the MaxKeys cap
	Expirations int64 // keys dropped by the sweeper after they expired
	Leases      int64 // lease records held
}

// Stats returns the current counters.
func (s *Store) Stats() Stats {
	s.leaseMu.Lock()
	leases := int64(len(s.leases))
	s.leaseMu.Unlock()
	return Stats{Keys: s.keys.Load(), Evictions: s.evictions.Load(), Expirations: s.expirations.Load(), Leases: leases}
}
