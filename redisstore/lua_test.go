package redisstore

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/admitdev/admit/internal/redishook"
)

// The Lua the store sends lives in lua/, in files a reader can hold: none
// passes 900 lines, and the library is its files joined, named as the
// store calls it.
func TestLuaFiles(t *testing.T) {
	err := filepath.WalkDir("lua", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
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
	first, _, _ := strings.Cut(scriptSource, "\n")
	if first != "#!lua name="+redishook.FunctionName {
		t.Errorf("the library opens %q, want the name %s", first, redishook.FunctionName)
	}
	if !strings.HasSuffix(scriptSource, "redis.register_function('"+redishook.FunctionName+"', run)\n") {
		t.Error("the library does not end by registering its function")
	}
}
