package wsgateway

import (
	"bufio"
	"encoding/binary"
	"errors"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

// The websocket library reads a message whole, frame after frame, without
// returning between them: a client that opens a message without FIN and
// then sends empty continuation frames keeps one Read busy for as long as
// it likes (39 million frames in 20 s, a core's worth of work, once kept a
// connection open without end), and neither the frame budget nor the
// message size limit, which counts payload bytes, ever sees them. So the
// gateway watches the frames on the connection under the library, and
// bounds every message: at most Options.MaxMessageFrames frames, arrived
// whole within Options.MessageTimeout of its first frame. Past either the
// connection is closed with 1008.
//
// The same watch ends what a client sends once the gateway closes its
// connection: the library then reads on for up to 5 s, until the client's
// close frame, and a client that floods instead had every frame of those
// 5 s decoded (a core's worth again, at each close). From the close on,
// only the client's close frames reach the library; the bytes of other
// frames are dropped as they are read, up to closeDrain, which covers
// what an honest client had in flight. Past it, or past a message's
// bounds, nothing more is read: the connection waits, its client's
// sends held back by TCP, for the library to end the close handshake
// unanswered (5 s) and close it.

// errMessageFrames and errMessageTimeout are the read errors of a message
// past its bounds.
var (
	errMessageFrames  = errors.New("wsgateway: a message of too many frames")
	errMessageTimeout = errors.New("wsgateway: a message did not arrive whole in time")
)

// closeDrain bounds the bytes of a client's frames the gateway drops
// after it has begun to close the connection, waiting for its close frame.
const closeDrain = 1 << 20

// frameHijacker is the ResponseWriter the gateway upgrades through: its
// Hijack hands the library a frameConn over the client's connection.
type frameHijacker struct {
	http.ResponseWriter
	maxFrames int
	timeout   time.Duration
	conn      *frameConn // set by Hijack
}

func (h *frameHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return conn, brw, err
	}
	// What the server read past the upgrade request (frames a client sent
	// without waiting for the 101) is read through the frameConn too.
	fc := &frameConn{Conn: conn, maxFrames: h.maxFrames, timeout: h.timeout}
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		fc.pending = append([]byte(nil), b...)
	}
	brw.Reader.Reset(fc)
	h.conn = fc
	return fc, brw, nil
}

func (h *frameHijacker) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// frameConn follows the frame headers of what the client sends (RFC 6455,
// section 5.2) as it is read, counting the frames of the message under
// way, and bounds the time the gateway waits for a message or a frame it
// has begun to read: its reads are given a deadline then, of what is left
// of the message's time. Time the gateway spends on anything else (a
// message's decision, a full route queue) is not counted. Once closing,
// it passes on only close frames. Only the reading side is watched:
// writes pass through.
type frameConn struct {
	net.Conn
	maxFrames int
	timeout   time.Duration
	pending   []byte      // read before the upgrade, to be read first
	closing   atomic.Bool // the gateway is closing the connection
	dropped   int         // bytes dropped since closing
	stalled   bool        // nothing more is read

	head      [14]byte      // the frame header being read
	headLen   int           // bytes of it read; 0 between frames
	headNeed  int           // its length, once its second byte is read
	payload   uint64        // payload bytes of the current frame not yet read
	keep      bool          // the current frame is passed on, not dropped
	control   bool          // the current frame is a control frame
	fin       bool          // the current data frame ends its message
	frames    int           // frames of the message under way, 0 between messages
	left      time.Duration // of the message's (or frame's) time
	deadlined bool          // a read deadline is set
}

// close makes c pass on only the client's close frames from the next
// frame on: the gateway decides nothing more on the connection.
func (c *frameConn) close() { c.closing.Store(true) }

func (c *frameConn) Read(p []byte) (int, error) {
	for {
		if c.stalled {
			// Nothing more is read: the library's close handshake ends at
			// once rather than waiting out its timeout (5 s a connection).
			return 0, net.ErrClosed
		}
		n, err := c.read(p)
		kept, ferr := c.scan(p[:n])
		if ferr == nil && errors.Is(err, errMessageTimeout) {
			ferr = err
		}
		if ferr != nil {
			// The connection is closed for it: the library is told once,
			// then reads nothing more.
			c.stalled = true
			return 0, ferr
		}
		if c.closing.Load() && c.dropped > closeDrain {
			c.stalled = true
		}
		// Bytes that were all of dropped frames are no progress: read on
		// (a reader that gets nothing, without an error, gives up).
		if kept > 0 || err != nil || n == 0 {
			return kept, err
		}
	}
}

// read reads what comes next: what the server had buffered, then the
// connection, within what is left of a message's time while one is under
// way.
func (c *frameConn) read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	waiting := c.timeout > 0 && (c.headLen > 0 || c.frames > 0)
	var start time.Time
	switch {
	case waiting:
		if c.left <= 0 {
			return 0, errMessageTimeout
		}
		start = time.Now()
		if c.Conn.SetReadDeadline(start.Add(c.left)) == nil {
			c.deadlined = true
		}
	case c.deadlined:
		// Between messages a connection may be idle: the gateway's
		// pings watch it then.
		_ = c.Conn.SetReadDeadline(time.Time{})
		c.deadlined = false
	}
	n, err := c.Conn.Read(p)
	if waiting {
		c.left -= time.Since(start)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, errMessageTimeout
		}
	}
	return n, err
}

// scan follows the frames in b, which continues what was read before,
// and moves the bytes of the frames it keeps to the front of b: it
// returns how many there are.
func (c *frameConn) scan(b []byte) (int, error) {
	out := 0
	for i := 0; i < len(b); {
		if c.headNeed > 0 && c.headLen == c.headNeed {
			// In a payload.
			k := len(b) - i
			if uint64(k) > c.payload {
				k = int(c.payload)
			}
			if c.keep {
				out += copy(b[out:], b[i:i+k])
			} else {
				c.dropped += k
			}
			c.payload -= uint64(k)
			i += k
			if c.payload == 0 {
				c.endFrame()
			}
			continue
		}
		if c.headLen == 0 {
			// A frame begins: a message's first, or a control frame
			// between messages, starts the clock.
			if c.frames == 0 {
				c.left = c.timeout
			}
			c.keep = !c.closing.Load() || b[i]&0x0f == 8
		}
		c.head[c.headLen] = b[i]
		c.headLen++
		if c.keep {
			b[out] = b[i]
			out++
		} else {
			c.dropped++
		}
		i++
		if c.headLen == 2 {
			c.headNeed = 2
			switch c.head[1] & 0x7f {
			case 126:
				c.headNeed += 2
			case 127:
				c.headNeed += 8
			}
			if c.head[1]&0x80 != 0 {
				c.headNeed += 4 // the mask key
			}
		}
		if c.headLen < 2 || c.headLen < c.headNeed {
			continue
		}
		if err := c.startFrame(); err != nil {
			return out, err
		}
		if c.payload == 0 {
			c.endFrame()
		}
	}
	return out, nil
}

// startFrame reads a whole header: a data frame the library is given
// counts against its message's bound of frames.
func (c *frameConn) startFrame() error {
	switch n := c.head[1] & 0x7f; n {
	case 126:
		c.payload = uint64(binary.BigEndian.Uint16(c.head[2:4]))
	case 127:
		c.payload = binary.BigEndian.Uint64(c.head[2:10])
	default:
		c.payload = uint64(n)
	}
	op := c.head[0] & 0x0f
	c.control = op >= 8
	if c.control || !c.keep {
		return nil // pings and pongs draw on the frame budget
	}
	c.fin = c.head[0]&0x80 != 0
	if op != 0 {
		// A message's first frame (the library refuses a continuation
		// with none before it, and a new message inside another).
		c.frames = 0
	}
	c.frames++
	if c.maxFrames > 0 && c.frames > c.maxFrames {
		return errMessageFrames
	}
	return nil
}

// endFrame is the end of a frame's payload: the end of its message if it
// was a data frame with FIN that the library was given.
func (c *frameConn) endFrame() {
	c.headLen, c.headNeed = 0, 0
	if c.keep && !c.control && c.fin {
		c.frames = 0
	}
}

// messageBoundReason is the close reason of a connection whose message
// passed a bound of frameConn's.
func messageBoundReason(err error, maxFrames int, timeout time.Duration) (string, bool) {
	switch {
	case errors.Is(err, errMessageFrames):
		return "a message of more than " + strconv.Itoa(maxFrames) + " frames", true
	case errors.Is(err, errMessageTimeout):
		return "a message did not arrive whole within " + timeout.String(), true
	}
	return "", false
}
