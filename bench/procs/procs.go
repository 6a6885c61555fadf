// Package procs starts and measures the processes a benchmark runs beside
// itself (an `admit serve`, a peer, a redis-server): each logs to a file of
// its own, is stopped by its PID, and tells the CPU it has used.
package procs

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Proc is a process a benchmark started.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	// Log is the file its standard output and error go to.
	Log string
}

// Start runs bin with args, env added to the environment, its output to a
// temporary file named after name.
func Start(name string, env []string, bin string, args ...string) (*Proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	log, err := os.CreateTemp("", "bench-"+name+"-*.log")
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &Proc{Name: name, Cmd: cmd, Log: log.Name()}, nil
}

// Stop kills the process and waits for it.
func (p *Proc) Stop() {
	_ = p.Cmd.Process.Kill()
	_ = p.Cmd.Wait()
}

// CPU returns the CPU time the process has used (user + system).
func (p *Proc) CPU() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which is in parentheses: utime
	// and stime are the 14th and 15th of the line, in clock ticks.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	const tick = 10 * time.Millisecond // USER_HZ, 100 on Linux
	return time.Duration(ut+st) * tick, nil
}

// FreePort returns a TCP port free on 127.0.0.1 now.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
