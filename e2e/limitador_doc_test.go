package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestLimitadorDocTryIt runs docs/limitador.md's "Try it": its limits
// (the last yaml block) loaded by admit serve --limitador-config, its sh
// block against the server, and the answers it says.
func TestLimitadorDocTryIt(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "limitador.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, tryIt, _ := strings.Cut(string(doc), "\n## Try it\n")
	tryIt, _, _ = strings.Cut(tryIt, "\n## ")
	blocks := func(text, lang string) []string {
		var out []string
		for {
			_, after, ok := strings.Cut(text, "```"+lang+"\n")
			if !ok {
				return out
			}
			block, rest, _ := strings.Cut(after, "```")
			out, text = append(out, block), rest
		}
	}
	yamls, shs := blocks(tryIt, "yaml"), blocks(tryIt, "sh")
	if len(shs) != 1 || len(yamls) != 1 {
		t.Fatalf("docs/limitador.md's Try it has %d sh and %d yaml blocks; this test runs one of each", len(shs), len(yamls))
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "limits.yaml")
	// Every limits file of the page loads.
	for i, y := range docBlocks(t, "limitador.md", "yaml") {
		if !strings.HasPrefix(y, "- namespace:") {
			continue
		}
		writeTestFile(t, file, y)
		out, err := exec.Command(admitBinary(t), "config", "validate", file).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "ok (Limitador limits file)") {
			t.Fatalf("yaml block %d: %s %v", i+1, out, err)
		}
	}
	writeTestFile(t, file, yamls[0])
	p := startAdmit(t, "--limitador-config", file)
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", shs[0])
	cmd.Env = append(os.Environ(), "ADMIT="+p.url)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s\nfailed: %v\n%s", shs[0], err, out)
	}
	lines := strings.SplitN(string(out), "\n", 4)
	if len(lines) < 4 || lines[0] != "200" || lines[1] != "200" || lines[2] != "429" || !strings.Contains(lines[3], `"remaining":0`) || !strings.Contains(lines[3], `"alice"`) {
		t.Fatalf("the doc says 200, 200, 429, then alice's counter with nothing left; got:\n%s", out)
	}
}
