package server

import (
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// metricValue reads a counter's or gauge's value.
func metricValue(m prometheus.Metric) float64 {
	var d dto.Metric
	_ = m.Write(&d)
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// smallDisk is a log file on a disk with room bytes left: a write past
// it writes what fits and fails with ENOSPC, as a full disk does.
type smallDisk struct {
	mu   sync.Mutex
	data []byte
	room int
}

func (d *smallDisk) Write(b []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := min(len(b), d.room)
	d.data = append(d.data, b[:n]...)
	d.room -= n
	if n < len(b) {
		return n, syscall.ENOSPC
	}
	return n, nil
}

func (d *smallDisk) Truncate(size int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.room += len(d.data) - int(size)
	d.data = d.data[:size]
	return nil
}

func (d *smallDisk) ReadAt(b []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := copy(b, d.data[off:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

func (d *smallDisk) Stat() (fs.FileInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return diskInfo(len(d.data)), nil
}

func (d *smallDisk) setRoom(n int) {
	d.mu.Lock()
	d.room = n
	d.mu.Unlock()
}

// lines returns the file's lines, failing t unless it ends with a whole
// one and each is a decision entry.
func (d *smallDisk) lines(t *testing.T) int {
	t.Helper()
	return d.count(t, true)
}

// count returns the file's whole lines, failing t unless each is a
// decision entry, and, if whole, unless the file ends with a whole line.
// (A write that did not fit lands in part before it is cut back: a look
// in between finds part of a line.)
func (d *smallDisk) count(t *testing.T, whole bool) int {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	data := d.data
	if len(data) > 0 && data[len(data)-1] != '\n' {
		if whole {
			t.Fatalf("the log ends in part of a line: %q", data[max(0, len(data)-40):])
		}
		data = data[:bytes.LastIndexByte(data, '\n')+1]
	}
	n := 0
	for _, l := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var e decisionEntry
		if err := json.Unmarshal(l, &e); err != nil || e.ClaimID == "" {
			t.Fatalf("a line that is not an entry: %q (%v)", l, err)
		}
		n++
	}
	return n
}

type diskInfo int

func (i diskInfo) Name() string       { return "decisions.log" }
func (i diskInfo) Size() int64        { return int64(i) }
func (i diskInfo) Mode() fs.FileMode  { return 0o600 }
func (i diskInfo) ModTime() time.Time { return time.Time{} }
func (i diskInfo) IsDir() bool        { return false }
func (i diskInfo) Sys() any           { return nil }

// TestDecisionLogFullDisk: on a disk that fills up, the decision log
// counts every line it could not write, never leaves part of one, says
// that it fails (log, gauge), and writes again once there is room (it
// once stopped for good at the first failure, silently, a half line
// last).
func TestDecisionLogFullDisk(t *testing.T) {
	disk := &smallDisk{data: []byte(`{"claim_id":"before","time":"2026-01-01T00:00:00Z","cost":1,"result":"allowed"}` + "\n" + `{"claim_id":"cut sh`), room: 20_000}
	dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped"})
	failing := prometheus.NewGauge(prometheus.GaugeOpts{Name: "failing"})
	var logs bytes.Buffer
	var clockMu sync.Mutex
	now := time.Unix(1_800_000_000, 0)
	l := &decisionLog{ch: make(chan decisionEntry, 8192), dropped: dropped, failing: failing,
		log: slog.New(slog.NewTextHandler(&logs, nil)),
		now: func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }}
	l.done.Add(1)
	go l.run(disk, logEnd(disk))
	// send sends n entries and waits until the log has written or dropped
	// all it was sent.
	sent := 0
	send := func(n int) {
		for range n {
			sent++
			l.ch <- decisionEntry{ClaimID: "c" + time.Duration(sent).String(), Time: now, Tenant: "acme", Cost: 1, Result: "allowed"}
		}
		for deadline := time.Now().Add(10 * time.Second); disk.count(t, false)-1+int(metricValue(dropped)) < sent; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("of %d sent, %d written and %v dropped", sent, disk.lines(t)-1, metricValue(dropped))
			}
		}
	}
	if got := disk.lines(t); got != 1 {
		t.Fatalf("the line a crash cut short was not cut off: %d whole lines", got)
	}
	send(300) // about 100 lines fit
	written := disk.lines(t) - 1
	if written == 0 || written == 300 || float64(300-written) != metricValue(dropped) {
		t.Fatalf("300 sent to a disk with room for some: %d written, %v counted dropped", written, metricValue(dropped))
	}
	if metricValue(failing) != 1 || !bytes.Contains(logs.Bytes(), []byte("the decision log cannot be written")) || !bytes.Contains(logs.Bytes(), []byte("no space left")) {
		t.Errorf("a full disk: failing gauge %v, logs %q", metricValue(failing), logs.String())
	}
	// Room again: within the retry, still dropped; after it, written.
	disk.setRoom(1 << 20)
	send(10)
	if got := disk.lines(t) - 1; got != written {
		t.Errorf("within a second of the failure: %d lines written, want the %d before (lines dropped until the retry)", got, written)
	}
	clockMu.Lock()
	now = now.Add(decisionLogRetry)
	clockMu.Unlock()
	send(100)
	l.close()
	if got := disk.lines(t) - 1; got != written+100 {
		t.Errorf("once there is room and the retry is due: %d lines, want %d", got, written+100)
	}
	if metricValue(failing) != 0 || !bytes.Contains(logs.Bytes(), []byte("the decision log is written again")) {
		t.Errorf("after the disk has room: failing gauge %v, logs %q", metricValue(failing), logs.String())
	}
	if float64(sent-(disk.lines(t)-1)) != metricValue(dropped) {
		t.Errorf("%d sent, %d written, %v counted dropped", sent, disk.lines(t)-1, metricValue(dropped))
	}
}
