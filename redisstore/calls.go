package redisstore

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/redishook"
)

// call is one script call: its keys and arguments.
type call struct {
	keys, args []string
}

// newCall starts a call of op on the charges of g; rec, if set, is the
// record key the script writes (a lease or a reservation).
func (s *Store) newCall(op, aux1, aux2, id string, charges []admit.Charge, g group, rec string) call {
	c := call{
		keys: make([]string, 0, len(g.keys)+1),
		args: make([]string, 7, 7+stride*len(g.idx)),
	}
	c.args[0], c.args[3], c.args[4], c.args[5], c.args[6] = op, aux1, aux2, id, itoa(int64(len(g.idx)))
	c.args[1], c.args[2] = s.nowArgs()
	c.keys = append(c.keys, g.keys...)
	for _, i := range g.idx {
		ch := &charges[i]
		a := argsOf(ch.Rule)
		n := len(c.args)
		c.args = append(c.args, a.fixed[:]...)
		c.args[n+1] = itoa(ch.Cost)
		if ch.LeaseTTL > 0 {
			c.args[n+3] = micros(min(ch.LeaseTTL, maxSpan))
		}
	}
	if rec != "" {
		c.keys = append(c.keys, rec)
	}
	return c
}

// nowArgs returns the clock arguments of a call: empty for Redis TIME, or
// the injected clock's microseconds and the nanoseconds beyond.
func (s *Store) nowArgs() (us, ns string) {
	if s.clock == nil {
		return "", ""
	}
	now := s.clock()
	u := now.UnixMicro()
	return itoa(u), itoa(now.UnixNano() - u*1000)
}

// do makes one call to Redis, f, through the breaker and with the timeout,
// and classifies its failure.
func (s *Store) do(ctx context.Context, f func(ctx context.Context, client rueidis.Client) error) error {
	if !s.breaker.allow(time.Now()) {
		return admit.Errorf(admit.CodeUnavailable, "redisstore: circuit breaker open after %d consecutive failures", s.breaker.threshold)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	s.calls.Add(1)
	client, err := s.client()
	if err == nil {
		err = f(ctx, client)
	}
	if err != nil {
		return s.fail(ctx, err)
	}
	s.breaker.success()
	return nil
}

// run makes a call of the library's function.
func (s *Store) run(ctx context.Context, c call) ([]int64, error) {
	var v []int64
	err := s.do(ctx, func(ctx context.Context, client rueidis.Client) (err error) {
		v, err = s.fcall(ctx, client, c)
		return err
	})
	return v, err
}

// fcall calls the library's function. A server without the library — a new
// deployment, a restart without persistence, a failover to a node that
// never had it — gets it loaded, on every node, and the call is made again.
func (s *Store) fcall(ctx context.Context, client rueidis.Client, c call) ([]int64, error) {
	loaded := false
	for {
		cmd := client.B().Fcall().Function(functionName).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(c.args...).Build()
		v, err := client.Do(ctx, cmd).AsIntSlice()
		if _, reply := rueidis.IsRedisErr(err); err != nil && !reply && s.cluster && ctx.Err() == nil {
			// The slot's master, as the client knows it, is not there:
			// after a failover, its replica may serve the slot already.
			if node := s.slotOwner(ctx, client, c.keys[0]); node != nil {
				nv, nerr := node.Do(ctx, node.B().Fcall().Function(functionName).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(c.args...).Build()).AsIntSlice()
				if re, ok := rueidis.IsRedisErr(nerr); !ok || !isRedirect(re) {
					// A redirect means the cluster's account was
					// already old: the first failure stands.
					v, err = nv, nerr
				}
			}
		}
		re, ok := rueidis.IsRedisErr(err)
		switch {
		case ok && !loaded && strings.Contains(re.Error(), "Function not found"):
			if err := s.loadFunctions(ctx); err != nil {
				return nil, err
			}
			loaded = true
			continue
		case ok && re.IsTryAgain():
			// A slot being migrated holds some of the call's keys and
			// not the others: nothing ran. Redis asks to try again in
			// a moment; do, within the call's timeout.
			select {
			case <-ctx.Done():
				return nil, err
			case <-time.After(2 * time.Millisecond):
			}
			continue
		}
		return v, err
	}
}

// functionName is the library's function; redishook.FunctionName says
// what each version changed.
const functionName = redishook.FunctionName

// loadFunctions loads the decision engine library on every node (FUNCTION
// LOAD REPLACE). Replicas refuse writes and get it from their master. The
// store calls it by itself when Redis says the function is missing.
func (s *Store) loadFunctions(ctx context.Context) error {
	client, err := s.client()
	if err != nil {
		return err
	}
	nodes := map[string]rueidis.Client{"redis": client}
	if s.cluster {
		nodes = client.Nodes()
	}
	loaded := 0
	var last error
	for _, c := range nodes {
		err := c.Do(ctx, c.B().FunctionLoad().Replace().FunctionCode(scriptSource).Build()).Error()
		if re, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(re.Error(), "READONLY") {
			continue
		}
		if err != nil {
			last = err
			continue
		}
		loaded++
	}
	if loaded == 0 && last != nil {
		return last
	}
	return nil
}

// fail classifies err: Redis refusing the script is a bug (CodeInternal),
// anything else — a timeout, a lost connection, a cluster in failover —
// is the store being unavailable, which also counts against the breaker.
func (s *Store) fail(ctx context.Context, err error) error {
	if re, ok := rueidis.IsRedisErr(err); ok && !re.IsClusterDown() && !re.IsLoading() && !re.IsTryAgain() && !isTransient(re.Error()) {
		s.breaker.success() // Redis answered
		return admit.Errorf(admit.CodeInternal, "redisstore: script: %w", err)
	}
	if ctx.Err() != nil && errors.Is(err, context.Canceled) && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// The caller gave up; that says nothing about Redis.
		return admit.Errorf(admit.CodeUnavailable, "redisstore: %w", err)
	}
	s.failures.Add(1)
	if s.breaker.failure(time.Now()) {
		go s.probe()
	}
	if admit.ErrorCode(err) == admit.CodeUnavailable {
		return err // the store's own: no connection yet
	}
	return admit.Errorf(admit.CodeUnavailable, "redisstore: %w", err)
}

// probe pings Redis while the breaker is open, every tenth of its cooldown,
// and closes the breaker at the first answer: decisions are Redis's again
// within moments of its return, not a cooldown later. One probe runs at a
// time; it stops when the breaker closes or the store does.
func (s *Store) probe() {
	if !s.probing.CompareAndSwap(false, true) {
		return
	}
	defer s.probing.Store(false)
	every := max(s.breaker.cooldown/10, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for s.breaker.openAt.Load() != 0 {
		select {
		case <-s.closed:
			return
		case <-t.C:
		}
		if s.Ping(context.Background()) == nil {
			s.breaker.success()
		}
	}
}

// isTransient reports Redis errors that say "not now" rather than "wrong":
// a master that is gone or read-only after a failover, a server at its
// maxmemory that takes no more writes.
func isTransient(msg string) bool {
	// WRONGPASS, NOAUTH and NOPERM: the ACL changed under a running
	// server; until it is mended, the store is as good as down, and the
	// rules' on_error decides.
	for _, p := range []string{"READONLY", "MASTERDOWN", "NOREPLICAS", "BUSY", "NOTBUSY", "OOM", "WRONGPASS", "NOAUTH", "NOPERM"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
