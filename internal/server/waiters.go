package server

import (
	"strings"
	"sync"

	"github.com/admitdev/admit"
)

// Waiters of /v1/acquire on a limit tenants share are served by class, in
// order of arrival: each class of callers (a tenant, the anonymous ones per
// client address) has a queue per shared limit on this server, and only
// its first waiter asks the store, when the store's last refusal said the
// class could pass. The store divides the limit among the classes by
// weight, so the queues are served at their classes' shares — weighted
// fair queueing — and a class's many waiters cost the store one decision
// at a time, not one each.

// maxWaiters bounds the waiters a server keeps queued at once; past it an
// acquire that would wait is answered with its refusal at once.
const maxWaiters = 10_000

type waitQueues struct {
	mu sync.Mutex
	m  map[string]*waitQueue
	n  int
}

type waitQueue struct {
	waiters []chan struct{} // in order of arrival; the first's turn has come
}

// join queues a waiter under key and returns the channel closed when its
// turn comes (at once when the queue was empty), and leave, which the
// waiter calls when it is done, turn or not. It returns a nil channel when
// maxWaiters are queued.
func (q *waitQueues) join(key string) (turn chan struct{}, leave func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n >= maxWaiters {
		return nil, func() {}
	}
	if q.m == nil {
		q.m = map[string]*waitQueue{}
	}
	wq := q.m[key]
	if wq == nil {
		wq = &waitQueue{}
		q.m[key] = wq
	}
	turn = make(chan struct{})
	wq.waiters = append(wq.waiters, turn)
	q.n++
	if len(wq.waiters) == 1 {
		close(turn)
	}
	return turn, func() { q.leave(key, wq, turn) }
}

// leave removes turn from its queue and, when it was first, gives the
// turn to the next.
func (q *waitQueues) leave(key string, wq *waitQueue, turn chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, w := range wq.waiters {
		if w != turn {
			continue
		}
		wq.waiters = append(wq.waiters[:i], wq.waiters[i+1:]...)
		q.n--
		if i == 0 && len(wq.waiters) > 0 {
			close(wq.waiters[0])
		}
		break
	}
	if len(wq.waiters) == 0 && q.m[key] == wq {
		delete(q.m, key)
	}
}

// queueKey names the queue of a request's shared charges: its class (and
// sub) and the keys of its fair charges; "" when it has none.
func queueKey(charges []admit.Charge) string {
	var b strings.Builder
	for i := range charges {
		c := &charges[i]
		if c.Share == nil {
			continue
		}
		if b.Len() == 0 {
			b.WriteString(c.Share.Class)
			b.WriteByte(0)
			b.WriteString(c.Share.Sub)
		}
		b.WriteByte(0)
		b.WriteString(c.Key)
	}
	return b.String()
}
