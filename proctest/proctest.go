// Package proctest runs the admit command as real processes for the
// end-to-end suites (fault, attack): built once per test binary, each
// process on free loopback ports, stopped by PID (SIGTERM, then SIGKILL)
// when its test ends, and read from outside as an operator would: its
// HTTP answers, its /metrics, its memory in /proc.
package proctest

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/admitdev/admit/internal/portset"
)

// Main is a TestMain: it builds the admit command into a temporary
// directory, sets *bin to its path, runs the tests and exits with their
// code.
func Main(m *testing.M, bin *string) {
	dir, err := os.MkdirTemp("", "admit-proctest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if *bin, err = Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Build builds the admit command into dir and returns its path.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "admit")
	build := exec.Command("go", "build", "-o", bin, "github.com/admitdev/admit/cmd/admit")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("building admit: %w", err)
	}
	return bin, nil
}

// Buffer collects a process's output; it is safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *Buffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// Proc is an admit process a test started.
type Proc struct {
	Cmd    *exec.Cmd
	URL    string // http://listen
	GRPC   string // the gRPC address, when the test set one
	Output *Buffer
	done   chan struct{}
}

// Client is the HTTP client of the helpers: no request waits forever.
var Client = &http.Client{Timeout: 5 * time.Second}

// FreeAddr returns a loopback address that was free a moment ago, for a
// process that listens on it later. Its port is above the range the
// kernel hands out to clients and to listeners on port 0
// (ip_local_port_range, 32768–60999 by default): one from that range could
// be taken meanwhile by any connection the tests make (a CI run saw
// "address already in use").
//
// It never returns a port it returned before in this process: two
// addresses asked for one process (its listener and its metrics) were
// once the same port, free both times it was tried, and the process could
// not start ("address already in use" on the second).
func FreeAddr(t testing.TB) string {
	t.Helper()
	for range 100 {
		port := 61000 + rand.IntN(4500)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		if !portset.Take(port) {
			continue
		}
		if ln, err := net.Listen("tcp", addr); err == nil {
			ln.Close()
			return addr
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Start runs bin with args and the extra environment variables env
// (NAME=value), and waits until it answers HTTP on listen. It is stopped
// when the test ends; its last lines of output are logged if the test
// failed.
func Start(t testing.TB, bin, listen string, env []string, args ...string) *Proc {
	t.Helper()
	p := &Proc{URL: "http://" + listen, Output: &Buffer{}, done: make(chan struct{})}
	p.Cmd = exec.Command(bin, args...)
	p.Cmd.Env = append(os.Environ(), env...)
	p.Cmd.Stdout, p.Cmd.Stderr = p.Output, p.Output
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.Cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("%s output:\n%s", args[0], LastLines(p.Output.String(), 30))
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-p.done:
			t.Fatalf("admit %s exited: %s", args[0], p.Output)
		default:
		}
		if resp, err := http.Get(p.URL + "/healthz"); err == nil {
			resp.Body.Close() // the proxy answers it too, if only with 401
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("admit %s did not answer within 15s: %s", args[0], p.Output)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the process (SIGTERM, SIGKILL after 10 s) and waits for it.
// It is idempotent.
func (p *Proc) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// RSSKB reads the process's resident set from /proc, in kB.
func (p *Proc) RSSKB(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.Cmd.Process.Pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// CPU reads the processor time the process has used, user and system,
// from /proc (in the kernel's ticks, 100 a second).
func (p *Proc) CPU(t testing.TB) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.Cmd.Process.Pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// The command name, field 2, may hold spaces: count from after it.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		t.Fatalf("/proc/%d/stat: %d fields after the name", p.Cmd.Process.Pid, len(f))
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// Metrics returns the process's /metrics, a newline first so that a
// search for "\n"+name finds a sample at its line's start.
func (p *Proc) Metrics(t testing.TB) string {
	t.Helper()
	resp, err := Client.Get(p.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	return "\n" + b.String()
}

// Metric reads one unlabelled sample from the process's /metrics.
func (p *Proc) Metric(t testing.TB, name string) float64 {
	t.Helper()
	m := p.Metrics(t)
	i := strings.Index(m, "\n"+name+" ")
	if i < 0 {
		t.Fatalf("no metric %s", name)
	}
	line := m[i+len(name)+2:]
	line = line[:strings.IndexByte(line, '\n')]
	v, err := strconv.ParseFloat(line, 64)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

// LastLines returns the last n lines of s.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitFor calls ok until it reports true or within has passed; it
// reports whether ok did.
func WaitFor(within time.Duration, ok func() bool) bool {
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
