package exact

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/redisstore/internal/link"
)

// NewID returns a random id of 24 hex digits, for a lease, a reservation
// or a region agent's lock.
func NewID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// A lease or reservation ID is a random part, then the tag of every group
// that holds part of it: "<random>.<tag>[.<tag>]".
func joinID(id string, tags []string) string { return id + "." + strings.Join(tags, ".") }

// splitID parses an ID that joinID made, and refuses any other: a random
// part of 24 lower-case hex digits, then at most maxTags distinct tags,
// of which at most tenantTags of 16 lower-case hex digits (a tenant's
// group) and the last may be "g" (the global group, which decisions put
// last). Renewing, releasing or cancelling costs Redis two commands a
// tag, so an ID that a client made up must not name more tags than a
// decision of this store could have issued (see Store.tags).
func splitID(id string, maxTags, tenantTags int) (string, []string, bool) {
	const rawLen, tagLen = 24, 16
	if len(id) < rawLen+2 || len(id) > rawLen+maxTags*(tagLen+1) || !isHex(id[:rawLen]) || id[rawLen] != '.' {
		return "", nil, false
	}
	tags := strings.Split(id[rawLen+1:], ".")
	if len(tags) > maxTags {
		return "", nil, false
	}
	for i, t := range tags {
		switch {
		case t == "g" && i == len(tags)-1:
		case len(t) == tagLen && isHex(t) && i < tenantTags:
		default:
			return "", nil, false
		}
		if slices.Contains(tags[:i], t) {
			return "", nil, false
		}
	}
	return id[:rawLen], tags, true
}

// isHex reports whether s is lower-case hex digits only, as newID and
// link.Tag write them.
func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// tags returns the most groups a decision of s can hold a lease or a
// reservation in, and the most of them that are tenants' groups rather
// than the global one: one group outside Cluster, where every charge is
// in one; in Cluster a group per tenant the decision names, up to
// Options.TenantsPerDecision, and the global group.
func (s *Room) tags() (all, tenants int) {
	if !s.link.Cluster {
		return 1, 1
	}
	return min(s.tenantTags+1, bounds.MaxCharges), s.tenantTags
}

// checkTenantGroups refuses a decision or reservation whose groups that
// hold its records (those held says) are more tenants' groups than
// Options.TenantsPerDecision allows: its id could not be renewed,
// released or cancelled.
func (s *Room) checkTenantGroups(groups []group, held func(group) bool) error {
	_, most := s.tags()
	if most >= bounds.MaxCharges {
		return nil // as many groups as charges
	}
	n := 0
	for _, g := range groups {
		if g.tag != "g" && held(g) {
			n++
		}
	}
	if n > most {
		return admit.Errorf(admit.CodeInvalid, "redisstore: the charges name %d tenants; a lease or reservation of this store names at most %d (Options.TenantsPerDecision)", n, most)
	}
	return nil
}

func (s *Room) leaseKey(tag, id string) string { return s.link.Prefix + "{" + tag + "}lease:" + id }

func (s *Room) resKey(tag, id string) string { return s.link.Prefix + "{" + tag + "}res:" + id }

// Reserve implements admit.Store.
func (s *Room) Reserve(ctx context.Context, charges []admit.Charge, maxWait time.Duration) (admit.Reservation, error) {
	if _, err := validate(charges, true); err != nil {
		return admit.Reservation{}, err
	}
	if len(charges) == 0 {
		now := time.Now()
		if s.link.Clock != nil {
			now = s.link.Clock()
		}
		return admit.Reservation{ID: joinID(NewID(), nil), OK: true, At: now}, nil
	}
	groups := s.groups(charges, s.link.Cluster)
	if err := s.checkTenantGroups(groups, func(group) bool { return true }); err != nil {
		return admit.Reservation{}, err
	}
	id := NewID()
	var booked []string
	var res admit.Reservation
	for _, g := range groups {
		v, err := s.link.Run(ctx, s.newCall(opReserve, itoa(int64(maxWait)), "", id, charges, g, s.resKey(g.tag, id)))
		if err == nil && len(v) != 4 {
			err = admit.Errorf(admit.CodeInternal, "redisstore: reserve replied %d values", len(v))
		}
		if err != nil {
			s.cancelTags(id, booked)
			return admit.Reservation{}, err
		}
		now := time.UnixMicro(v[0]).Add(time.Duration(v[1]))
		if wait := time.Duration(v[3]); wait >= res.Wait {
			res.Wait, res.At = wait, now.Add(wait)
		}
		if v[2] != 1 {
			s.cancelTags(id, booked)
			return admit.Reservation{Wait: res.Wait, At: res.At}, nil
		}
		booked = append(booked, g.tag)
	}
	res.OK, res.ID = true, joinID(id, booked)
	return res, nil
}

func (s *Room) cancelTags(id string, tags []string) {
	if len(tags) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.link.Timeout)
	defer cancel()
	for _, tag := range tags {
		_, _ = s.cancelOne(ctx, tag, id)
	}
}

// cancelOne cancels the part of reservation id held under tag. It reads
// the record's keys first, so that the script declares every key it
// touches, as Cluster requires.
func (s *Room) cancelOne(ctx context.Context, tag, id string) (bool, error) {
	rec := s.resKey(tag, id)
	fields, err := s.recordFields(ctx, rec)
	if err != nil {
		return false, err
	}
	keys := []string{rec}
	for _, f := range fields {
		if f != "at" {
			k, _, _ := strings.Cut(f, "\n")
			keys = append(keys, k)
		}
	}
	v, err := s.link.Run(ctx, link.Call{Keys: keys, Args: s.opArgs("c", id)})
	if err != nil {
		return false, err
	}
	return len(v) >= 3 && v[2] == 1, nil
}

func (s *Room) opArgs(op, id string) []string {
	us, ns := s.link.NowArgs()
	return []string{op, us, ns, "", "", id, "0"}
}

// recordFields returns the field names of a lease or reservation record.
func (s *Room) recordFields(ctx context.Context, rec string) ([]string, error) {
	var fields []string
	err := s.link.Do(ctx, func(ctx context.Context, client rueidis.Client) (err error) {
		fields, err = client.Do(ctx, client.B().Hkeys().Key(rec).Build()).AsStrSlice()
		return err
	})
	return fields, err
}

// CancelReservation implements admit.Store.
func (s *Room) CancelReservation(ctx context.Context, id string) error {
	all, tenants := s.tags()
	raw, tags, ok := splitID(id, all, tenants)
	if !ok {
		return admit.Errorf(admit.CodeNotFound, "reservation %q not found", id)
	}
	found := false
	for _, tag := range tags {
		f, err := s.cancelOne(ctx, tag, raw)
		if err != nil {
			return err
		}
		found = found || f
	}
	if !found {
		return admit.Errorf(admit.CodeNotFound, "reservation %q not found", id)
	}
	return nil
}

// RenewLease implements admit.Store.
func (s *Room) RenewLease(ctx context.Context, id string) (admit.Lease, error) {
	held, expiry, err := s.leaseOp(ctx, "n", id)
	if err != nil {
		return admit.Lease{}, err
	}
	if !held {
		return admit.Lease{}, admit.Errorf(admit.CodeNotFound, "lease %q not found or expired", id)
	}
	return admit.Lease{ID: id, ExpiresAt: time.UnixMicro(expiry)}, nil
}

// ReleaseLease implements admit.Store.
func (s *Room) ReleaseLease(ctx context.Context, id string) error {
	held, _, err := s.leaseOp(ctx, "l", id)
	if err != nil {
		return err
	}
	if !held {
		return admit.Errorf(admit.CodeNotFound, "lease %q not found or expired", id)
	}
	return nil
}

func (s *Room) leaseOp(ctx context.Context, op, id string) (bool, int64, error) {
	all, tenants := s.tags()
	raw, tags, ok := splitID(id, all, tenants)
	if !ok {
		return false, 0, nil
	}
	if op == "n" {
		// The global group first: a class that must yield its shared
		// slots renews nothing (the library, shareYields).
		tags = slices.Clone(tags)
		slices.Reverse(tags)
	}
	held, expiry := false, int64(0)
	for _, tag := range tags {
		rec := s.leaseKey(tag, raw)
		fields, err := s.recordFields(ctx, rec)
		if err != nil {
			return false, 0, err
		}
		keys := append([]string{rec}, fields...)
		if op == "n" {
			keys = appendShareRecords(keys, fields)
		}
		v, err := s.link.Run(ctx, link.Call{Keys: keys, Args: s.opArgs(op, raw)})
		if err != nil {
			return false, 0, err
		}
		if len(v) >= 4 && v[2] == 2 {
			return false, 0, admit.Errorf(admit.CodeExhausted, "lease %q is not renewed: its class holds more than its part of a limit tenants share while another is owed slots; it ends when it expires", id)
		}
		if op == "l" {
			s.forgetReleased(fields)
		}
		if len(v) >= 4 && v[2] == 1 {
			held, expiry = true, max(expiry, v[3])
		}
	}
	return held, expiry, nil
}
