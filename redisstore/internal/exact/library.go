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

// Arithmetic is the library's exact arithmetic (lua/10_arith.lua): 128-bit
// products and quotients, and a bucket's timeline kept as whole units of
// time plus a remainder of its rate's count. The regions' scripts are
// built on it, so that a bucket held across regions is computed as one
// Redis computes it; they define fmod and floor before it.
var Arithmetic = readLibraryFile("lua/10_arith.lua")

func readLibraryFile(name string) string {
	src, err := libraryFiles.ReadFile(name)
	if err != nil {
		panic(err) // embedded
	}
	return string(src)
}
