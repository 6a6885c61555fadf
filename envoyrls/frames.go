package envoyrls

import (
	"crypto/tls"
	"encoding/binary"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// What a connection may send besides calls, past which it is closed and
// its address refused connections for UncalledPenalty (see
// MaxUncalledStreams for streams). Control frames are all but HEADERS,
// a call's DATA and GOAWAY (see frameCounter.frame): a connection may
// send MaxControlFrames of them, and ControlFramesPerCall more for each
// call it made. (Each costs the server its parsing and, for
// most, an answer; a client once sent 12.5 million SETTINGS in 20 s, each
// acknowledged.)
const (
	MaxControlFrames     = 1000
	ControlFramesPerCall = 10
)

// MaxHeaderListSize bounds the headers of a stream as they are decoded,
// told to clients in SETTINGS_MAX_HEADER_LIST_SIZE: HPACK lets a few bytes
// on the wire name a large header again and again (8 KB sent decoded to
// 16 MB a stream). Envoy's calls carry a few hundred bytes of headers.
const MaxHeaderListSize = 16 << 10

// HTTP/2 frame types (RFC 9113, section 6).
const (
	frameData    = 0x0
	frameHeaders = 0x1
	frameGoAway  = 0x7
)

// clientPreface is what an HTTP/2 client sends before its first frame.
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// frameCounter reads a connection's HTTP/2 frames as the server's
// transport reads them, counting the streams they open and their control
// frames against the connection's calls, and ends the connection when
// either is past its bound. It reads frame headers only; payloads pass
// through unread.
type frameCounter struct {
	net.Conn
	c        *countedConn
	preface  int     // bytes of the client preface still to pass
	hdr      [9]byte // a frame header read in part
	have     int     // bytes of hdr read
	skip     uint32  // payload bytes of the current frame still to pass
	control  int64
	messages int64  // DATA frames of a message after a stream's first
	lastCall uint32 // the last stream counted a call
	overflow bool
}

func (f *frameCounter) Read(p []byte) (int, error) {
	n, err := f.Conn.Read(p)
	b := p[:n]
	for len(b) > 0 && !f.overflow {
		switch {
		case f.preface > 0:
			k := min(f.preface, len(b))
			f.preface -= k
			b = b[k:]
		case f.skip > 0:
			k := min(int(f.skip), len(b))
			f.skip -= uint32(k)
			b = b[k:]
		default:
			k := copy(f.hdr[f.have:], b)
			f.have += k
			b = b[k:]
			if f.have < len(f.hdr) {
				continue
			}
			f.have = 0
			f.skip = uint32(f.hdr[0])<<16 | uint32(f.hdr[1])<<8 | uint32(f.hdr[2])
			id := binary.BigEndian.Uint32(f.hdr[5:]) &^ (1 << 31)
			if !f.frame(f.hdr[3], f.skip, id) {
				f.overflow = true
			}
		}
	}
	if f.overflow {
		f.c.shut()
		return 0, net.ErrClosed
	}
	return n, err
}

// frame counts a frame of type t and length n on stream id, and reports whether the connection is still within its bounds.
// A stream's first DATA frame that holds a message (its 5-byte prefix at
// least) makes the stream a call, and its later ones (a stream's further
// messages) count as calls' work: the client sent what a call sends,
// whether or not it waited for the answer (a deadline shorter than the
// server's answer is a client's mistake, not an attack, and costs what a
// call does). Every other frame that is not HEADERS is a control frame:
// acknowledgements, empty DATA and CONTINUATION frames too, which cost
// parsing as any other (an empty CONTINUATION flood, CVE-2024-27316).
func (f *frameCounter) frame(t byte, n, id uint32) bool {
	switch {
	case t == frameHeaders:
		return f.c.opened()
	case t == frameData && n >= 5 && id > f.lastCall:
		f.lastCall = id
		f.c.calls.Add(1)
		return true
	case t == frameData && n >= 5:
		// A later message of a streaming call (a quota stream's
		// reports): work of a call, which earns control frames as a
		// call does, but not a call of its own.
		f.messages++
		return true
	case t == frameGoAway:
		return true
	}
	f.control++
	return f.control <= MaxControlFrames+ControlFramesPerCall*(f.c.calls.Load()+f.messages)
}

// countingCreds are the transport credentials of a Server: its own (TLS,
// or none), with each connection's frames counted once they are
// plaintext.
type countingCreds struct {
	credentials.TransportCredentials
}

// ServerHandshake implements credentials.TransportCredentials.
func (cc countingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := cc.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	c, ok := raw.(*countedConn)
	if !ok {
		return conn, info, nil
	}
	return &frameCounter{Conn: conn, c: c, preface: len(clientPreface)}, info, nil
}

// Clone implements credentials.TransportCredentials.
func (cc countingCreds) Clone() credentials.TransportCredentials {
	return countingCreds{cc.TransportCredentials.Clone()}
}

// TLS returns the server option that serves a Server's connections with
// TLS configured by c (mutual TLS when c asks for client certificates).
// Pass it to NewServer rather than grpc.Creds, which would leave the
// connections' frames uncounted.
func TLS(c *tls.Config) grpc.ServerOption {
	return grpc.Creds(countingCreds{credentials.NewTLS(c)})
}

// plaintext is the option NewServer starts from: no TLS, frames counted.
func plaintext() grpc.ServerOption { return grpc.Creds(countingCreds{insecure.NewCredentials()}) }
