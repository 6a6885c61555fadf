package limitador

import (
	"context"
	"time"
)

// A SharedIndex keeps which counters exist where every server sharing a
// store can read them, so that GET /counters/{namespace} on any server
// lists the counters all of them charged. Package
// limitador/rediscounters keeps one in a Redis store's deployment.
type SharedIndex interface {
	// Add notes counters of namespace ns, each until its end.
	Add(ctx context.Context, ns string, entries []IndexEntry) error
	// List returns at most max counters of ns whose ends are after now.
	List(ctx context.Context, ns string, now time.Time, max int) ([]IndexEntry, error)
}

// IndexEntry is one counter: its limit's identity, its variables' values
// (in the limit's order) and when its window ends as last seen.
type IndexEntry struct {
	Identity string
	Values   []string
	End      time.Time

	key string // its store key, while it waits to be written
}

// sharedQueue bounds the batches waiting to be written to the shared
// index; more are dropped (a later hit of theirs adds them again).
const sharedQueue = 4096

// sharedBatch bounds the counters of one write to the shared index.
const sharedBatch = 512

// indexed is a batch of entries of one namespace for the shared index.
type indexed struct {
	ns      string
	entries []IndexEntry
}

// share writes the entries queued for the shared index until ctx ends.
func (l *Limiter) share(ctx context.Context, idx SharedIndex) {
	defer close(l.shareDone)
	for {
		select {
		case <-ctx.Done():
			return
		case b := <-l.shareQ:
			// What else waits is written with it, a write a namespace:
			// under load the queue drains in few calls.
			byNS := map[string][]IndexEntry{b.ns: b.entries}
			n := len(b.entries)
		drain:
			for n < sharedBatch {
				select {
				case b := <-l.shareQ:
					byNS[b.ns] = append(byNS[b.ns], b.entries...)
					n += len(b.entries)
				default:
					break drain
				}
			}
			for ns, entries := range byNS {
				wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				if err := idx.Add(wctx, ns, entries); err != nil {
					for _, e := range entries {
						l.seen.forget(ns, e.key) // sent again at its next hit
					}
				}
				cancel()
			}
		}
	}
}

// Close stops writing to the shared index.
func (l *Limiter) Close() {
	if l.stopShare != nil {
		l.stopShare()
		<-l.shareDone
	}
}
