package wsgateway

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/httpx"
	"github.com/admitdev/admit/policy"
)

// conn is one admitted WebSocket connection. Its handler goroutine reads;
// a writer goroutine runs only while frames wait to be written, so an idle
// connection costs one goroutine.
type conn struct {
	g                   *Gateway
	id, tenant, session string
	msgKey              string // the bucket of the tenant's messages_per_minute
	lease               string // "" when admitted without a store (failed open)
	// refusalKey keeps the refusals of the connection's messages
	// (client.refusalKey of msgKey).
	refusalKey string
	client     client
	keyHash    string // of the API key it connected with, "" if none
	// msg are the charges of a message, under the policy of the last one;
	// only the reading goroutine touches them.
	msg *msgCharges
	// sessionLease is the session's tenant_sessions slot, renewed while
	// the connection lives and once when it ends.
	sessionLease string
	unsubscribe  func()

	ctx    context.Context // ends when the connection closes
	cancel context.CancelFunc

	deadline atomic.Int64 // the session's last known deadline, Unix ns
	lastRead atomic.Int64 // Unix ns of the last frame read

	// budget is the frame budget (Options.FrameBudget): frames that carry
	// no admitted message draw on it.
	budget budget

	mu      sync.Mutex
	ws      *websocket.Conn // set once, under mu, when the upgrade succeeds
	fc      *frameConn      // ws's connection, set with it
	queue   [][]byte
	queued  int // bytes in queue
	writing bool
	closed  bool
	// code and reason are a close asked for before the upgrade finished.
	code   websocket.StatusCode
	reason string
}

// attach sets the upgraded connection and the frameConn under it. It
// reports false if the connection was closed meanwhile (its session
// deleted, say): ws is then closed with the code asked for.
func (c *conn) attach(ws *websocket.Conn, fc *frameConn) bool {
	c.mu.Lock()
	c.ws, c.fc = ws, fc
	closed, code, reason := c.closed, c.code, c.reason
	start := !closed && len(c.queue) > 0 && !c.writing
	c.writing = c.writing || start
	c.mu.Unlock()
	if closed {
		closeWS(ws, fc, code, reason)
	}
	if start {
		go c.write(ws)
	}
	return !closed
}

func (c *conn) setDeadline(t time.Time) { c.deadline.Store(t.UnixNano()) }

func (c *conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// serve reads the client's frames until the connection ends.
func (c *conn) serve() {
	defer c.cleanup()
	c.lastRead.Store(time.Now().UnixNano())
	for {
		_, data, err := c.ws.Read(c.ctx)
		if err != nil {
			if websocket.CloseStatus(err) == websocket.StatusMessageTooBig {
				c.g.log.Debug("gateway: frame over the size limit", "tenant", c.tenant, "connection", c.id)
			}
			if reason, ok := messageBoundReason(err, c.g.msgFrames, c.g.msgTimeout); ok && !c.isClosed() {
				c.g.stats.messageClosed.Add(1)
				c.g.log.Debug("gateway: "+reason, "tenant", c.tenant, "connection", c.id)
				// The connection reads no more (every read fails), so the
				// close handshake ends as soon as the close frame is
				// written.
				_ = c.ws.Close(websocket.StatusPolicyViolation, reason)
			}
			return
		}
		c.lastRead.Store(time.Now().UnixNano())
		if c.isClosed() {
			// Closing: read on until the client's close frame ends the
			// handshake, deciding nothing.
			continue
		}
		c.g.onMessage(c, data)
	}
}

// cleanup frees what the connection held: its slot (at once, so that a
// client that drops its connection can reconnect), its subscription, its
// place in the gateway. It runs once, when the connection ends or when an
// upgrade fails after the admission.
func (c *conn) cleanup() {
	c.mu.Lock()
	c.closed = true
	c.queue, c.queued = nil, 0
	ws := c.ws
	c.mu.Unlock()
	c.cancel()
	if ws != nil {
		ws.CloseNow()
	}
	if c.unsubscribe != nil {
		c.unsubscribe()
	}
	c.g.releaseSlot(c.lease, c.tenant)
	c.g.slotFreed(c.tenant)
	if c.sessionLease != "" {
		// The session may live on for its TTL after its last activity,
		// which was before now: its slot from now on.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c.g.renewSlot(ctx, c.sessionLease, c.tenant)
		cancel()
	}
	c.g.mu.Lock()
	_, ok := c.g.conns[c]
	delete(c.g.conns, c)
	c.g.mu.Unlock()
	if ok {
		c.g.stats.connections.Add(-1)
	}
}

// deliver is the connection's subscription to its session's events.
func (c *conn) deliver(ev Event) {
	if ev.Closed != "" {
		c.close(CloseSessionDeleted, "the session was deleted")
		return
	}
	if !ev.ExpiresAt.IsZero() {
		c.setDeadline(ev.ExpiresAt)
	}
	c.send(ev.Frame)
}

// send queues a frame for the client. A client that lets more than the
// send bounds pile up is closed with 1008: its frames are not kept.
func (c *conn) send(frame []byte) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if len(c.queue) >= c.g.sendFrames || c.queued+len(frame) > c.g.sendBytes {
		c.mu.Unlock()
		c.g.stats.slow.Add(1)
		c.close(websocket.StatusPolicyViolation, "slow consumer: the send buffer is full")
		return
	}
	c.queue = append(c.queue, frame)
	c.queued += len(frame)
	start := !c.writing && c.ws != nil // before the upgrade, attach starts it
	c.writing = c.writing || start
	ws := c.ws
	c.mu.Unlock()
	if start {
		go c.write(ws)
	}
}

// write writes queued frames to ws until the queue is empty.
func (c *conn) write(ws *websocket.Conn) {
	for {
		c.mu.Lock()
		if c.closed || len(c.queue) == 0 {
			c.writing = false
			c.queue = nil // let an idle connection's buffer go
			c.mu.Unlock()
			return
		}
		frame := c.queue[0]
		c.queue[0] = nil
		c.queue = c.queue[1:]
		c.queued -= len(frame)
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(c.ctx, c.g.writeTimeout)
		err := ws.Write(ctx, websocket.MessageText, frame)
		cancel()
		if err != nil {
			c.mu.Lock()
			c.closed, c.writing, c.queue, c.queued = true, false, nil, 0
			c.mu.Unlock()
			ws.CloseNow()
			return
		}
	}
}

// close closes the connection with a code, in the background: the close
// handshake waits for the client.
func (c *conn) close(code websocket.StatusCode, reason string) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.queue, c.queued = nil, 0
	c.code, c.reason = code, reason
	ws, fc := c.ws, c.fc
	c.mu.Unlock()
	if ws == nil {
		return // attach closes it
	}
	go closeWS(ws, fc, code, reason)
}

// closeWS closes ws with a code, waiting for the client's close frame (at
// most 5 s, the library's bound): the only frames of the client's fc
// passes on from now.
func closeWS(ws *websocket.Conn, fc *frameConn, code websocket.StatusCode, reason string) {
	if fc != nil {
		fc.close()
	}
	if err := ws.Close(code, reason); err != nil {
		ws.CloseNow()
	}
}

// inbound is a client frame.
type inbound struct {
	Route string          `json:"route"`
	ID    *string         `json:"id"`
	Data  json.RawMessage `json:"data"`
}

// maxIDLen bounds a client's message id.
const maxIDLen = 128

// onMessage decides one client frame: malformed frames get an error frame
// (the connection stays), throttled ones a throttled frame; the others go
// to their route's queue.
//
// Only an admitted message costs the store anything: its decision, then
// the reply's Publish, which also moves the session's deadline. A
// malformed frame costs nothing; a frame over messages_per_minute or a
// global rule naming ws:message costs nothing once the refusal is known
// here (refusedLocally), and neither moves the session's deadline. Each
// draws on the connection's frame budget instead.
func (g *Gateway) onMessage(c *conn, data []byte) {
	var in inbound
	if err := json.Unmarshal(data, &in); err != nil {
		c.malformed(errorFrame("", "the frame is not a JSON object of route, id and data: "+err.Error()))
		return
	}
	// Decoded, the last of two values won, while the handler, or whoever
	// reads its reply, may read the first: refused, as the HTTP API
	// refuses such a body. Route and id are matched in any case, as the
	// decoder matches them; data's keys exactly.
	if k, dup := httpx.DuplicateFieldKey(data); dup {
		c.malformed(errorFrame("", "the frame holds the key "+strconv.Quote(k)+" twice"))
		return
	}
	if k, bad := httpx.BadText(data); bad {
		c.malformed(errorFrame("", "the frame's "+strconv.Quote(strings.ToValidUTF8(k, "?"))+" holds text that is not UTF-8"))
		return
	}
	id := ""
	if in.ID != nil {
		id = *in.ID
	}
	if len(id) > maxIDLen {
		c.malformed(errorFrame("", "id is longer than 128 bytes"))
		return
	}
	if in.Route != RouteSilo && in.Route != RoutePool {
		c.malformed(errorFrame(id, `route must be "silo" or "pool"`))
		return
	}
	if len(in.Data) == 0 {
		in.Data = json.RawMessage("null")
	}
	p, t, l, err := g.tenantOf(c.tenant)
	if err != nil {
		c.refuse(errorFrame(id, err.Error()))
		return
	}
	m, err := c.messageCharges(p, l)
	if err != nil {
		c.refuse(errorFrame(id, "the message could not be decided: "+err.Error()))
		return
	}
	now := g.now()
	if retry, deniedBy, ok := g.refusedLocally(c.refusalKey, m.rules[0], m.shared, now); ok {
		g.stats.throttledLocally.Add(1)
		c.throttle(throttledFrame(id, deniedBy, retry))
		return
	}
	res := policy.Resolution{Policy: p, Tenant: t, Charges: m.charges, Rules: m.rules}
	var dec admit.Decision
	if _, err := g.decider.Decide(c.ctx, &res, &dec); err != nil {
		c.refuse(errorFrame(id, "the message could not be decided: "+err.Error()))
		return
	}
	if !dec.Allowed {
		g.learnRefusal(c.refusalKey, m, now, &dec)
		c.throttle(throttledFrame(id, dec.DeniedBy, dec.RetryAfter))
		return
	}
	g.routes.enqueue(c.ctx, &job{c: c, msg: Message{
		Tenant: c.tenant, Session: c.session, Connection: c.id, Route: in.Route, ID: id, Data: in.Data,
	}, ttl: l.gw.SessionTTL})
}

// throttle answers a message refused by messages_per_minute or a global
// rule, within the connection's frame budget.
func (c *conn) throttle(frame []byte) {
	c.g.stats.throttled.Add(1)
	c.refuse(frame)
}

// malformed answers a frame that is not a message the gateway can decide,
// within the connection's frame budget.
func (c *conn) malformed(frame []byte) {
	c.g.stats.malformed.Add(1)
	c.refuse(frame)
}

// refuse answers a frame that carries no admitted message, within the
// connection's frame budget.
func (c *conn) refuse(frame []byte) {
	if c.spend() {
		c.send(frame)
	}
}

// control counts a ping or pong from the client against the frame budget
// and reports whether it is within it (a ping is then answered).
func (c *conn) control() bool {
	c.g.stats.control.Add(1)
	return c.spend()
}

// spend takes one frame from the connection's budget. A connection past
// its budget is closed with 1008, and spend reports false: the frame is not
// answered.
func (c *conn) spend() bool {
	if c.budget.take(c.g.now(), c.g.frameBudget, c.g.frameRefill) {
		return true
	}
	if !c.isClosed() {
		c.g.stats.overBudget.Add(1)
		c.g.log.Debug("gateway: frames past the budget", "tenant", c.tenant, "connection", c.id)
		c.close(websocket.StatusPolicyViolation, "too many refused, malformed or control frames")
	}
	return false
}

// budget is a connection's frame budget: a token bucket of frames whose
// zero value is full. It tracks what was spent, not what is left, so that
// a new connection needs no setup.
type budget struct {
	mu    sync.Mutex
	spent float64   // frames
	at    time.Time // when spent was last brought up to date
}

// take spends one frame at now if the budget, of size frames refilled at
// rate a second, has one left.
func (b *budget) take(now time.Time, size, rate float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.After(b.at) {
		b.spent = max(0, b.spent-now.Sub(b.at).Seconds()*rate)
		b.at = now
	}
	if b.spent+1 > size {
		return false
	}
	b.spent++
	return true
}

func errorFrame(id, detail string) []byte {
	b := append([]byte(`{"type":"error","id":`), jsonString(id)...)
	b = append(b, `,"error":`...)
	b = append(b, jsonString(detail)...)
	return append(b, '}')
}

func throttledFrame(id, deniedBy string, retry time.Duration) []byte {
	b := append([]byte(`{"type":"throttled","id":`), jsonString(id)...)
	b = append(b, `,"denied_by":`...)
	b = append(b, jsonString(deniedBy)...)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, retry.Milliseconds(), 10)
	return append(b, '}')
}

func jsonString(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}
