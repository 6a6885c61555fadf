package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/syncfile"
)

// MemoryBans keeps bans in this process, and in a file when Path is set:
// the memory store's, one server's. The file is a journal of JSON lines,
// read at the first call; each change is appended and synced before it
// takes effect (a change that cannot be written is refused, and not made),
// and the journal is rewritten whole once it holds more than twice the
// lines of what is in force.
//
// A MemoryBans is safe for concurrent use. The zero value keeps nothing
// across restarts.
type MemoryBans struct {
	Path string

	mu      sync.Mutex
	bans    map[string]Ban
	history map[string]BanStrikes
	loaded  bool
	f       *os.File
	lines   int
}

var _ BanStore = (*MemoryBans)(nil)

// journalLine is one change in the journal: a ban saved, a ban removed
// (Remove, its id), or an identifier's history set (Key and History) or
// forgotten (Key alone).
type journalLine struct {
	Ban     *Ban        `json:"ban,omitempty"`
	Remove  string      `json:"remove,omitempty"`
	Key     string      `json:"key,omitempty"`
	History *BanStrikes `json:"history,omitempty"`
}

// load reads the journal once; the caller holds m.mu.
func (m *MemoryBans) load() error {
	if m.loaded {
		return nil
	}
	m.bans, m.history = map[string]Ban{}, map[string]BanStrikes{}
	if m.Path != "" {
		f, err := os.OpenFile(m.Path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return admit.Errorf(admit.CodeUnavailable, "bans: %v", err)
		}
		data, err := io.ReadAll(f)
		if err != nil {
			f.Close()
			return admit.Errorf(admit.CodeUnavailable, "bans: %v", err)
		}
		n, good := 0, 0
		for rest := data; len(rest) > 0; n++ {
			line, next, whole := bytes.Cut(rest, []byte("\n"))
			if !whole {
				// A change cut short by a crash (its write, or the
				// machine): never acknowledged, so dropped.
				if err := f.Truncate(int64(good)); err != nil {
					f.Close()
					return admit.Errorf(admit.CodeUnavailable, "bans: %s: dropping a torn last line: %v", m.Path, err)
				}
				break
			}
			var l journalLine
			if err := json.Unmarshal(line, &l); err != nil {
				f.Close()
				return fmt.Errorf("bans: %s, line %d: %w", m.Path, n+1, err)
			}
			m.apply(l)
			good += len(line) + 1
			rest = next
		}
		m.f, m.lines = f, n
	}
	m.loaded = true
	return nil
}

// apply applies a journal line; the caller holds m.mu.
func (m *MemoryBans) apply(l journalLine) {
	switch {
	case l.Ban != nil:
		m.bans[l.Ban.ID] = *l.Ban
	case l.Remove != "":
		delete(m.bans, l.Remove)
	case l.Key != "" && l.History == nil:
		delete(m.history, l.Key)
	case l.Key != "":
		m.history[l.Key] = *l.History
	}
}

// change journals the lines f returns (f reads the state, and changes
// nothing) and then applies them; the caller holds m.mu.
func (m *MemoryBans) change(f func() ([]journalLine, error)) error {
	if err := m.load(); err != nil {
		return err
	}
	lines, err := f()
	if err != nil || len(lines) == 0 {
		return err
	}
	if m.f != nil {
		if err := m.journal(lines); err != nil {
			return admit.Errorf(admit.CodeUnavailable, "bans: saving %s: %v", m.Path, err)
		}
	}
	for _, l := range lines {
		m.apply(l)
	}
	return nil
}

// inForce returns the ban of id in force at now; the caller holds m.mu.
func (m *MemoryBans) inForce(id string, now time.Time) (Ban, bool) {
	b, ok := m.bans[id]
	return b, ok && b.Expires.After(now)
}

// room returns the lines that make room for one more ban at now: the
// expired ones removed, and for an escalation's ban (escalated) past
// MaxEscalatedBans of theirs, the one of theirs that would end soonest
// (evicted reports it). Past MaxBans bans in force it fails with
// ErrBansFull. The caller holds m.mu.
func (m *MemoryBans) room(now time.Time, escalated bool) (lines []journalLine, evicted bool, err error) {
	if len(m.bans) < MaxEscalatedBans {
		return nil, false, nil // within both bounds, expired bans or not
	}
	live, esc := 0, 0
	var soonest *Ban
	for id, b := range m.bans {
		switch {
		case !b.Expires.After(now):
			lines = append(lines, journalLine{Remove: id})
		default:
			live++
			if strings.HasPrefix(b.Source, "escalation:") {
				esc++
				if soonest == nil || b.Expires.Before(soonest.Expires) {
					soonest = &b
				}
			}
		}
	}
	switch {
	case escalated && esc >= MaxEscalatedBans:
		lines = append(lines, journalLine{Remove: soonest.ID})
		return lines, true, nil
	case live >= MaxBans:
		return nil, false, fmt.Errorf("bans: %w (%d)", ErrBansFull, MaxBans)
	}
	return lines, false, nil
}

// journal appends lines, or rewrites the journal whole, with lines
// applied, when it has grown past twice what it would hold.
func (m *MemoryBans) journal(lines []journalLine) error {
	if live := len(m.bans) + len(m.history); m.lines+len(lines) <= 2*live+100 {
		b, err := encodeLines(lines)
		if err != nil {
			return err
		}
		end, err := m.f.Seek(0, io.SeekEnd)
		if err != nil {
			return err
		}
		if _, err := m.f.Write(b); err != nil {
			_ = m.f.Truncate(end) // a retry appends it once
			return err
		}
		if err := m.f.Sync(); err != nil {
			_ = m.f.Truncate(end)
			return err
		}
		m.lines += len(lines)
		return nil
	}
	// What the state will be, expired bans and forgotten history left
	// out, as lines.
	next := &MemoryBans{bans: maps.Clone(m.bans), history: maps.Clone(m.history)}
	for _, l := range lines {
		next.apply(l)
	}
	now := time.Now()
	var all []journalLine
	for _, b := range next.bans {
		if b.Expires.After(now) {
			all = append(all, journalLine{Ban: &b})
		}
	}
	for k, h := range next.history {
		if !now.After(h.Forget) {
			all = append(all, journalLine{Key: k, History: &h})
		}
	}
	b, err := encodeLines(all)
	if err != nil {
		return err
	}
	if err := syncfile.Write(m.Path, b, (*os.File).Write); err != nil {
		return err
	}
	f, err := os.OpenFile(m.Path, os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	m.f.Close()
	m.f, m.lines = f, len(all)
	return nil
}

func encodeLines(lines []journalLine) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for i := range lines {
		if err := enc.Encode(&lines[i]); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

// Load implements BanStore.
func (m *MemoryBans) Load(_ context.Context, now time.Time) (*BanState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.load(); err != nil {
		return nil, err
	}
	st := &BanState{History: make(map[string]BanStrikes, len(m.history))}
	for _, b := range m.bans {
		if b.Expires.After(now) {
			st.Bans = append(st.Bans, b)
		}
	}
	for k, h := range m.history {
		if !now.After(h.Forget) {
			st.History[k] = h
		}
	}
	return st, nil
}

// Add implements BanStore.
func (m *MemoryBans) Add(_ context.Context, b Ban, now time.Time) (Ban, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	saved, made := b, false
	err := m.change(func() ([]journalLine, error) {
		if in, ok := m.inForce(b.ID, now); ok {
			saved = in
			return nil, nil
		}
		lines, _, err := m.room(now, false)
		if err != nil {
			return nil, err
		}
		made = true
		return append(lines, journalLine{Ban: &b}), nil
	})
	return saved, made, err
}

// Escalate implements BanStore.
func (m *MemoryBans) Escalate(_ context.Context, e Escalated, now time.Time) (Ban, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	saved, made := e.Ban, false
	err := m.change(func() ([]journalLine, error) {
		if in, ok := m.inForce(e.Ban.ID, now); ok {
			saved = in
			return nil, nil
		}
		lines, evicted, err := m.room(now, true)
		if err != nil {
			return nil, err
		}
		if evicted && e.Evicted != nil {
			e.Evicted(lines[len(lines)-1].Remove)
		}
		saved = escalated(e, m.history[e.Key], now)
		if _, ok := m.history[e.Key]; !ok && len(m.history) >= MaxBanHistory {
			lines = append(lines, journalLine{Key: oldest(m.history)})
		}
		h := BanStrikes{Strikes: saved.Strike, Until: saved.Expires, Forget: saved.Expires.Add(e.Forget)}
		made = true
		return append(lines, journalLine{Ban: &saved}, journalLine{Key: e.Key, History: &h}), nil
	})
	return saved, made, err
}

// escalated returns e's ban at now after the strikes h remembers (none
// once forgotten).
func escalated(e Escalated, h BanStrikes, now time.Time) Ban {
	strikes := h.Strikes
	if now.After(h.Forget) {
		strikes = 0
	}
	b := e.Ban
	b.Strike = strikes + 1
	b.Created = now.UTC().Truncate(time.Millisecond)
	b.Expires = now.Add(EscalatedLength(e.Base, e.Max, strikes)).UTC().Truncate(time.Millisecond)
	return b
}

// oldest returns the history entry a full history forgets first: of the
// fewest strikes, the one forgotten soonest, so that a flood of
// identifiers banned once does not wipe a repeat offender's.
func oldest(h map[string]BanStrikes) string {
	var key string
	var least BanStrikes
	for k, v := range h {
		if key == "" || v.Strikes < least.Strikes || v.Strikes == least.Strikes && v.Forget.Before(least.Forget) {
			key, least = k, v
		}
	}
	return key
}

// Remove implements BanStore.
func (m *MemoryBans) Remove(_ context.Context, id string, now time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	found := false
	err := m.change(func() ([]journalLine, error) {
		if _, ok := m.bans[id]; !ok {
			return nil, nil
		}
		_, found = m.inForce(id, now)
		return []journalLine{{Remove: id}}, nil
	})
	return found, err
}

// Watch implements BanStore: one server's bans change only through it.
func (m *MemoryBans) Watch(context.Context, func() error) {}
