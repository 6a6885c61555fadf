package llm

import (
	"bytes"
	"io"
	"sync"
	"time"
)

// Bounds on what a metered response keeps: a stream event up to
// maxEvent bytes is read whole; a longer one, and a JSON body, stream
// through a usageScan, which keeps only their usage.
const (
	maxEvent = 256 << 10
	tailSize = 64 << 10 // the read buffer a body keeps between reads
)

// meteredBody passes a response body through unchanged (but for the
// usage chunk Admit asked for on a client's behalf) while its meter reads
// the usage. done is called once: at the end of the body, or when it is
// closed before its end (the client left), with whether it ended.
type meteredBody struct {
	src    io.ReadCloser
	m      meter
	stream bool
	// dropUsageChunk removes OpenAI's usage-only chunk, which the client
	// did not ask for.
	dropUsageChunk bool
	done           func(m *meter, ended bool)
	once           sync.Once
	// drain, when positive, keeps reading a body closed before its end
	// for up to that long, for the provider's own report; cancel then
	// stops the call.
	drain  time.Duration
	cancel func()
	// maxOutput, when positive, is the most output tokens the call was
	// sent with, all its answers together; generated counts the stream's
	// events that carry generated text, each at least one token, and the
	// stream is cut once they pass maxOutput: the upstream ignored it.
	maxOutput, generated int64

	out  []byte // processed; returned from off on
	off  int
	line []byte    // the stream line being gathered
	long bool      // the current line passed maxEvent: it streams through
	scan usageScan // the usage of a long line or a JSON body
	skip bool      // drop the blank line that ends a dropped event
	cr   bool      // the last read ended with a CR: an LF next is its CRLF
	err  error
}

func newMeteredBody(src io.ReadCloser, api API, stream, dropUsageChunk bool, done func(*meter, bool)) *meteredBody {
	return &meteredBody{src: src, m: meter{api: api}, stream: stream, dropUsageChunk: dropUsageChunk, done: done}
}

// readBuffers are the bodies' read buffers, shared: a body holds one only
// while it reads.
var readBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (b *meteredBody) Read(p []byte) (int, error) {
	for b.off == len(b.out) {
		if b.err != nil {
			return 0, b.err
		}
		buf := readBuffers.Get().(*[]byte)
		n, err := b.src.Read(*buf)
		if n > 0 {
			b.process((*buf)[:n])
		}
		readBuffers.Put(buf)
		if err != nil {
			b.finish(err)
		}
	}
	n := copy(p, b.out[b.off:])
	b.off += n
	if b.off == len(b.out) {
		// Drained: the buffer is written again from its start, so that a
		// stream reuses one buffer; an unusually large one is let go.
		b.out, b.off = b.out[:0], 0
		if cap(b.out) > 4*tailSize {
			b.out = nil
		}
	}
	return n, nil
}

// finish ends the body with err (io.EOF at its end).
func (b *meteredBody) finish(err error) {
	if !b.stream {
		b.observeScan()
	} else if len(b.line) > 0 || b.long {
		b.endLine(nil) // a last line without its newline
	}
	b.err = err
	b.once.Do(func() { b.done(&b.m, err == io.EOF) })
}

// process meters p and queues what the client gets of it.
func (b *meteredBody) process(p []byte) {
	if !b.stream {
		b.out = append(b.out, p...)
		b.scan.write(p)
		return
	}
	if b.cr && len(p) > 0 && p[0] == '\n' {
		// The LF of a CRLF split between reads: the line it ends has
		// ended.
		b.out = append(b.out, '\n')
		p = p[1:]
	}
	b.cr = false
	for len(p) > 0 {
		// A line ends with LF, CR or CRLF (server-sent events allow
		// each): a stream of CR-only lines streams too.
		i := bytes.IndexAny(p, "\r\n")
		chunk := p
		if i >= 0 {
			chunk = p[:i+1]
			if p[i] == '\r' {
				switch {
				case i+1 < len(p) && p[i+1] == '\n':
					chunk = p[:i+2]
				case i+1 == len(p):
					b.cr = true
				}
			}
		}
		p = p[len(chunk):]
		switch {
		case b.long:
			b.out = append(b.out, chunk...)
			b.scan.write(chunk)
		case len(b.line)+len(chunk) > maxEvent:
			// Too long to hold: it streams through, and its usage is
			// found as it passes.
			b.out = append(append(b.out, b.line...), chunk...)
			b.scan.reset()
			b.scan.write(b.line)
			b.scan.write(chunk)
			b.line, b.long = b.line[:0], true
		default:
			b.line = append(b.line, chunk...)
		}
		if i >= 0 {
			b.endLine(chunk)
		}
	}
	if cap(b.line) > 4*tailSize && len(b.line) == 0 {
		b.line = nil // one long event does not keep its buffer
	}
}

// endLine handles a complete line: the gathered one, or the end of a long
// one.
func (b *meteredBody) endLine([]byte) {
	if b.long {
		b.long = false
		b.observeScan()
		b.scan.reset()
		return
	}
	line := b.line
	b.line = b.line[:0]
	trimmed := bytes.TrimRight(line, "\r\n")
	if len(trimmed) == 0 && b.skip {
		b.skip = false
		return
	}
	b.skip = false
	if data, ok := bytes.CutPrefix(trimmed, []byte("data:")); ok {
		data = bytes.TrimSpace(data)
		if len(data) > 0 && data[0] == '{' && b.m.observe(data) && b.dropUsageChunk {
			b.skip = true
			return
		}
		if b.maxOutput > 0 && generatesText(b.m.api, data) {
			// Gemini's thoughts stream as text too, and may not count
			// against its maximum: its running totals say. An event
			// without text (a usage report) is never cut: what it
			// reports is charged.
			if b.m.api.Provider() != Gemini {
				b.generated++
			}
			if max(b.generated, b.m.runningOutput()) > b.maxOutput {
				b.cutAtMax()
				return
			}
		}
	}
	b.out = append(b.out, line...)
}

// generatedKeys are, by API, the keys of a stream event's generated
// text, as its delta events carry it: a chat completion's content and
// tool arguments, a completion's text, the Responses API's deltas (its
// .done events repeat the text whole, and are not counted), Anthropic's
// text, thinking and tool input, Gemini's parts (whose events are not
// counted: its thoughts stream as text too, and its running totals say
// how much it made).
var generatedKeys = map[API][][]byte{
	ChatCompletions:       {[]byte(`"content"`), []byte(`"arguments"`)},
	Completions:           {[]byte(`"text"`)},
	Responses:             {[]byte(`"delta"`)},
	Messages:              {[]byte(`"text"`), []byte(`"thinking"`), []byte(`"partial_json"`)},
	GenerateContent:       {[]byte(`"text"`)},
	StreamGenerateContent: {[]byte(`"text"`)},
}

// generatesText reports whether a stream event of api carries generated
// text: a key of generatedKeys whose value is a non-empty string, with
// any space around its colon. Such a key inside a string is escaped
// (\"text\") and does not match.
func generatesText(api API, data []byte) bool {
	for _, k := range generatedKeys[api] {
		for rest := data; ; {
			i := bytes.Index(rest, k)
			if i < 0 {
				break
			}
			rest = rest[i+len(k):]
			if v := skipColon(rest); v >= 0 && rest[v] == '"' && v+1 < len(rest) && rest[v+1] != '"' {
				return true
			}
		}
	}
	return false
}

// cutAtMax ends a stream that passed the maximum output it was sent: the
// client's answer ends here, the upstream call is cancelled, and the call
// is settled as cut (its reservation, the maximum, charged).
func (b *meteredBody) cutAtMax() {
	b.err = io.EOF
	b.once.Do(func() { b.done(&b.m, false) })
	if b.cancel != nil {
		b.cancel()
	}
}

// observeScan meters the usage the scan found, if any.
func (b *meteredBody) observeScan() {
	if ev, ok := b.scan.usage(); ok {
		b.m.observeEvent(&ev)
	}
}

// Close closes the body. Before its end the client left: the meter
// reports what was relayed, or, with drain set, what the provider reports
// by the time drain has passed.
func (b *meteredBody) Close() error {
	if b.drain > 0 && b.err == nil {
		go func() {
			stop := time.AfterFunc(b.drain, b.cancel)
			defer stop.Stop()
			_, _ = io.Copy(io.Discard, b) // ends with finish: done is called
			_ = b.src.Close()
			b.cancel()
		}()
		return nil
	}
	err := b.src.Close()
	b.once.Do(func() { b.done(&b.m, false) })
	if b.cancel != nil {
		b.cancel()
	}
	return err
}
