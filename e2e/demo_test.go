package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// admitBinary builds admit once for the package's tests.
func admitBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "admit-e2e")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "admit")
		build := exec.Command("go", "build", "-o", binPath, "./cmd/admit")
		build.Dir = ".."
		if out, err := build.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// admitProcess is a running `admit serve`.
type admitProcess struct {
	url  string // http://host:port
	grpc string // host:port
	cmd  *exec.Cmd
	log  *processLog // what it wrote to stderr
}

// processLog keeps a process's log lines and wakes a waiter at each new
// one.
type processLog struct {
	mu     sync.Mutex
	lines  []string
	notify chan struct{}
}

func newProcessLog() *processLog { return &processLog{notify: make(chan struct{}, 1)} }

func (l *processLog) add(line string) {
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
	select {
	case l.notify <- struct{}{}:
	default:
	}
}

// matching returns the lines so far that re matches.
func (l *processLog) matching(re *regexp.Regexp) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var m []string
	for _, line := range l.lines {
		if re.MatchString(line) {
			m = append(m, line)
		}
	}
	return m
}

// tail returns the last n lines.
func (l *processLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines[max(len(l.lines)-n, 0):], "\n")
}

// await waits, at most d, until done reports true of the log; it fails
// the test saying what it waited for.
func (l *processLog) await(t *testing.T, d time.Duration, what string, done func() bool) {
	t.Helper()
	deadline := time.After(d)
	for !done() {
		select {
		case <-l.notify:
		case <-deadline:
			t.Fatalf("%s: not within %v:\n%s", what, d, l.tail(40))
		}
	}
}

// startAdmit runs `admit serve` with args on a free loopback port (the
// built-in demo configuration unless args say otherwise) and returns it
// once it serves. The test's cleanup kills it by its PID.
func startAdmit(t *testing.T, args ...string) *admitProcess {
	t.Helper()
	return startAdmitEnv(t, nil, args...)
}

// startAdmitEnv is startAdmit with env added to the test's environment.
// Later flags win, so args may replace the addresses and data directory.
func startAdmitEnv(t *testing.T, env []string, args ...string) *admitProcess {
	t.Helper()
	args = append([]string{"serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data")}, args...)
	return runAdmit(t, admitBinary(t), env, args...)
}

// runAdmit runs bin (admit, or a link to it) with args and env added to
// the test's environment, and returns it once it logs that it serves.
func runAdmit(t *testing.T, bin string, env []string, args ...string) *admitProcess {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	serving := regexp.MustCompile(`msg="admit serving" http=(http://127\.0\.0\.1:\d+) grpc=(127\.0\.0\.1:\d+)`)
	found := make(chan []string, 1)
	closed := make(chan struct{}) // stderr ended: the process exited
	log := newProcessLog()
	go func() {
		defer close(closed)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.add(sc.Text())
			if m := serving.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1:]
			}
		}
	}()
	select {
	case m := <-found:
		return &admitProcess{url: m[0], grpc: m[1], cmd: cmd, log: log}
	case <-closed:
		select {
		case m := <-found:
			return &admitProcess{url: m[0], grpc: m[1], cmd: cmd, log: log}
		default:
		}
		t.Fatalf("admit serve exited before serving:\n%s", log.tail(100))
		return nil
	case <-time.After(30 * time.Second):
		t.Fatalf("admit serve did not start within 30s:\n%s", log.tail(100))
		return nil
	}
}

// browser starts headless Chromium (Debian's, /usr/bin/chromium unless
// ADMIT_CHROMIUM says otherwise) with the flags this machine's closed
// network needs.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := os.Getenv("ADMIT_CHROMIUM")
	if path == "" {
		path = "/usr/bin/chromium"
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("Chromium is needed for the demo page test (make deps installs Debian's chromium): %v", err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	return ctx
}

// waitLog waits until the page's log has a line containing text.
func waitLog(text string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](`[...document.querySelectorAll("#log div")].some(d => d.textContent.includes(`+jsString(text)+`))`,
		chromedp.WithPollingTimeout(15*time.Second))
}

func jsString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// TestDemoPage walks the sample's happy path in the browser, then opens
// one connection too many: tenant-1 (the free tier) allows 2 per session.
func TestDemoPage(t *testing.T) {
	base := startAdmit(t).url
	ctx := browser(t)
	click := func(id string) chromedp.Action[chromedp.Void] { return chromedp.Click(chromedp.ID(id)) }
	err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/demo/"),
		waitLog("loaded 5 tenants"),
		chromedp.SetValue(chromedp.ID("tenant"), "tenant-1"),
		click("create"),
		waitLog("created for tenant-1"),
		click("connect"),
		waitLog("connection 1 open"),
		click("silo"),
		waitLog("echo seq=1 route=silo id=m1"),
		click("pool"),
		waitLog("echo seq=2 route=pool id=m2"),
		click("connect"),
		waitLog("connection 2 open"),
		click("connect"),
		waitLog("connection refused: 429 Quota exceeded: connection refused by connections_per_session"),
	)
	shot, shotErr := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err == nil {
		err = shotErr
	}
	if err == nil {
		err = chromedp.Do(ctx,
			click("disconnect"),
			waitLog("connection closed: 1000"),
			click("delete"),
			waitLog("deleted"),
			waitLog("connection closed: 4000 the session was deleted"),
		)
	}
	logText, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("log")))
	if len(shot) > 0 {
		keep(t, "demo-429.png", shot)
	}
	if err != nil {
		t.Fatalf("%v\npage log:\n%s", err, logText)
	}
	if strings.Count(logText, "echo seq=") != 2 {
		t.Errorf("page log:\n%s", logText)
	}
}

// keep writes a test artifact under $ADMIT_ARTIFACTS (default
// e2e/artifacts, ignored by git).
func keep(t *testing.T, name string, b []byte) {
	dir := os.Getenv("ADMIT_ARTIFACTS")
	if dir == "" {
		dir = "artifacts"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Error(err)
		return
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Error(err)
		return
	}
	t.Logf("screenshot: %s", p)
}
