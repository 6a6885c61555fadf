package catalog_test

import (
	"path/filepath"
	"testing"

	"github.com/admitdev/admit/policy/catalog"
	"github.com/admitdev/admit/policy/catalog/changestest"
)

func TestFileStoreConformance(t *testing.T) {
	changestest.Run(t, func(t *testing.T) (a, b catalog.Store) {
		s := &catalog.FileStore{Path: filepath.Join(t.TempDir(), "catalog.json")}
		return s, s
	}, changestest.Options{})
}
