package redisstore

// HoldBatches makes the decisions s is asked for outside Cluster queue
// until release, which sends the queue as one batch (up to maxBatch) and
// returns once it is answered.
func HoldBatches(s *Store) (release func()) {
	b := s.batcher("")
	b.mu.Lock()
	b.flying += maxFlight
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		b.flying -= maxFlight - 1
		batch := b.take()
		b.mu.Unlock()
		s.sendAll(b, batch)
	}
}

// Queued returns how many decisions wait in s's queue outside Cluster.
func Queued(s *Store) int {
	b := s.batcher("")
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}
