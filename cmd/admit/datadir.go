package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// lockDataDir takes data directory dir for this process until release:
// an exclusive lock (flock) on dir/admit.lock, which holds the holder's
// PID. A second server on the directory would overwrite the first's
// saves with its own; it is refused, naming the holder. The lock goes with
// the process, however it ends, so a crash leaves nothing to clear by
// hand; what a crash left half-written (temporary files of a save that
// never landed) is removed once the lock is held.
func lockDataDir(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, "admit.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := "another process"
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b[:n]))); perr == nil {
				holder = "pid " + strconv.Itoa(pid)
			}
			return nil, fmt.Errorf("data directory %s is in use by another admit (%s): each server needs its own --data-dir", dir, holder)
		}
		return nil, fmt.Errorf("data directory %s: locking %s: %w", dir, path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".*.tmp"))
	for _, name := range leftovers {
		_ = os.Remove(name)
	}
	return func() { f.Close() }, nil
}
