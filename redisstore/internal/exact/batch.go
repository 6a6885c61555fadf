package exact

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/engine"
	"github.com/admitdev/admit/redisstore/internal/link"
)

// Batching. Redis spends about as long starting a function call as
// deciding one charge (BenchmarkDecide: a 1-scope decision alone in its
// call costs Redis ~12 µs, one of 11 in a call ~6 µs), and a request's
// tenant and global buckets are the same few keys for every request. So
// decisions made at the same time for the same hash slot (every decision,
// outside Cluster) are sent together: one FCALL decides them one after the
// other, each all or nothing on its own, reads each key once and writes it
// once. It is the only way decisions reach Redis, Cluster look-ups at
// groups that were not charged included.
//
// Nothing waits for a batch to fill. A decision is sent at once while fewer
// than maxFlight calls for its slot are in flight; otherwise it queues, and
// the next call for the slot takes the whole queue. Batches therefore form
// only under load, as large as the load makes them, and a lone decision
// costs one call as before.
const (
	// maxFlight bounds the calls in flight per slot; more keep Redis busy
	// while replies are read, fewer make larger batches.
	maxFlight = 4
	// maxBatch bounds the decisions of one call, so that one call never
	// holds Redis for long.
	maxBatch = 64
)

// job is one decision waiting for a batch: its keys, its rules, and its
// part of the batch's arguments (see the library, batch), with the rules'
// numbers left to fill in when the batch is made. It owns all of them, so
// a caller that gives up cannot change a batch being built.
type job struct {
	ctx   context.Context
	keys  []string
	rules []*ruleArgs
	args  []string
	// windows: every charge is a fixed window's, and the job has no flags,
	// so that it may go in a batch of windows (op "w").
	windows bool
	// shared: some charge is fair, and every charge has a share argument.
	shared bool
	done   chan struct{} // closed when reply or err is set; nil when its caller sends it
	reply  Reply
	err    error
}

// How a job decides: as asked, as a dry run, or as a decision another
// group of it refused already (reporting, charging nothing).
const (
	decideCharge  = ""
	decideDry     = "d"
	decideRefused = "x"
)

// jobSpec is what a job decides: the charges of group g of a decision, in
// the way how says, for the lease (and its record key rec) that
// concurrency charges take; ras holds the arguments of every charge's rule.
type jobSpec struct {
	charges    []admit.Charge
	ras        []*ruleArgs
	g          group
	how        string
	lease, rec string
}

// newJob prepares the decision js describes.
func (s *Room) newJob(ctx context.Context, js jobSpec) *job {
	charges, ras, g, how, lease, rec := js.charges, js.ras, js.g, js.how, js.lease, js.rec
	j := &job{ctx: ctx, keys: g.keys, rules: ras, args: make([]string, 1, 1+3*len(g.idx))}
	if len(g.idx) < len(charges) { // one of several groups
		j.rules = make([]*ruleArgs, len(g.idx))
		for k, i := range g.idx {
			j.rules[k] = ras[i]
		}
	}
	shared := false
	var debits uint64 // bit k: the group's k-th charge is a debit
	for k, i := range g.idx {
		shared = shared || charges[i].Share != nil
		if charges[i].Debit {
			debits |= 1 << k
		}
	}
	j.shared = shared
	j.windows = how == decideCharge && lease == "" && rec == "" && !shared
	flags := how
	if rec != "" {
		j.keys = append(j.keys, rec)
		flags += "r"
	}
	if shared {
		flags += "s"
		j.keys = s.shareKeys(j.keys, charges, g)
	}
	for k, i := range g.idx {
		ch, r := &charges[i], j.rules[k]
		j.windows = j.windows && r.window
		j.args = append(j.args, "", itoa(ch.Cost))
		if r.quota {
			e1, e2 := s.quotaEnds(ch.Rule)
			j.args = append(j.args, e1, e2)
		}
		if r.lease {
			ttl := ""
			if ch.LeaseTTL > 0 {
				ttl = micros(min(ch.LeaseTTL, maxSpan))
			}
			j.args = append(j.args, ttl)
		}
		if shared {
			j.args = append(j.args, shareArg(ch))
		}
	}
	j.args[0] = head(len(g.idx), flags, debits, lease)
	return j
}

// head returns a decision's head in a batch: its number of charges n,
// alone when it has no flags, debits or lease (the usual decision), or
// else "n:flags:debits:lease", debits the mask of which charges are
// debits (bit k the k-th; empty when none).
func head(n int, flags string, debits uint64, lease string) string {
	h := itoa(int64(n))
	if flags == "" && debits == 0 && lease == "" {
		return h
	}
	d := ""
	if debits != 0 {
		d = strconv.FormatUint(debits, 10)
	}
	return h + ":" + flags + ":" + d + ":" + lease
}

// quotaEnds returns the ends, in µs, of the calendar period of quota rule
// r in progress and of the next: the script, which knows no time zones,
// takes the first of them after its clock's now.
func (s *Room) quotaEnds(r *admit.Rule) (string, string) {
	if r.Algorithm == admit.FirstHitWindow {
		w := "-" + micros(r.Window) // from the script's now (endAt)
		return w, w
	}
	p, err := engine.Prepare(r)
	if err != nil {
		return "0", "0" // validate refused it before any call is made
	}
	now := time.Now()
	if s.link.Clock != nil {
		now = s.link.Clock()
	}
	e1, e2 := p.QuotaEnds(now)
	return itoa(e1.UnixMicro()), itoa(e2.UnixMicro())
}

// batcher queues the decisions of one hash slot.
type batcher struct {
	mu     sync.Mutex
	queue  []*job
	flying int
}

// batcher returns the batcher of the slot of tag.
func (s *Room) batcher(tag string) *batcher {
	i := 0
	if s.link.Cluster {
		i = int(link.SlotOf(tag))
	}
	if b := s.batchers[i].Load(); b != nil {
		return b
	}
	s.batchers[i].CompareAndSwap(nil, new(batcher))
	return s.batchers[i].Load()
}

// decideCall decides j in a call of its own, or, when calls for the slot
// of tag are already in flight, in the next one with the other decisions
// waiting for it, and returns j's part of the reply.
func (s *Room) decideCall(tag string, j *job) (Reply, error) {
	b := s.batcher(tag)
	b.mu.Lock()
	if b.flying < maxFlight && len(b.queue) == 0 {
		b.flying++
		b.mu.Unlock()
		s.send([]*job{j})
		s.landed(b)
		return j.reply, j.err
	}
	j.done = make(chan struct{})
	b.queue = append(b.queue, j)
	b.mu.Unlock()
	select {
	case <-j.done:
		return j.reply, j.err
	case <-j.ctx.Done():
		return Reply{}, admit.Errorf(admit.CodeUnavailable, "redisstore: %w", j.ctx.Err())
	}
}

// landed ends a call of b: the decisions queued meanwhile go in a call of
// their own, made by a new goroutine so that this caller, which has its
// answer, goes back to its request.
func (s *Room) landed(b *batcher) {
	if next, ok := b.next(); ok {
		go s.sendAll(b, next)
	}
}

// next takes the next batch from the queue when there is one; otherwise
// the call that just ended no longer counts as in flight.
func (b *batcher) next() ([]*job, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		b.flying--
		return nil, false
	}
	return b.take(), true
}

// take removes up to maxBatch decisions from the queue, answering those
// whose callers gave up. b.mu is held.
func (b *batcher) take() []*job {
	k := min(len(b.queue), maxBatch)
	batch := make([]*job, 0, k)
	for _, j := range b.queue[:k] {
		if err := j.ctx.Err(); err != nil {
			j.err = admit.Errorf(admit.CodeUnavailable, "redisstore: %w", err)
			j.finish()
			continue
		}
		batch = append(batch, j)
	}
	n := copy(b.queue, b.queue[k:])
	clear(b.queue[n:])
	b.queue = b.queue[:n]
	return batch
}

// sendAll sends batch and then what queued meanwhile, until the queue is
// empty.
func (s *Room) sendAll(b *batcher, batch []*job) {
	for ok := true; ok; batch, ok = b.next() {
		s.send(batch)
	}
}

func (j *job) finish() {
	if j.done != nil {
		close(j.done)
	}
}

// send makes one call for batch and gives every job its part of the reply.
func (s *Room) send(batch []*job) {
	if len(batch) == 0 {
		return
	}
	keys, args := s.batchArgs(batch)
	v, err := s.link.Run(context.Background(), link.Call{Keys: keys, Args: args})
	if err == nil && args[0] == "b" && len(v) != replyLen(batch) {
		err = admit.Errorf(admit.CodeInternal, "redisstore: batch of %d replied %d values, want %d", len(batch), len(v), replyLen(batch))
	}
	if err == nil && len(v) < 2 {
		err = admit.Errorf(admit.CodeInternal, "redisstore: batch of %d replied %d values", len(batch), len(v))
	}
	if err != nil {
		for _, j := range batch {
			j.err = err
			j.finish()
		}
		return
	}
	nu, nsub, v := v[0], v[1], v[2:]
	for _, j := range batch {
		n := len(j.rules)
		k := 2 + 4*n
		switch {
		case args[0] == "w" && len(v) >= n && n > 0 && v[0] >= 0:
			j.reply = Reply{NU: nu, NSub: nsub, V: counted(j.rules, v[:n], nu, nsub)}
			k = n
		case args[0] == "w" && len(v) > 0 && v[0] == -2:
			v = v[1:]
			if len(v) < k {
				k = len(v)
				j.err = admit.Errorf(admit.CodeInternal, "redisstore: a batch of windows replied too few values")
			} else {
				j.reply = Reply{NU: nu, NSub: nsub, V: v[:k:k]}
			}
		case len(v) > 0 && v[0] == -1:
			j.err = admit.Errorf(admit.CodeInternal, "redisstore: script: a command failed deciding in Redis (the Redis log says which)")
			if args[0] == "w" {
				k = 1
			}
		case len(v) < k:
			k = len(v)
			j.err = admit.Errorf(admit.CodeInternal, "redisstore: a batch replied too few values")
		default:
			j.reply = Reply{NU: nu, NSub: nsub, V: v[:k:k]}
		}
		v = v[k:]
		j.finish()
	}
}

// counted returns the reply of a decision of a batch of windows that
// counted, in a batch's form: from each charge's count after the
// decision, what the script's countEval would have said of it.
func counted(rules []*ruleArgs, counts []int64, nu, nsub int64) []int64 {
	v := make([]int64, 2+4*len(rules))
	v[0] = 1
	for k, r := range rules {
		endu := nu - nu%r.widthU + r.widthU
		reset := (endu-nu)*1000 - nsub
		x := v[1+4*k:]
		if c := counts[k]; c <= r.limit {
			x[0], x[1], x[2], x[3] = 1, r.limit-c, reset, 0
		} else { // a debit past the limit: what a cost of 1 meets after it,
			// and how far past (see fill) the count went, which stops at
			// bounds.MaxCount
			x[0], x[1], x[2], x[3] = 0, r.limit-min(c, bounds.MaxCount), reset, reset
		}
	}
	return v
}

// replyLen is the length of the reply to batch: now (two values), then
// for each decision allowed, four values per charge and the lease's
// expiry.
func replyLen(batch []*job) int {
	k := 2
	for _, j := range batch {
		k += 2 + 4*len(j.rules)
	}
	return k
}

// batchArgs returns the keys and arguments of the call (op "b") deciding
// every job of batch: the distinct rules first, then the decisions.
func (s *Room) batchArgs(batch []*job) (keys, args []string) {
	var rules []*ruleArgs
	nkeys, nargs := 0, 6
	for _, j := range batch {
		nkeys += len(j.keys)
		nargs += len(j.args)
		p := 1 // the first rule number's place in j.args
		for _, r := range j.rules {
			x := slices.Index(rules, r)
			if x < 0 {
				rules = append(rules, r)
				x = len(rules) - 1
			}
			j.args[p] = itoa(int64(x + 1))
			p += 2
			if r.quota {
				p += 2
			}
			if r.lease {
				p++
			}
			if j.shared {
				p++ // the share
			}
		}
	}
	keys = make([]string, 0, nkeys)
	args = make([]string, 6, nargs+len(rules))
	args[0] = "b"
	if !slices.ContainsFunc(batch, func(j *job) bool { return !j.windows }) {
		args[0] = "w"
	}
	args[1], args[2] = s.link.NowArgs()
	args[3], args[4], args[5] = itoa(int64(len(rules))), itoa(int64(len(batch))), itoa(int64(replyLen(batch)))
	for _, r := range rules {
		args = append(args, r.text)
	}
	for _, j := range batch {
		keys = append(keys, j.keys...)
		args = append(args, j.args...)
	}
	return keys, args
}

// batchersFor returns the batcher table of a store: one per hash slot in
// Cluster, one in all outside it.
func batchersFor(cluster bool) []atomic.Pointer[batcher] {
	if cluster {
		return make([]atomic.Pointer[batcher], 16384)
	}
	return make([]atomic.Pointer[batcher], 1)
}
