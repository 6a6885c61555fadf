package policy_test

import (
	"path/filepath"
	"testing"

	"github.com/admitdev/admit/policy"
	"github.com/admitdev/admit/policy/changestest"
)

func TestFileStoreConformance(t *testing.T) {
	changestest.Run(t, func(t *testing.T) (a, b policy.ChangeStore) {
		s := &policy.FileStore{Path: filepath.Join(t.TempDir(), "catalog.json")}
		return s, s
	}, changestest.Options{})
}
