package envoyrls

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/admitdev/admit/internal/connlimit"
)

// served accepts one loopback connection through a Server's listener and
// returns it, its frames counted as the transport reads them from r.
func served(t *testing.T, r io.Reader) (*frameCounter, *connlimit.Listener, *Server) {
	t.Helper()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := connlimit.New(tcp, connlimit.Limits{Max: DefaultMaxConnections, MaxPerIP: DefaultMaxConnectionsPerIP})
	t.Cleanup(func() { ln.Close() })
	s := &Server{}
	client, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	c, err := streamsListener{Listener: ln, s: s}.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return &frameCounter{Conn: readerConn{Conn: c, r: r}, c: c.(*countedConn), preface: len(clientPreface)}, ln, s
}

// readerConn reads from r, and is otherwise its Conn.
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func frameBytes(typ, flags byte, id uint32, payload []byte) []byte {
	n := len(payload)
	return append([]byte{byte(n >> 16), byte(n >> 8), byte(n), typ, flags, byte(id >> 24), byte(id >> 16), byte(id >> 8), byte(id)}, payload...)
}

// readAll reads f until it fails, in reads of 7 bytes (frames split
// across reads), and returns how many bytes it passed on and its error.
func readAll(f *frameCounter) (int, error) {
	total := 0
	buf := make([]byte, 7)
	for {
		n, err := f.Read(buf)
		total += n
		if err != nil {
			return total, err
		}
	}
}

// TestFramesCounted: a timeline of a connection's frames. Streams that
// carry their message are calls and keep it open, reset or not; past
// MaxUncalledStreams streams that were not calls (besides MaxStreams that
// may still be), refused by the transport or not, it is closed and its
// address refused; past MaxControlFrames control frames with no calls
// (acknowledgements, empty DATA and CONTINUATION frames among them),
// too.
func TestFramesCounted(t *testing.T) {
	headers := frameBytes(frameHeaders, 0x4, 1, []byte{0x82, 0x86})
	streamOf := func(id uint32) []byte { return frameBytes(frameHeaders, 0x4, id, []byte{0x82, 0x86}) }
	t.Run("calls", func(t *testing.T) {
		// Calls, each reset right after its message (a client whose
		// deadline is shorter than the server's answer), and a few
		// control frames beside: all read.
		var in bytes.Buffer
		in.WriteString(clientPreface)
		for i := range uint32(5000) {
			id := 2*i + 1
			in.Write(streamOf(id))
			in.Write(frameBytes(frameData, 0, id, make([]byte, 20)))
			in.Write(frameBytes(frameData, 0x1, id, nil)) // END_STREAM, empty
			in.Write(frameBytes(0x3, 0, id, []byte{0, 0, 0, 8}))
		}
		f, _, _ := served(t, &in)
		if _, err := readAll(f); err != io.EOF {
			t.Fatalf("5,000 calls, each reset after its message: %v; want all read", err)
		}
		if got := f.c.calls.Load(); got != 5000 {
			t.Errorf("%d calls counted, want 5,000", got)
		}
	})
	for name, junk := range map[string][]byte{
		"empty_data":   frameBytes(frameData, 0, 1, nil),
		"continuation": frameBytes(0x9, 0, 1, nil),
		"ping_acks":    frameBytes(0x6, 0x1, 0, make([]byte, 8)),
	} {
		t.Run(name, func(t *testing.T) {
			var in bytes.Buffer
			in.WriteString(clientPreface)
			in.Write(headers)
			for range MaxControlFrames + 10 {
				in.Write(junk)
			}
			f, ln, _ := served(t, &in)
			if _, err := readAll(f); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("a flood of %s: %v; want the connection closed", name, err)
			}
			refusedAtOnce(t, ln)
		})
	}
	t.Run("uncalled", func(t *testing.T) {
		var in bytes.Buffer
		in.WriteString(clientPreface)
		for range MaxStreams + MaxUncalledStreams + 50 {
			in.Write(headers)
			in.Write(frameBytes(0x3, 0, 1, []byte{0, 0, 0, 8}))
		}
		f, ln, s := served(t, &in)
		if _, err := readAll(f); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("streams reset at once: %v; want the connection closed", err)
		}
		if got := f.c.streams.Load(); got != MaxStreams+MaxUncalledStreams+1 {
			t.Errorf("closed at stream %d, want %d", got, MaxStreams+MaxUncalledStreams+1)
		}
		if s.Connections().Uncalled != 1 || ln.Stats().Open != 0 {
			t.Errorf("stats %+v, listener %+v; want 1 closed, none open", s.Connections(), ln.Stats())
		}
		refusedAtOnce(t, ln)
	})
	t.Run("settings", func(t *testing.T) {
		var in bytes.Buffer
		in.WriteString(clientPreface)
		for range MaxControlFrames + 10 {
			in.Write(frameBytes(0x4, 0, 0, nil))
			in.Write(frameBytes(0x4, 0x1, 0, nil)) // acks count too
		}
		f, ln, _ := served(t, &in)
		if _, err := readAll(f); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("a SETTINGS flood: %v; want the connection closed", err)
		}
		if f.control != MaxControlFrames+1 {
			t.Errorf("closed at control frame %d, want %d", f.control, MaxControlFrames+1)
		}
		refusedAtOnce(t, ln)
	})
}

// refusedAtOnce checks that ln now closes a connection from loopback as
// it accepts it.
func refusedAtOnce(t *testing.T, ln *connlimit.Listener) {
	t.Helper()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("a connection from a penalized address: read %d, %v; want it closed", n, err)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Error("a connection from a penalized address was held")
	}
}
