// Package syncfile saves a file so that a crash at any point leaves the
// old file or the new one, never a mix: the catalog's file store and the
// usage journal's compaction save so.
package syncfile

import (
	"os"
	"path/filepath"
)

// Write writes data to path: into a temporary file in the same directory
// with write (os.File.Write; tests pass one that fails midway), synced,
// renamed over path, and the directory synced.
func Write(path string, data []byte, write func(*os.File, []byte) (int, error)) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	if _, err := write(tmp, data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
