package usage

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/admitdev/admit/internal/syncfile"
)

// File is a Memory kept in a file too, for the memory store: a
// journal of the records added, one JSON record a line, appended and
// synced by each AddUsage before its records count, read back by
// OpenFile and compacted then and whenever it holds more than twice
// the records it adds up to. A crash loses nothing AddUsage returned; a
// line it cut short is skipped.
type File struct {
	*Memory
	path string

	mu    sync.Mutex // serializes the journal's writes
	f     *os.File
	lines int // in the journal
}

var _ Store = (*File)(nil)

// OpenFile returns the File of the journal at path (made if
// missing), with its records loaded, keeping keep ended periods and at
// most max records as NewMemory does.
func OpenFile(path string, keep, max int) (*File, error) {
	u := &File{Memory: NewMemory(keep, max), path: path}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("policy: usage records: %w", err)
	}
	if err := u.load(); err != nil {
		return nil, err
	}
	if err := u.compact(); err != nil {
		return nil, err
	}
	return u, nil
}

// load adds up the journal's records.
func (u *File) load() error {
	f, err := os.Open(u.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("policy: usage records: %w", err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 64<<10)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 && line[len(line)-1] == '\n' {
			var rec Record
			if jerr := json.Unmarshal(line, &rec); jerr != nil {
				return fmt.Errorf("policy: %s is not a usage journal: %w", u.path, jerr)
			}
			merge(u.recs, rec)
		}
		if errors.Is(err, io.EOF) {
			break // a last line without its newline is one a crash cut short
		}
		if err != nil {
			return fmt.Errorf("policy: usage records: %w", err)
		}
	}
	u.Memory.mu.Lock()
	u.trim()
	u.Memory.mu.Unlock()
	return nil
}

// compact rewrites the journal as one line per record held (a temporary
// file, synced and renamed over it), and opens it for appending.
func (u *File) compact() error {
	u.Memory.mu.Lock()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, r := range u.recs {
		_ = enc.Encode(r)
	}
	n := len(u.recs)
	u.Memory.mu.Unlock()
	if err := syncfile.Write(u.path, buf.Bytes(), (*os.File).Write); err != nil {
		return fmt.Errorf("policy: usage records: %w", err)
	}
	f, err := os.OpenFile(u.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("policy: usage records: %w", err)
	}
	if u.f != nil {
		u.f.Close()
	}
	u.f, u.lines = f, n
	return nil
}

// AddUsage implements Store: the records count once they are in the
// journal, synced; if they cannot be written, AddUsage fails and nothing
// is added.
func (u *File) AddUsage(ctx context.Context, recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for i := range recs {
		_ = enc.Encode(&recs[i])
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if err := u.append(buf.Bytes()); err != nil {
		return err
	}
	if err := u.Memory.AddUsage(ctx, recs); err != nil {
		return err
	}
	u.lines += len(recs)
	u.Memory.mu.Lock()
	held := len(u.recs)
	u.Memory.mu.Unlock()
	if u.lines > 2*held+100 {
		// A failed compaction leaves the journal as it was: still whole.
		_ = u.compact()
	}
	return nil
}

// append writes b to the journal and syncs it; a write that fails leaves
// the journal as it was before (cut back), so a retry adds it once.
func (u *File) append(b []byte) error {
	st, err := u.f.Stat()
	if err != nil {
		return fmt.Errorf("policy: usage records: %w", err)
	}
	if _, err := u.f.Write(b); err != nil {
		_ = u.f.Truncate(st.Size())
		return fmt.Errorf("policy: usage records: %w", err)
	}
	if err := u.f.Sync(); err != nil {
		_ = u.f.Truncate(st.Size())
		return fmt.Errorf("policy: usage records: %w", err)
	}
	return nil
}

// Close closes the journal.
func (u *File) Close() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.f == nil {
		return nil
	}
	err := u.f.Close()
	u.f = nil
	return err
}
