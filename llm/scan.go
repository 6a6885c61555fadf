package llm

import (
	"bytes"
	"encoding/json"
)

// usageScan finds the usage object of a JSON document read a piece at a
// time, by its place in the document's structure: a response's "usage"
// (OpenAI, Anthropic), "response"."usage" (OpenAI's Responses events),
// "message"."usage" (Anthropic's message_start) or "usageMetadata"
// (Gemini), also in each element of a document that is an array
// (Gemini's stream without server-sent events). A key of the same name
// anywhere else — in a tool's input the model wrote, in a string — is
// not usage. Its memory is bounded whatever the document's size: the
// nesting it tracks and the usage object it keeps.
type usageScan struct {
	stack    []scanFrame
	inString bool
	escaped  bool
	// key gathers the current object key (its first maxScanKey bytes).
	key    []byte
	inKey  bool
	keyLen int
	// capture holds the usage object being read, from its '{'; depth is
	// the stack's depth at which it ends.
	capturing bool
	capture   []byte
	capDepth  int
	// last is the last complete usage object found, and its key.
	last    []byte
	lastKey string
	// tier gathers the string value of the document's "service_tier"
	// (or its "response"'s) while inTier; lastTier is the last one read.
	tier     []byte
	inTier   bool
	lastTier string
	// finished says a candidate's finishReason was read (Gemini).
	finished bool
	broken   bool // deeper than maxScanDepth or a usage too large: stop
}

// scanFrame is an open object or array.
type scanFrame struct {
	object    bool
	expectKey bool
	key       string // the key of the value being read, if one of interest
}

// Bounds of what a usageScan tracks.
const (
	maxScanDepth = 1024
	maxScanKey   = 16
	maxUsageSize = 16 << 10
)

// usageKeys are the keys whose names matter to usageScan.
var usageKeys = [...]string{"usage", "usageMetadata", "response", "message", "service_tier", "candidates", "finishReason"}

// maxTier bounds the service tier's name a usageScan keeps.
const maxTier = 32

func (s *usageScan) reset() {
	*s = usageScan{stack: s.stack[:0], key: s.key[:0], capture: s.capture[:0], last: s.last[:0], tier: s.tier[:0]}
}

// write reads the next bytes of the document.
func (s *usageScan) write(p []byte) {
	if s.broken {
		return
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if s.capturing {
			s.capture = append(s.capture, c)
			if len(s.capture) > maxUsageSize {
				s.capturing, s.capture = false, s.capture[:0]
			}
		}
		if s.inString {
			switch {
			case s.escaped:
				s.escaped = false
				s.keyByte(c)
				s.tierBytes(p[i : i+1])
			case c == '\\':
				s.escaped = true
				s.keyByte(c)
				s.tierBytes(p[i : i+1])
			case c == '"':
				s.inString = false
				if s.inKey {
					s.inKey = false
					s.endKey()
				}
				if s.inTier {
					s.inTier, s.lastTier = false, string(s.tier)
				}
			default:
				// A run of plain string bytes: skip to its end at once.
				j := i + 1
				for j < len(p) && p[j] != '"' && p[j] != '\\' {
					j++
				}
				s.keyBytes(p[i:j])
				s.tierBytes(p[i:j])
				if s.capturing {
					s.capture = append(s.capture, p[i+1:j]...)
				}
				i = j - 1
			}
			continue
		}
		switch c {
		case '"':
			s.inString = true
			if top := s.top(); top != nil && top.object && top.expectKey {
				s.inKey, s.keyLen, s.key = true, 0, s.key[:0]
			} else if top != nil && top.object && top.key == "service_tier" && s.isTierPath() {
				s.inTier, s.tier = true, s.tier[:0]
			} else if top != nil && top.object && top.key == "finishReason" && s.isFinishPath() {
				s.finished = true
			}
		case '{', '[':
			if len(s.stack) >= maxScanDepth {
				s.broken = true
				return
			}
			if c == '{' && !s.capturing && s.isUsagePath() {
				s.capturing, s.capture, s.capDepth = true, append(s.capture[:0], '{'), len(s.stack)
			}
			s.stack = append(s.stack, scanFrame{object: c == '{', expectKey: c == '{'})
		case '}', ']':
			if len(s.stack) > 0 {
				s.stack = s.stack[:len(s.stack)-1]
			}
			if s.capturing && len(s.stack) == s.capDepth {
				s.capturing = false
				s.last, s.lastKey = append(s.last[:0], s.capture...), s.usageKey()
			}
			if top := s.top(); top != nil && top.object {
				top.key = ""
			}
		case ',':
			if top := s.top(); top != nil && top.object {
				top.expectKey, top.key = true, ""
			}
		}
	}
}

func (s *usageScan) top() *scanFrame {
	if len(s.stack) == 0 {
		return nil
	}
	return &s.stack[len(s.stack)-1]
}

func (s *usageScan) keyByte(c byte) {
	if s.inKey {
		s.keyBytes([]byte{c})
	}
}

func (s *usageScan) keyBytes(b []byte) {
	if !s.inKey {
		return
	}
	s.keyLen += len(b)
	if room := maxScanKey - len(s.key); room > 0 {
		s.key = append(s.key, b[:min(len(b), room)]...)
	}
}

// endKey ends an object key: the frame remembers it when it is one of
// usageKeys.
func (s *usageScan) endKey() {
	top := s.top()
	if top == nil {
		return
	}
	top.expectKey, top.key = false, ""
	if s.keyLen > maxScanKey {
		return
	}
	for _, k := range usageKeys {
		if bytes.Equal(s.key, []byte(k)) {
			top.key = k
		}
	}
}

// isUsagePath reports whether an object starting now is a usage object:
// the value of "usage" or "usageMetadata" in the document (or in an
// element of a document that is an array), or of "usage" in its
// "response" or "message".
func (s *usageScan) isUsagePath() bool {
	st := s.stack
	if len(st) > 0 && !st[0].object { // an array of documents
		st = st[1:]
	}
	switch len(st) {
	case 1:
		return st[0].object && (st[0].key == "usage" || st[0].key == "usageMetadata")
	case 2:
		return st[0].object && (st[0].key == "response" || st[0].key == "message") && st[1].object && st[1].key == "usage"
	}
	return false
}

// isTierPath reports whether a string starting now is the service tier:
// the value of "service_tier" in the document or in its "response".
func (s *usageScan) isTierPath() bool {
	st := s.stack
	if len(st) > 0 && !st[0].object {
		st = st[1:]
	}
	return len(st) == 1 || len(st) == 2 && st[0].object && st[0].key == "response"
}

// isFinishPath reports whether a string starting now is a candidate's
// finishReason: candidates[i].finishReason in the document, or in an
// element of a document that is an array.
func (s *usageScan) isFinishPath() bool {
	st := s.stack
	if len(st) > 0 && !st[0].object {
		st = st[1:]
	}
	return len(st) == 3 && st[0].object && st[0].key == "candidates" && !st[1].object && st[2].object
}

func (s *usageScan) tierBytes(b []byte) {
	if s.inTier && len(s.tier)+len(b) <= maxTier {
		s.tier = append(s.tier, b...)
	}
}

// usageKey names the usage object just read: "usageMetadata" or "usage".
func (s *usageScan) usageKey() string {
	if top := s.top(); top != nil && top.key == "usageMetadata" {
		return "usageMetadata"
	}
	return "usage"
}

// usage returns the last usage object found as an event, false if none.
func (s *usageScan) usage() (ev event, ok bool) {
	ev.ServiceTier = s.lastTier
	if s.finished {
		ev.Candidates = append(ev.Candidates, struct {
			FinishReason string `json:"finishReason"`
		}{"STOP"})
	}
	if len(s.last) == 0 {
		return ev, false
	}
	if s.lastKey == "usageMetadata" {
		ev.UsageMetadata = new(geminiUsage)
		return ev, json.Unmarshal(s.last, ev.UsageMetadata) == nil
	}
	ev.Usage = new(usageJSON)
	return ev, json.Unmarshal(s.last, ev.Usage) == nil
}
