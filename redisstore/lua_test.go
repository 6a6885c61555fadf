package redisstore

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/admitdev/admit/internal/redishook"
	"github.com/admitdev/admit/redisstore/internal/exact"
)

// The Lua the store sends lives in .lua files a reader can hold: none
// passes 900 lines, and the library is its files joined, named as the
// store calls it.
func TestLuaFiles(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".lua" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if n := strings.Count(string(b), "\n"); n > 900 {
			t.Errorf("%s: %d lines; split it by concern (at most 900)", path, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(exact.Library, "\n")
	if first != "#!lua name="+redishook.FunctionName {
		t.Errorf("the library opens %q, want the name %s", first, redishook.FunctionName)
	}
	if !strings.HasSuffix(exact.Library, "redis.register_function('"+redishook.FunctionName+"', run)\n") {
		t.Error("the library does not end by registering its function")
	}
}

// TestConnectionsBounded: a connection is made within 4 timeouts (200 ms
// at least), so that a call waiting for one made by a caller of a longer
// context (a catalog poll of 2 s) waits no longer; one left unanswered is
// made again after 100 (5 s at least), not the client's 10 s.
func TestConnectionsBounded(t *testing.T) {
	for _, tc := range []struct {
		timeout       time.Duration
		dial, unheard time.Duration
	}{
		{0, 200 * time.Millisecond, 5 * time.Second},
		{50 * time.Millisecond, 200 * time.Millisecond, 5 * time.Second},
		{time.Second, 4 * time.Second, 10 * time.Second},
		{10 * time.Second, 5 * time.Second, 10 * time.Second},
	} {
		var co rueidis.ClientOption
		boundConnections(&co, &Options{Timeout: tc.timeout})
		if co.Dialer.Timeout != tc.dial || co.ConnWriteTimeout != tc.unheard {
			t.Errorf("timeout %v: dial %v, unanswered %v; want %v, %v", tc.timeout, co.Dialer.Timeout, co.ConnWriteTimeout, tc.dial, tc.unheard)
		}
	}
}
