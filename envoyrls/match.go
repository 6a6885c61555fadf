package envoyrls

// Entry is one key/value pair of a request descriptor.
type Entry struct{ Key, Value string }

// Match is the limit a descriptor matched, if any. Shared has bit i set
// when entry i was matched by a share_threshold wildcard: its counter is
// the wildcard's, whatever the value.
type Match struct {
	Limit  *Limit
	Shared uint64
	// Patterns holds, for each shared entry, the wildcard value ("files*").
	Patterns []string
}

// Lookup finds the limit of a descriptor in domain, as envoyproxy/ratelimit
// does: at each level the entry's key and value are tried, then the key's
// wildcard values in file order, then the key alone; the limit of the node
// reached by the last entry applies, and a descriptor with more entries
// than the configuration has levels matches nothing. Lookup returns a
// Match without a Limit when nothing applies.
func (c *Config) Lookup(domain string, entries []Entry) Match {
	var m Match
	if c == nil {
		return m
	}
	lv := c.domains[domain]
	for i, e := range entries {
		if lv == nil {
			break
		}
		n := lv.exact[[2]string{e.Key, e.Value}]
		if n == nil {
			for _, w := range lv.wildcards {
				if w.key == e.Key && matches(w.pattern, e.Value) {
					n = w.n
					break
				}
			}
			if n != nil && n.shared && i < 64 {
				m.Shared |= 1 << i
				m.Patterns = append(m.Patterns, n.pattern)
			}
		}
		if n == nil {
			n = lv.byKey[e.Key]
		}
		if n == nil {
			break
		}
		if i == len(entries)-1 {
			m.Limit = n.limit
		}
		lv = n.next
	}
	if m.Limit == nil {
		m.Shared, m.Patterns = 0, m.Patterns[:0]
	}
	return m
}
