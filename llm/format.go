package llm

import (
	"bytes"
	"fmt"
	"io"
)

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

func nopBody(b []byte) io.ReadCloser { return io.NopCloser(bytes.NewReader(b)) }
