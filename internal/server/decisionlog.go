package server

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// decisionEntry is one line of the decision log.
type decisionEntry struct {
	ClaimID string    `json:"claim_id"`
	Time    time.Time `json:"time"`
	Tenant  string    `json:"tenant,omitempty"`
	User    string    `json:"user,omitempty"`
	Action  string    `json:"action,omitempty"`
	Cost    int64     `json:"cost"`
	Result  string    `json:"result"`
	// Rule is the refusing rule, or for an admitted request the rule
	// closest to refusing it.
	Rule   string `json:"rule,omitempty"`
	DryRun bool   `json:"dry_run,omitempty"`
}

// decisionLog writes decision entries as JSON lines from one goroutine, so
// that a slow log never holds up a decision: entries go through a bounded
// channel, and when it is full they are dropped and counted.
//
// Lines are written in batches of whole lines, one write each. A write
// that fails (a full disk) loses its batch, counted as dropped, and never
// leaves part of a line: a file is cut back to the end of its last whole
// line. The first failure is logged and the failing gauge set; lines are
// then dropped, counted, until a retry (at most every retryEvery) writes
// again, which is logged too.
type decisionLog struct {
	ch      chan decisionEntry
	dropped prometheus.Counter
	failing prometheus.Gauge
	log     *slog.Logger
	done    sync.WaitGroup
	once    sync.Once
	// now is the clock the retries are timed by; tests stop it.
	now func() time.Time
}

// decisionLogRetry is how long a failing decision log drops lines before
// it tries to write again.
const decisionLogRetry = time.Second

// truncater is a log that can be cut back to a length: an *os.File.
type truncater interface {
	Truncate(size int64) error
	Stat() (os.FileInfo, error)
}

// wholeLines cuts a log file of size bytes back to the end of its last
// whole line, if it ends in part of one (a crash mid-write), and returns
// its length then. A file it cannot read or cut gets a newline, so that
// the next line starts on its own.
func wholeLines(t truncater, size int64) int64 {
	if size == 0 {
		return 0
	}
	r, ok := t.(io.ReaderAt)
	tail := make([]byte, min(size, 64<<10))
	if ok {
		if _, err := r.ReadAt(tail, size-int64(len(tail))); err != nil {
			ok = false
		}
	}
	if ok && tail[len(tail)-1] == '\n' {
		return size
	}
	if i := bytes.LastIndexByte(tail, '\n'); ok && (i >= 0 || int64(len(tail)) == size) {
		cut := size - int64(len(tail)) + int64(i+1)
		if t.Truncate(cut) == nil {
			return cut
		}
	}
	if w, isW := t.(io.Writer); isW {
		if n, err := w.Write([]byte("\n")); err == nil {
			return size + int64(n)
		}
	}
	return -1
}

func newDecisionLog(w io.Writer, dropped prometheus.Counter, failing prometheus.Gauge, log *slog.Logger) *decisionLog {
	l := &decisionLog{ch: make(chan decisionEntry, 8192), dropped: dropped, failing: failing, log: log, now: time.Now}
	l.done.Add(1)
	go l.run(w, logEnd(w))
	return l
}

// logEnd returns where w's last whole line ends, cutting off a line a
// crash left in part: -1 when w is not a regular file.
func logEnd(w io.Writer) int64 {
	if t, ok := w.(truncater); ok {
		if st, err := t.Stat(); err == nil && st.Mode().IsRegular() {
			return wholeLines(t, st.Size())
		}
	}
	return -1
}

// run writes the log's entries to w until the log is closed. end is where
// w's last whole line ends (-1: w is not a file, or it is unknown): where
// a failed write is cut back to.
func (l *decisionLog) run(w io.Writer, end int64) {
	defer l.done.Done()
	t, _ := w.(truncater)
	var (
		buf      bytes.Buffer
		lines    int
		since    time.Time // the first failure of a spell; zero while writes succeed
		failedAt time.Time // the last failed write
		failures int64     // lines dropped since
	)
	enc := json.NewEncoder(&buf)
	flush := func() {
		if lines == 0 {
			return
		}
		defer func() { buf.Reset(); lines = 0 }()
		if !since.IsZero() && l.now().Sub(failedAt) < decisionLogRetry {
			l.dropped.Add(float64(lines))
			failures += int64(lines)
			return
		}
		n, err := w.Write(buf.Bytes())
		if err == nil && n == buf.Len() {
			if end >= 0 {
				end += int64(n)
			}
			if !since.IsZero() {
				l.log.Info("the decision log is written again", "dropped_meanwhile", failures, "failing_for", l.now().Sub(since).Round(time.Millisecond).String())
				since, failedAt, failures = time.Time{}, time.Time{}, 0
				l.failing.Set(0)
			}
			return
		}
		if err == nil {
			err = io.ErrShortWrite
		}
		lost := lines
		if n > 0 {
			// Part of the batch landed: its whole lines are kept, and
			// the part of a line after them cut off, so that the file
			// ends with a whole line. If that cannot be done, the next
			// line starts on a line of its own.
			whole := bytes.LastIndexByte(buf.Bytes()[:n], '\n') + 1
			lost -= bytes.Count(buf.Bytes()[:whole], []byte{'\n'})
			switch {
			case whole == n:
				if end >= 0 {
					end += int64(n)
				}
			case end >= 0 && t != nil && t.Truncate(end+int64(whole)) == nil:
				end += int64(whole)
			default:
				if m, werr := w.Write([]byte("\n")); werr == nil && end >= 0 {
					end += int64(n + m)
				} else {
					end = -1 // unknown: no more cutting back
				}
			}
		}
		l.dropped.Add(float64(lost))
		failures += int64(lost)
		failedAt = l.now()
		if since.IsZero() {
			since = failedAt
			l.log.Error("the decision log cannot be written; dropping its lines (counted in admit_decision_log_dropped_total) and trying again every second", "err", err)
			l.failing.Set(1)
		}
	}
	for e := range l.ch {
		_ = enc.Encode(e)
		lines++
		if len(l.ch) == 0 || buf.Len() >= 64<<10 {
			flush()
		}
	}
	flush()
}

func (l *decisionLog) add(c *call, now time.Time) {
	e := decisionEntry{
		ClaimID: c.claim, Time: now.UTC(), Tenant: c.req.Tenant, User: c.req.User, Action: c.req.Action,
		Cost: c.req.Cost, Result: "allowed", DryRun: c.req.DryRun,
	}
	if !c.d.Allowed {
		e.Result, e.Rule = "refused", c.d.DeniedBy
	} else {
		best := int64(-1)
		for i := range c.d.Results {
			if r := &c.d.Results[i]; !r.Shadow && (best < 0 || r.Remaining < best) {
				best, e.Rule = r.Remaining, r.Rule
			}
		}
	}
	select {
	case l.ch <- e:
	default:
		l.dropped.Inc()
	}
}

// close writes what is queued and stops the writer.
func (l *decisionLog) close() {
	l.once.Do(func() {
		close(l.ch)
		l.done.Wait()
	})
}
