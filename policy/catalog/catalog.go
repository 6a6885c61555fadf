// Package catalog is the tenant catalog: the configuration's policy with
// the changes made through the admin API (tenants, tiers, API keys) on
// top, compiled into the current policy.Policy and swapped in at once. The
// changes are saved in a Store: a file (FileStore), or (package
// redischanges) Redis, shared by every server, which each server follows.
package catalog

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/admitdev/admit"
	"github.com/admitdev/admit/internal/bounds"
	"github.com/admitdev/admit/internal/syncfile"
	"github.com/admitdev/admit/policy"
)

// Changes are the catalog changes made through the admin API. A tenant or
// tier here replaces the configuration's entry of the same name, whatever
// the configuration later says; a deleted tenant stays deleted.
type Changes struct {
	Version int `json:"version"`
	// Revision names the save: a hybrid clock, in microseconds, that is
	// past both the revision it was made on and the writer's clock, so
	// that later saves carry larger revisions, across servers too.
	Revision int64 `json:"revision,omitempty"`
	// Base is the revision these changes were made on: a shared
	// Store saves them only over it (see ErrStale).
	Base    int64                       `json:"-"`
	Tenants map[string]*TenantChange    `json:"tenants,omitempty"`
	Tiers   map[string]*policy.TierSpec `json:"tiers,omitempty"`
	// Written has the revision each entry was last written at, by
	// entryKey: so that copies of the catalog held by several servers
	// merge, entry by entry, the later write winning, when the store
	// lost what it held.
	Written map[string]int64 `json:"written,omitempty"`
}

// entryKey names a tenant's or a tier's entry in Changes.Written.
func entryKey(kind, name string) string { return kind + "/" + name }

// setTenant writes tenant id's entry at c's revision.
func (c *Changes) setTenant(id string, t *TenantChange) {
	c.Tenants[id] = t
	c.Written[entryKey("tenants", id)] = c.Revision
}

// revoked returns the revoked keys tenant id's entry remembers.
func (c *Changes) revoked(id string) []string {
	if t := c.Tenants[id]; t != nil {
		return t.RevokedKeysSHA256
	}
	return nil
}

// setTier writes tier name's entry at c's revision.
func (c *Changes) setTier(name string, t *policy.TierSpec) {
	c.Tiers[name] = t
	c.Written[entryKey("tiers", name)] = c.Revision
}

// nextRevision returns the revision of a save made on rev: later than rev
// and than this server's clock (unix µs).
func nextRevision(rev int64) int64 {
	return max(rev+1, time.Now().UnixMicro())
}

// mergeChanges returns saved with the entries of mine written later than
// saved's (or that saved lacks), and how many those are: the
// acknowledged changes a store that lost what it held no longer has.
// Entries are never removed (a deleted tenant is kept as deleted), so an
// entry saved lacks is one it lost. On a tie, saved's entry stays.
func mergeChanges(saved, mine *Changes) (*Changes, int) {
	out := saved.clone()
	n := 0
	for id, t := range mine.Tenants {
		k := entryKey("tenants", id)
		st, ok := saved.Tenants[id]
		if !ok {
			out.Tenants[id] = t
			out.Written[k] = mine.Written[k]
			n++
			continue
		}
		// The same write (a revision names one save; a merge keeps the
		// later write's stamp, and changes only the keys): nothing to merge.
		if w := mine.Written[k]; w != 0 && w == saved.Written[k] &&
			slices.Equal(t.APIKeysSHA256, st.APIKeysSHA256) && slices.Equal(t.RevokedKeysSHA256, st.RevokedKeysSHA256) {
			continue
		}
		win, lose, stamp := st, t, saved.Written[k]
		if mine.Written[k] > saved.Written[k] {
			win, lose, stamp = t, st, mine.Written[k]
		}
		if m := mergeTenant(win, lose); !sameTenant(m, st) {
			out.Tenants[id] = m
			out.Written[k] = stamp
			n++
		}
	}
	for name, t := range mine.Tiers {
		k := entryKey("tiers", name)
		if _, ok := saved.Tiers[name]; !ok || mine.Written[k] > saved.Written[k] {
			out.Tiers[name] = t
			out.Written[k] = mine.Written[k]
			n++
		}
	}
	return out, n
}

// TenantChange is a tenant as the admin API left it.
type TenantChange struct {
	Deleted bool `json:"deleted,omitempty"`
	policy.TenantSpec
	// RevokedKeysSHA256 are the hashes of the tenant's API keys revoked
	// (a deleted tenant's keys among them), the latest last, at most
	// maxRevokedKeys: a copy of the catalog that still lists one, merged
	// back, never brings it back (see mergeTenant).
	RevokedKeysSHA256 []string `json:"revoked_keys_sha256,omitempty"`
}

// maxRevokedKeys bounds the revocations a tenant's entry remembers.
const maxRevokedKeys = 1000

// lockedKey stands for a tenant's keys when a merge left none of a
// tenant that had some: it matches no key (no key hashes to it), so the
// tenant stays one that needs a key rather than becoming open to anyone.
const lockedKey = "0000000000000000000000000000000000000000000000000000000000000000"

// withRevoked returns revoked with hashes added, the oldest dropped past
// maxRevokedKeys.
func withRevoked(revoked []string, hashes ...string) []string {
	out := slices.Clone(revoked)
	for _, h := range hashes {
		if h != lockedKey && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	if len(out) > maxRevokedKeys {
		out = out[len(out)-maxRevokedKeys:]
	}
	return out
}

// mergeTenant merges two writes of a tenant's entry, win the later: its
// tier, overrides and the rest, or its deletion, win whole; its API keys
// are those either lists, less every key either revoked, so that neither
// a key created nor one revoked on one side is undone by the other.
func mergeTenant(win, lose *TenantChange) *TenantChange {
	out := *win
	out.RevokedKeysSHA256 = withRevoked(win.RevokedKeysSHA256, lose.RevokedKeysSHA256...)
	var keys []string
	for _, h := range slices.Concat(win.APIKeysSHA256, lose.APIKeysSHA256) {
		if h != lockedKey && !slices.Contains(out.RevokedKeysSHA256, h) && !slices.Contains(keys, h) && len(keys) < bounds.MaxAPIKeys {
			keys = append(keys, h)
		}
	}
	// The later write had keys, and the other side revoked them all (two
	// revocations made apart while the store had lost the catalog): the
	// tenant stays locked, not open.
	if len(keys) == 0 && len(win.APIKeysSHA256) > 0 && !out.Deleted {
		keys = []string{lockedKey}
	}
	if out.Deleted {
		keys = nil
	}
	out.APIKeysSHA256 = keys
	return &out
}

// sameTenant reports whether two tenant entries are the same write.
func sameTenant(a, b *TenantChange) bool {
	return a.Deleted == b.Deleted && a.Tier == b.Tier && a.BillingAnchor == b.BillingAnchor && a.Weight == b.Weight &&
		slices.Equal(a.APIKeysSHA256, b.APIKeysSHA256) && slices.Equal(a.RevokedKeysSHA256, b.RevokedKeysSHA256) &&
		overridesEqual(a.Overrides, b.Overrides)
}

func overridesEqual(a, b []policy.RuleSpec) bool {
	if len(a) != len(b) {
		return false
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

func (c *Changes) clone() *Changes {
	out := &Changes{Version: 1, Revision: c.Revision, Base: c.Base, Tenants: maps.Clone(c.Tenants), Tiers: maps.Clone(c.Tiers),
		Written: maps.Clone(c.Written)}
	if out.Tenants == nil {
		out.Tenants = map[string]*TenantChange{}
	}
	if out.Tiers == nil {
		out.Tiers = map[string]*policy.TierSpec{}
	}
	if out.Written == nil {
		out.Written = map[string]int64{}
	}
	return out
}

// Store keeps the catalog's changes across restarts.
type Store interface {
	// Load returns the saved changes; empty Changes if none were saved.
	Load(ctx context.Context) (*Changes, error)
	// Save replaces the saved changes. When it fails, the previously saved
	// changes must still load. A store shared by several servers refuses,
	// with an error wrapping ErrStale, changes whose Base is not the saved
	// Revision: another server saved meanwhile.
	Save(ctx context.Context, c *Changes) error
}

// ErrStale is the error a shared Store's Save wraps when another
// server saved changes since these were loaded. Catalog edits load the
// saved changes again and retry.
var ErrStale = errors.New("the saved catalog changed meanwhile")

// Catalog is the live tenant catalog: the configuration's policy with the
// admin API's changes on top, compiled into the policy.Policy that requests are
// resolved against. Changes are persisted in a Store before they take
// effect, and take effect with the next request.
//
// A Catalog is safe for concurrent use: writers are serialized by a mutex,
// readers load the current policy.Policy with one atomic read.
type Catalog struct {
	mu      sync.Mutex
	base    policy.Spec
	changes *Changes
	store   Store
	cur     atomic.Pointer[policy.Policy]
	// pending is set while the saved changes could not be loaded yet.
	pending atomic.Bool
	// restores counts the times this server saved back the changes its
	// store had lost; onRestore, if set, is told of each.
	restores  atomic.Int64
	onRestore atomic.Pointer[func(entries int, revision int64)]
}

// OnRestore has f called (under the catalog's lock: it must not call the
// catalog) each time the catalog saves back into its store entries the
// store had lost, with how many and the revision saved.
func (c *Catalog) OnRestore(f func(entries int, revision int64)) { c.onRestore.Store(&f) }

// Restores returns how many times this catalog saved back into its store
// acknowledged changes the store had lost (a Redis that came back empty,
// or older than what this server had seen).
func (c *Catalog) Restores() int64 { return c.restores.Load() }

// Pending reports whether the catalog started without its store's saved
// changes (the store was unavailable) and has not loaded them since.
func (c *Catalog) Pending() bool { return c.pending.Load() }

// New loads the saved changes from store (nil keeps changes in memory
// only) and compiles them over base. A store that is unavailable
// (admit.CodeUnavailable) does not stop it: the catalog starts from base
// alone, Pending reports it, and the first Refresh that reaches the store
// loads the changes. Until then an admin change fails as stale (the
// store's revision is ahead), so nothing saved is overwritten.
func New(ctx context.Context, base *policy.Spec, store Store) (*Catalog, error) {
	c := &Catalog{base: *base, store: store, changes: (&Changes{}).clone()}
	if store != nil {
		ch, err := store.Load(ctx)
		switch {
		case err == nil:
			c.changes = ch.clone()
		case admit.ErrorCode(err) == admit.CodeUnavailable:
			c.pending.Store(true)
		default:
			return nil, err
		}
	}
	p, err := compileWith(&c.base, c.changes, false)
	if err != nil {
		return nil, fmt.Errorf("policy: the configuration with the saved catalog changes: %w", err)
	}
	c.cur.Store(p)
	return c, nil
}

// Policy returns the current policy.
func (c *Catalog) Policy() *policy.Policy { return c.cur.Load() }

// SetBase replaces the configuration's policy (a reload). If the new
// configuration does not compile, alone or with the catalog's changes, the
// current policy is kept and the error returned.
func (c *Catalog) SetBase(base *policy.Spec) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, err := compileWith(base, c.changes, false)
	if err != nil {
		return err
	}
	c.base = *base
	c.cur.Store(p)
	return nil
}

// compileWith compiles base with changes applied.
// compileWith compiles base with the changes ch. Only the changes made
// through the catalog are checked against the store (checked, see
// policy.Spec.CheckRule): saved changes another server accepted must not
// keep this one from starting, or from taking the changes after them.
func compileWith(base *policy.Spec, ch *Changes, checked bool) (*policy.Policy, error) {
	spec := *base
	if !checked {
		spec.CheckRule = nil
	}
	spec.Tiers = maps.Clone(base.Tiers)
	spec.Tenants = maps.Clone(base.Tenants)
	if spec.Tiers == nil {
		spec.Tiers = map[string]policy.TierSpec{}
	}
	if spec.Tenants == nil {
		spec.Tenants = map[string]policy.TenantSpec{}
	}
	for name, t := range ch.Tiers {
		spec.Tiers[name] = *t
	}
	for id, t := range ch.Tenants {
		if t.Deleted {
			delete(spec.Tenants, id)
		} else {
			spec.Tenants[id] = t.TenantSpec
		}
	}
	p, err := policy.Compile(&spec)
	if err != nil {
		return nil, err
	}
	for name := range ch.Tiers {
		p.Tier(name).Source = "admin"
	}
	for id, t := range ch.Tenants {
		if !t.Deleted {
			p.Tenant(id).Source = "admin"
		}
	}
	return p, nil
}

// apply compiles the changes edit makes, saves them and makes them current,
// or changes nothing and returns the error. The edit starts from the saved
// changes, which another server sharing the store may have made; if one
// saves in between, the edit is made again on top of its changes.
func (c *Catalog) apply(ctx context.Context, edit func(ch *Changes) error) (*policy.Policy, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for attempt := 0; ; attempt++ {
		if c.store != nil {
			if err := c.refreshLocked(ctx); err != nil {
				return nil, err
			}
		}
		next := c.changes.clone()
		next.Base, next.Revision = c.changes.Revision, nextRevision(c.changes.Revision)
		if err := edit(next); err != nil {
			return nil, err
		}
		p, err := compileWith(&c.base, next, true)
		if err != nil {
			return nil, err
		}
		if c.store != nil {
			err := c.store.Save(ctx, next)
			if errors.Is(err, ErrStale) && attempt < 5 {
				continue
			}
			if err != nil {
				return nil, err
			}
		}
		c.changes = next
		c.cur.Store(p)
		return p, nil
	}
}

// Refresh loads the saved changes again and makes them current if they
// are not the ones in use: a server sharing the store with others calls it
// when told that one of them saved. Saved changes that do not compile with
// this server's configuration are refused and the current policy kept.
func (c *Catalog) Refresh(ctx context.Context) error {
	_, err := c.Sync(ctx)
	return err
}

// Sync is Refresh, and reports how many entries (tenants, tiers) of this
// server's copy it saved back into the store, which had lost them: a
// Redis that came back empty, or restored by a server whose copy was
// older. The store's entries and the restored ones merge, the later write
// of each winning, so an acknowledged change is never undone by a copy
// older than it.
func (c *Catalog) Sync(ctx context.Context) (restored int, err error) {
	if c.store == nil {
		return 0, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.syncLocked(ctx)
}

func (c *Catalog) refreshLocked(ctx context.Context) error {
	_, err := c.syncLocked(ctx)
	return err
}

func (c *Catalog) syncLocked(ctx context.Context) (int, error) {
	for attempt := 0; ; attempt++ {
		saved, err := c.store.Load(ctx)
		if err != nil {
			return 0, err
		}
		// A catalog that has not loaded its store's changes yet holds
		// none of its own to restore.
		merged, lost := saved, 0
		if !c.pending.Load() {
			merged, lost = mergeChanges(saved, c.changes)
		}
		if lost == 0 {
			c.pending.Store(false)
			if saved.Revision == c.changes.Revision {
				return 0, nil
			}
			p, err := compileWith(&c.base, saved, false)
			if err != nil {
				return 0, fmt.Errorf("policy: the saved catalog changes (revision %d) do not apply to this configuration: %w", saved.Revision, err)
			}
			c.changes = saved.clone()
			c.cur.Store(p)
			return 0, nil
		}
		// The store lost acknowledged changes this server holds: save
		// them back on top of what it holds now. If another server
		// saves meanwhile, merge with theirs and try again.
		merged.Base, merged.Revision = saved.Revision, nextRevision(max(saved.Revision, c.changes.Revision))
		p, err := compileWith(&c.base, merged, false)
		if err != nil {
			return 0, fmt.Errorf("policy: the catalog changes to restore (revision %d) do not apply to this configuration: %w", merged.Revision, err)
		}
		err = c.store.Save(ctx, merged)
		if errors.Is(err, ErrStale) && attempt < 5 {
			continue
		}
		if err != nil {
			return 0, err
		}
		c.changes = merged
		c.cur.Store(p)
		c.restores.Add(1)
		if f := c.onRestore.Load(); f != nil {
			(*f)(lost, merged.Revision)
		}
		return lost, nil
	}
}

// PutTenant creates or replaces a tenant's tier and overrides. The tenant
// keeps its API keys, and its billing anchor and weight unless spec sets
// them: a new tier does not move the day its quotas renew.
func (c *Catalog) PutTenant(ctx context.Context, id string, spec policy.TenantSpec) (*policy.Tenant, error) {
	if err := policy.CheckName(id); err != nil {
		return nil, err
	}
	p, err := c.apply(ctx, func(ch *Changes) error {
		tc := &TenantChange{TenantSpec: policy.TenantSpec{Tier: spec.Tier, Overrides: spec.Overrides, BillingAnchor: spec.BillingAnchor, Weight: spec.Weight}}
		if prev := ch.Tenants[id]; prev != nil {
			tc.RevokedKeysSHA256 = prev.RevokedKeysSHA256
		}
		if old := c.cur.Load().Tenant(id); old != nil {
			tc.APIKeysSHA256 = old.Spec.APIKeysSHA256
			tc.BillingAnchor = cmp.Or(tc.BillingAnchor, old.Spec.BillingAnchor)
			tc.Weight = cmp.Or(tc.Weight, old.Spec.Weight)
		}
		ch.setTenant(id, tc)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return p.Tenant(id), nil
}

// DeleteTenant deletes a tenant; an unknown tenant is admit.CodeNotFound.
func (c *Catalog) DeleteTenant(ctx context.Context, id string) error {
	_, err := c.apply(ctx, func(ch *Changes) error {
		if c.cur.Load().Tenant(id) == nil {
			return admit.Errorf(admit.CodeNotFound, "tenant %q is unknown", id)
		}
		// Its keys count as revoked: a copy that still lists them never
		// brings them back to a tenant of that name made again.
		var revoked []string
		if prev := ch.Tenants[id]; prev != nil {
			revoked = prev.RevokedKeysSHA256
		}
		ch.setTenant(id, &TenantChange{Deleted: true, RevokedKeysSHA256: withRevoked(revoked, c.cur.Load().Tenant(id).Spec.APIKeysSHA256...)})
		return nil
	})
	return err
}

// CreateAPIKey makes a new API key for a tenant and returns it. Only its
// SHA-256 is kept: the key cannot be shown again.
func (c *Catalog) CreateAPIKey(ctx context.Context, id string) (string, error) {
	var raw [32]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails (Go 1.24+)
	key := "ak_" + base64.RawURLEncoding.EncodeToString(raw[:])
	_, err := c.apply(ctx, func(ch *Changes) error {
		t := c.cur.Load().Tenant(id)
		if t == nil {
			return admit.Errorf(admit.CodeNotFound, "tenant %q is unknown", id)
		}
		if len(t.Spec.APIKeysSHA256) >= bounds.MaxAPIKeys {
			return admit.Errorf(admit.CodeConflict, "tenant %q has %d API keys, the most it may have", id, bounds.MaxAPIKeys)
		}
		spec := t.Spec
		spec.APIKeysSHA256 = append(slices.DeleteFunc(slices.Clone(spec.APIKeysSHA256), func(h string) bool { return h == lockedKey }), policy.HashKey(key))
		ch.setTenant(id, &TenantChange{TenantSpec: spec, RevokedKeysSHA256: ch.revoked(id)})
		return nil
	})
	if err != nil {
		return "", err
	}
	return key, nil
}

// APIKeyID names an API key by the hash it is kept as (hex SHA-256): the
// first 12 hex digits, which say nothing of the key and let an operator
// revoke it.
func APIKeyID(hash string) string { return hash[:min(len(hash), 12)] }

// RevokeAPIKey removes the API key of tenant id whose APIKeyID is keyID:
// from the next request on, on every server, it is an unknown key (401).
// A key that does not exist is admit.CodeNotFound; the tenant's last key is
// admit.CodeConflict, since a tenant without keys needs none.
func (c *Catalog) RevokeAPIKey(ctx context.Context, id, keyID string) error {
	_, err := c.apply(ctx, func(ch *Changes) error {
		t := c.cur.Load().Tenant(id)
		if t == nil {
			return admit.Errorf(admit.CodeNotFound, "tenant %q is unknown", id)
		}
		i := slices.IndexFunc(t.Spec.APIKeysSHA256, func(h string) bool { return len(keyID) == 12 && APIKeyID(h) == keyID })
		if i < 0 {
			return admit.Errorf(admit.CodeNotFound, "tenant %q has no API key %.64q", id, keyID)
		}
		if len(t.Spec.APIKeysSHA256) == 1 {
			// A tenant without keys takes requests without one: revoking
			// the last key would open the tenant to anyone.
			return admit.Errorf(admit.CodeConflict, "key %s is tenant %q's last: create another first (a tenant without keys needs none)", keyID, id)
		}
		spec := t.Spec
		spec.APIKeysSHA256 = slices.Delete(slices.Clone(spec.APIKeysSHA256), i, i+1)
		ch.setTenant(id, &TenantChange{TenantSpec: spec, RevokedKeysSHA256: withRevoked(ch.revoked(id), t.Spec.APIKeysSHA256[i])})
		return nil
	})
	return err
}

// PutTier creates or replaces a tier. Tenants of the tier get its new rules
// with their next request.
func (c *Catalog) PutTier(ctx context.Context, name string, spec policy.TierSpec) (*policy.Tier, error) {
	if err := policy.CheckName(name); err != nil {
		return nil, err
	}
	p, err := c.apply(ctx, func(ch *Changes) error {
		ch.setTier(name, &spec)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return p.Tier(name), nil
}

// FileStore is a Store in one JSON file. Save writes a temporary file
// in the same directory, syncs it and renames it over the old one, so a
// crash at any point leaves either the old changes or the new ones, never a
// mix. The zero FileStore is not usable; set Path.
type FileStore struct {
	Path string
}

var _ Store = (*FileStore)(nil)

// Load implements Store. A missing file is an empty catalog.
func (f *FileStore) Load(ctx context.Context) (*Changes, error) {
	b, err := os.ReadFile(f.Path)
	if errors.Is(err, os.ErrNotExist) {
		return &Changes{Version: 1}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("policy: reading the catalog: %w", err)
	}
	var ch Changes
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ch); err != nil {
		return nil, fmt.Errorf("policy: %s is not a catalog file: %w", f.Path, err)
	}
	if ch.Version != 1 {
		return nil, fmt.Errorf("policy: %s: catalog version %d; this build reads version 1", f.Path, ch.Version)
	}
	return &ch, nil
}

// writeFile is os.File.Write; tests replace it to fail mid-write.
var writeFile = func(f *os.File, b []byte) (int, error) { return f.Write(b) }

// Save implements Store.
func (f *FileStore) Save(ctx context.Context, c *Changes) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("policy: encoding the catalog: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(f.Path), 0o700); err != nil {
		return fmt.Errorf("policy: saving the catalog: %w", err)
	}
	if err := syncfile.Write(f.Path, append(b, '\n'), writeFile); err != nil {
		return fmt.Errorf("policy: saving the catalog: %w", err)
	}
	return nil
}
