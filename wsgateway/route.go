package wsgateway

import (
	"context"
	"encoding/json"
	"hash/maphash"
	"sync"
	"time"

	"github.com/admitdev/admit"
)

// The routes a client frame names.
const (
	// RouteSilo processes each tenant's messages in one ordered queue with
	// a worker of its own: one tenant's slow messages never delay
	// another's.
	RouteSilo = "silo"
	// RoutePool processes every tenant's messages in a shared worker
	// pool, in order per (tenant, session), like an SQS FIFO queue's
	// message group.
	RoutePool = "pool"
)

// Message is a client message as a route's worker hands it to the Handler.
type Message struct {
	Tenant, Session string
	Connection      string // the id of the sending connection
	Route           string // RouteSilo or RoutePool
	ID              string // the client's id for the message
	Data            json.RawMessage
}

// A Handler processes the messages of a gateway. Its reply data is sent to
// every connection of the sender's session as
// {"type":"echo","route","id","data","from","seq"}; an error is sent to the
// sender alone as {"type":"error","id","error"}. Calls for one silo route
// tenant, or for one pool route (tenant, session), never overlap; others
// do, so a Handler is safe for concurrent use.
type Handler interface {
	Handle(ctx context.Context, m *Message) (json.RawMessage, error)
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, m *Message) (json.RawMessage, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, m *Message) (json.RawMessage, error) {
	return f(ctx, m)
}

// Echo replies with the message's data: the sample's handler.
var Echo Handler = HandlerFunc(func(_ context.Context, m *Message) (json.RawMessage, error) {
	return m.Data, nil
})

type job struct {
	c   *conn
	msg Message
	ttl time.Duration // the session TTL the reply refreshes
}

// routes are the silo workers (started per tenant, gone when idle) and
// the pool workers.
type routes struct {
	g        *Gateway
	size     int
	siloIdle time.Duration

	mu    sync.Mutex
	silos map[string]*silo
	wg    sync.WaitGroup

	seed maphash.Seed
	pool []chan *job
}

type silo struct {
	jobs    chan *job
	pending int // jobs handed out by enqueue and not yet received; routes.mu
}

func newRoutes(g *Gateway, size, workers int) *routes {
	rs := &routes{g: g, size: size, siloIdle: time.Minute, silos: map[string]*silo{}, seed: maphash.MakeSeed()}
	rs.pool = make([]chan *job, workers)
	for i := range rs.pool {
		ch := make(chan *job, max(1, size/workers))
		rs.pool[i] = ch
		rs.wg.Add(1)
		go func() {
			defer rs.wg.Done()
			for {
				select {
				case j := <-ch:
					rs.process(j)
				case <-g.ctx.Done():
					return
				}
			}
		}()
	}
	return rs
}

// enqueue queues j on its route, waiting while the queue is full: the
// sender's reading stops, and TCP pushes back on the client.
func (rs *routes) enqueue(ctx context.Context, j *job) {
	var ch chan *job
	var s *silo
	if j.msg.Route == RoutePool {
		h := maphash.Comparable(rs.seed, [2]string{j.msg.Tenant, j.msg.Session})
		ch = rs.pool[h%uint64(len(rs.pool))]
	} else {
		rs.mu.Lock()
		s = rs.silos[j.msg.Tenant]
		if s == nil {
			s = &silo{jobs: make(chan *job, rs.size)}
			rs.silos[j.msg.Tenant] = s
			rs.wg.Add(1)
			go rs.runSilo(j.msg.Tenant, s)
		}
		s.pending++
		rs.mu.Unlock()
		ch = s.jobs
	}
	select {
	case ch <- j:
	case <-ctx.Done():
		if s != nil {
			rs.mu.Lock()
			s.pending--
			rs.mu.Unlock()
		}
	case <-rs.g.ctx.Done():
	}
}

// runSilo is a tenant's silo worker. It ends after a minute without
// messages, or when the gateway closes.
func (rs *routes) runSilo(tenant string, s *silo) {
	defer rs.wg.Done()
	idle := time.NewTimer(rs.siloIdle)
	defer idle.Stop()
	for {
		select {
		case j := <-s.jobs:
			rs.mu.Lock()
			s.pending--
			rs.mu.Unlock()
			rs.process(j)
			idle.Reset(rs.siloIdle)
		case <-idle.C:
			rs.mu.Lock()
			if s.pending == 0 {
				delete(rs.silos, tenant)
				rs.mu.Unlock()
				return
			}
			rs.mu.Unlock()
			idle.Reset(rs.siloIdle)
		case <-rs.g.ctx.Done():
			return
		}
	}
}

// wait waits for the workers to end (after the gateway's context).
func (rs *routes) wait() { rs.wg.Wait() }

// process runs the handler and publishes its reply to the session.
func (rs *routes) process(j *job) {
	g := rs.g
	m := &j.msg
	data, err := g.handler.Handle(j.c.ctx, m)
	if err != nil {
		j.c.send(errorFrame(m.ID, err.Error()))
		return
	}
	if len(data) == 0 {
		data = json.RawMessage("null")
	} else if !json.Valid(data) {
		j.c.send(errorFrame(m.ID, "the handler's reply is not JSON"))
		return
	}
	frame := make([]byte, 0, 64+len(m.ID)+len(data)+len(m.Connection))
	frame = append(frame, `{"type":"echo","route":"`...)
	frame = append(frame, m.Route...)
	frame = append(frame, `","id":`...)
	frame = append(frame, jsonString(m.ID)...)
	frame = append(frame, `,"data":`...)
	frame = append(frame, data...)
	frame = append(frame, `,"from":"`...)
	frame = append(frame, m.Connection...) // base64url: nothing to escape
	frame = append(frame, '"')
	// Counted before the reply goes out, so that whoever reads the reply
	// finds it counted.
	g.stats.messages.Add(1)
	// The reply goes out even if the sender has gone: the session's other
	// connections still expect it.
	ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
	defer cancel()
	if _, err := g.sessions.Publish(ctx, m.Session, j.ttl, frame); err != nil {
		if admit.ErrorCode(err) == admit.CodeNotFound {
			j.c.send(errorFrame(m.ID, "the session has ended"))
			return
		}
		j.c.send(errorFrame(m.ID, "the reply could not be delivered: "+err.Error()))
		return
	}
}
