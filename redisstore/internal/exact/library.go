package exact

import (
	"embed"
	"io/fs"
	"strings"
)

// Library is the Functions library Redis loads: lua/'s files joined in
// the order of their names. Its function is the only one the store calls
// (see Call).
var Library = joinLibrary()

//go:embed lua/*.lua
var libraryFiles embed.FS

func joinLibrary() string {
	files, err := fs.Glob(libraryFiles, "lua/*.lua")
	if err != nil {
		panic(err) // the pattern is valid
	}
	var b strings.Builder
	for _, f := range files { // in lexical order
		src, err := libraryFiles.ReadFile(f)
		if err != nil {
			panic(err) // embedded
		}
		b.Write(src)
	}
	return b.String()
}
