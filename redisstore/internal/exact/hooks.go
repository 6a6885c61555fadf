package exact

// What the tests of the Redis store reach inside its exact path.

// HoldBatches makes the decisions s is asked for outside Cluster queue
// until release, which sends the queue as one batch (up to maxBatch) and
// returns once it is answered.
func HoldBatches(s *Room) (release func()) {
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
func Queued(s *Room) int {
	b := s.batcher("")
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// SetMaxRefusals sets the bound of the refusals a store remembers, and
// returns a function that restores it.
func SetMaxRefusals(n int) func() {
	old := maxRefusals
	maxRefusals = n
	return func() { maxRefusals = old }
}

// Refusals returns how many refusals s remembers.
func Refusals(s *Room) int {
	s.refused.mu.RLock()
	defer s.refused.mu.RUnlock()
	return len(s.refused.m)
}
