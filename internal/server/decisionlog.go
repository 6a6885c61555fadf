package server

import (
	"bufio"
	"encoding/json"
	"io"
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
type decisionLog struct {
	ch      chan decisionEntry
	dropped prometheus.Counter
	done    sync.WaitGroup
	once    sync.Once
}

func newDecisionLog(w io.Writer, dropped prometheus.Counter) *decisionLog {
	l := &decisionLog{ch: make(chan decisionEntry, 8192), dropped: dropped}
	l.done.Add(1)
	go l.run(w)
	return l
}

func (l *decisionLog) run(w io.Writer) {
	defer l.done.Done()
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	for e := range l.ch {
		_ = enc.Encode(e)
		if len(l.ch) == 0 {
			_ = bw.Flush()
		}
	}
	_ = bw.Flush()
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
