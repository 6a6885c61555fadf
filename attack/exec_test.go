package attack

import (
	"context"
	"os/exec"
	"syscall"
)

// execCommand is the admit binary with args, killed when ctx ends (a
// server that started), and when the test binary dies.
func execCommand(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, admitBin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	return cmd
}
