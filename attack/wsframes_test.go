package attack

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// wsFrame is a client frame, masked, of opcode op and a payload under 126
// bytes.
func wsFrame(op byte, fin bool, payload string) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	mask := [4]byte{9, 8, 7, 6}
	out := append([]byte{b0, 0x80 | byte(len(payload))}, mask[:]...)
	for i := range len(payload) {
		out = append(out, payload[i]^mask[i%4])
	}
	return out
}

// rawWS upgrades a connection to /v1/ws by hand, so that its frames can be
// written by hand.
func (s *server) rawWS(t *testing.T, tenant, session string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_, err = io.WriteString(conn, "GET /v1/ws?tenant="+tenant+"&session="+session+" HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"+
		"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	return conn, br
}

// serverFrame reads the server's next frame: its opcode and payload.
func serverFrame(br *bufio.Reader) (byte, []byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, nil, err
	}
	n := int(h[1] & 0x7f)
	if n == 126 {
		var e [2]byte
		if _, err := io.ReadFull(br, e[:]); err != nil {
			return 0, nil, err
		}
		n = int(binary.BigEndian.Uint16(e[:]))
	}
	p := make([]byte, n)
	_, err := io.ReadFull(br, p)
	return h[0] & 0x0f, p, err
}

// serverClose reads the server's frames until its close frame and returns
// the close code and reason: 0 if none came within, -1 if the connection
// ended without one.
func serverClose(conn net.Conn, br *bufio.Reader, within time.Duration) (int, string) {
	_ = conn.SetReadDeadline(time.Now().Add(within))
	for {
		op, p, err := serverFrame(br)
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

// cpuSeconds returns the user and system CPU time process pid has used.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's closing parenthesis; utime and
	// stime are the 12th and 13th of them, in clock ticks (100 a second).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100
}

// TestGatewayMessageBounds: a client opens a text message without FIN
// and sends empty continuation frames as fast as it can; another opens one
// and stops. The websocket library reads a message whole, counting its
// payload bytes, not its frames, so neither the frame budget nor
// max_message_bytes saw them: 39 million frames in 20 s kept one
// connection open and a core busy (14.5 CPU-seconds), and two such
// connections raised another client's p99 from 3 ms to 66 ms. A message
// now has at most gateway.message_frames frames (128), and must arrive
// whole within gateway.message_timeout: past either, 1008.
func TestGatewayMessageBounds(t *testing.T) {
	s := serve(t, strings.Replace(gatewayConfig, "  lease_ttl: 1h\n", "  lease_ttl: 1h\n  message_timeout: 1s\n", 1), false)
	session := func() string {
		a := s.do("PUT", "/v1/sessions", `{"tenant":"keyless"}`)
		if a.status != 201 {
			t.Fatalf("a session: %d %s", a.status, a.raw)
		}
		return a.body["session_id"].(string)
	}
	conn, br := s.rawWS(t, "keyless", session())
	cpu := cpuSeconds(t, s.Cmd.Process.Pid)
	start := time.Now()
	stop := make(chan struct{})
	sent := make(chan int, 1)
	go func() {
		n := 0
		defer func() { sent <- n }()
		batch := []byte{}
		for range 1000 {
			batch = append(batch, wsFrame(0, false, "")...)
		}
		if _, err := conn.Write(wsFrame(1, false, `{"route":"silo",`)); err != nil {
			return
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := conn.Write(batch); err != nil {
				return
			}
			n += 1000
		}
	}()
	code, reason := serverClose(conn, br, 20*time.Second)
	open := time.Since(start)
	close(stop)
	n := <-sent
	used := cpuSeconds(t, s.Cmd.Process.Pid) - cpu
	report(t, "empty continuation frames written, close code, open for, server CPU-seconds", []any{n, code, open.Round(time.Millisecond).String(), used})
	if code != 1008 || !strings.Contains(reason, "more than 128 frames") {
		t.Errorf("after %d empty continuation frames in %v: close %d %q, want 1008 naming 128 frames", n, open, code, reason)
	}

	conn, br = s.rawWS(t, "keyless", session())
	if _, err := conn.Write(wsFrame(1, false, `{"route":`)); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	code, reason = serverClose(conn, br, 20*time.Second)
	report(t, "a message stalled after its first frame: close code, open for", []any{code, time.Since(start).Round(time.Millisecond).String()})
	if code != 1008 || !strings.Contains(reason, "within 1s") {
		t.Errorf("a message stalled after its first frame: close %d %q, want 1008 naming 1s", code, reason)
	}
	if !waitMetric(t, s, `admit_gateway_closed_total{reason="message_bounds"}`, 2) {
		t.Errorf("admit_gateway_closed_total{reason=\"message_bounds\"} is %v, want 2", s.Metric(t, `admit_gateway_closed_total{reason="message_bounds"}`))
	}

	// A message in 128 frames passes.
	conn, br = s.rawWS(t, "keyless", session())
	msg := `{"route":"pool","id":"in-128-frames","data":"` + strings.Repeat("y", 100) + `"}`
	var frames []byte
	for i := range 128 {
		op := byte(0)
		if i == 0 {
			op = 1
		}
		part := msg[min(i, len(msg)):min(i+1, len(msg))]
		if i == 127 {
			part = msg[min(i, len(msg)):]
		}
		frames = append(frames, wsFrame(op, i == 127, part)...)
	}
	if _, err := conn.Write(frames); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	op, reply, err := serverFrame(br)
	if err != nil || op != 1 || !strings.Contains(string(reply), `"type":"echo"`) || !strings.Contains(string(reply), "in-128-frames") {
		t.Errorf("a message of 128 frames: %d %q %v, want its echo", op, reply, err)
	}
}
