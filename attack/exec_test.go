package attack

import (
	"context"
	"os/exec"
	"syscall"
	"time"
)

// execCommand is the admit binary with args, stopped when ctx ends (a
// server that started): SIGTERM, then SIGKILL 5 s later if it is stuck
// (in a system call, say), and killed when the test binary dies.
func execCommand(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, admitBin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}
