package wsgateway_test

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/admitdev/admit/wsgateway"
)

// wsFrame is a client frame, masked, of opcode op.
func wsFrame(op byte, fin bool, payload []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	var out []byte
	switch n := len(payload); {
	case n < 126:
		out = []byte{b0, 0x80 | byte(n)}
	case n < 1<<16:
		out = []byte{b0, 0x80 | 126, byte(n >> 8), byte(n)}
	default:
		out = []byte{b0, 0x80 | 127, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint64(out[2:], uint64(n))
	}
	mask := [4]byte{7, 1, 8, 2}
	out = append(out, mask[:]...)
	for i, c := range payload {
		out = append(out, c^mask[i%4])
	}
	return out
}

// rawWS is a WebSocket client that writes its frames by hand.
type rawWS struct {
	net.Conn
	br *bufio.Reader
}

// rawDial upgrades a connection by hand, sending first (frames) right
// behind the request, before the 101.
func rawDial(t *testing.T, h *harness, tenant, session string, first []byte) *rawWS {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	req := "GET /v1/ws?tenant=" + tenant + "&session=" + session + " HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	if _, err := conn.Write(append([]byte(req), first...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	return &rawWS{Conn: conn, br: br}
}

// next reads the server's next frame: its opcode and payload.
func (c *rawWS) next(within time.Duration) (byte, []byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(within))
	var h [2]byte
	if _, err := io.ReadFull(c.br, h[:]); err != nil {
		return 0, nil, err
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var e [2]byte
		if _, err := io.ReadFull(c.br, e[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(e[:]))
	case 127:
		var e [8]byte
		if _, err := io.ReadFull(c.br, e[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(e[:])
	}
	p := make([]byte, n)
	_, err := io.ReadFull(c.br, p)
	return h[0] & 0x0f, p, err
}

// closed reads frames until the server's close frame and returns its
// code and reason; -1 if the connection ended without one, 0 if it stayed
// open for within.
func (c *rawWS) closed(within time.Duration) (int, string) {
	end := time.Now().Add(within)
	for {
		op, p, err := c.next(time.Until(end))
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return 0, ""
			}
			return -1, ""
		}
		if op == 8 && len(p) >= 2 {
			return int(binary.BigEndian.Uint16(p)), string(p[2:])
		}
	}
}

// flood sends a message's first frame, then empty continuation frames
// until a write fails or stop is closed, and returns how many it sent.
func (c *rawWS) flood(stop <-chan struct{}) int64 {
	batch := make([]byte, 0, 6*1000)
	for range 1000 {
		batch = append(batch, wsFrame(0, false, nil)...)
	}
	if _, err := c.Write(wsFrame(1, false, []byte(`{"route":"silo",`))); err != nil {
		return 0
	}
	var sent int64
	for {
		select {
		case <-stop:
			return sent
		default:
		}
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := c.Write(batch); err != nil {
			return sent
		}
		sent += 1000
	}
}

// TestMessageFramesBounded: a client opens a message without FIN and
// sends empty continuation frames for ever. The library reads a message
// whole without returning between its frames, and counts its payload
// bytes, not its frames: such a client once kept a connection open, and a
// core busy, without end (39 million frames in 20 s). Past
// MaxMessageFrames the connection is closed with 1008. A message of that
// many frames, a ping among them, passes.
func TestMessageFramesBounded(t *testing.T) {
	h := newHarness(t, roomy, roomy, &wsgateway.Options{MaxMessageFrames: 16})
	c := rawDial(t, h, "t1", h.session("t1"), nil)
	stop := make(chan struct{})
	sent := make(chan int64, 1)
	go func() { sent <- c.flood(stop) }()
	code, reason := c.closed(20 * time.Second)
	close(stop)
	n := <-sent
	if code != int(websocket.StatusPolicyViolation) || !strings.Contains(reason, "more than 16 frames") {
		t.Fatalf("after %d empty continuation frames: close %d %q, want 1008 naming the bound", n, code, reason)
	}
	if st := h.g.Stats(); st.MessageClosed != 1 {
		t.Errorf("MessageClosed %d, want 1", st.MessageClosed)
	}

	// Sixteen frames, with a ping between two of them, and the first
	// sent with the upgrade request: one message, answered.
	msg := []byte(`{"route":"silo","id":"sixteen-frames","data":"` + strings.Repeat("x", 64) + `"}`)
	var frames [][]byte
	for i, part := 0, (len(msg)+15)/16; i < 16; i++ {
		op := byte(0)
		if i == 0 {
			op = 1
		}
		frames = append(frames, wsFrame(op, i == 15, msg[min(i*part, len(msg)):min((i+1)*part, len(msg))]))
		if i == 7 {
			frames = append(frames, wsFrame(9, true, []byte("between")))
		}
	}
	ok := rawDial(t, h, "t1", h.session("t1"), frames[0])
	for _, f := range frames[1:] {
		if _, err := ok.Write(f); err != nil {
			t.Fatal(err)
		}
	}
	var pong, reply bool
	for !pong || !reply {
		op, p, err := ok.next(5 * time.Second)
		if err != nil {
			t.Fatalf("the message of 16 frames: pong %v, reply %v: %v", pong, reply, err)
		}
		var f frame
		switch {
		case op == 10 && string(p) == "between":
			pong = true
		case op == 1 && json.Unmarshal(p, &f) == nil && f.ID == "sixteen-frames" && f.Type != "error":
			reply = true
		case op == 8:
			t.Fatalf("the message of 16 frames closed the connection: %q", p)
		}
	}
}

// TestMessageTimeout: a message must arrive whole within MessageTimeout
// of the gateway's waiting for it: one that stops after its first frame,
// sent with the upgrade request, and one that trickles a byte a frame,
// every 50 ms, are closed with 1008; before, either held its connection
// for as long as the client liked.
func TestMessageTimeout(t *testing.T) {
	h := newHarness(t, roomy, roomy, &wsgateway.Options{MessageTimeout: 300 * time.Millisecond})
	stalled := rawDial(t, h, "t1", h.session("t1"), wsFrame(1, false, []byte(`{"route":`)))
	if code, reason := stalled.closed(10 * time.Second); code != int(websocket.StatusPolicyViolation) || !strings.Contains(reason, "within 300ms") {
		t.Errorf("a message stalled after its first frame: close %d %q, want 1008 naming the bound", code, reason)
	}

	trickle := rawDial(t, h, "t1", h.session("t1"), nil)
	var sent atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		if _, err := trickle.Write(wsFrame(1, false, []byte(`{`))); err != nil {
			return
		}
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := trickle.Write(wsFrame(0, false, []byte(" "))); err != nil {
					return
				}
				sent.Add(1)
			}
		}
	}()
	if code, reason := trickle.closed(20 * time.Second); code != int(websocket.StatusPolicyViolation) || !strings.Contains(reason, "within 300ms") {
		t.Errorf("after %d frames a byte each, every 50 ms: close %d %q, want 1008", sent.Load(), code, reason)
	}
	if st := h.g.Stats(); st.MessageClosed != 2 {
		t.Errorf("MessageClosed %d, want 2", st.MessageClosed)
	}

	// Messages further apart than the bound, each whole at once: the
	// bound is a message's, not an idle connection's.
	c := h.mustDial("t1", h.session("t1"))
	for i := range 3 {
		send(t, c, fmt.Sprintf(`{"route":"silo","id":"m%d"}`, i))
		if f := read(t, c); f.ID != fmt.Sprintf("m%d", i) || f.Type == "error" {
			t.Fatalf("message %d: %+v", i, f)
		}
		time.Sleep(400 * time.Millisecond)
	}
}
