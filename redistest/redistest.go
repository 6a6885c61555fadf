// Package redistest starts real redis-server processes for tests: a
// standalone server or a cluster of masters, each on a free loopback port
// in a temporary directory, stopped by PID when the test ends.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/admitdev/admit/internal/portset"
)

// Server is one redis-server process started by a test.
type Server struct {
	Addr string
	Port int
	// TLSAddr and TLSPort are where a server started with StartTLS (or
	// StartSentinelTLS) serves TLS; "" and 0 otherwise.
	TLSAddr string
	TLSPort int
	dir     string
	conf    string // a config file to start with, for sentinels
	args    []string
	cmd     *exec.Cmd
	done    chan struct{}
}

func binary(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		tb.Fatalf("%s not found: the Redis tests need a real server; install it (apt-get install -y redis-server redis-tools) — `make test` does", name)
	}
	return p
}

// freePort returns a loopback port that was free a moment ago.
func freePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// laterPort returns a loopback port for a server that starts later, when
// nothing can pick another port for it if this one is taken meanwhile,
// and never one it returned before in this process. It
// is outside the range the kernel hands out to clients and to Start's
// servers (ip_local_port_range, 32768–60999 by default), and so is its
// Cluster bus port (+10000): 10000–22767 and 20000–32767.
func laterPort(tb testing.TB) int {
	tb.Helper()
	for range 100 {
		p := 10000 + rand.IntN(12768)
		if portset.Take(p) && portset.Take(p+10000) && free(p) && free(p+10000) {
			return p
		}
	}
	tb.Fatal("no free pair of ports (p, p+10000) below 32768")
	return 0
}

func free(port int) bool {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// Start starts a standalone redis-server; extra are more redis-server
// arguments, such as "--cluster-enabled", "yes". The server is stopped when
// the test ends.
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	return startServer(tb, &Server{dir: tb.TempDir(), args: extra})
}

// StartSentinel starts a Redis Sentinel that monitors master under name.
func StartSentinel(tb testing.TB, master *Server, name string) *Server {
	tb.Helper()
	return startSentinel(tb, master, name, 1)
}

// StartSentinels starts n Sentinels that monitor master under name and
// agree on a failover by majority; each deems the master down after 1s
// without an answer.
func StartSentinels(tb testing.TB, master *Server, name string, n int) []*Server {
	tb.Helper()
	out := make([]*Server, n)
	for i := range out {
		out[i] = startSentinel(tb, master, name, n/2+1)
	}
	return out
}

// StartReplica starts a standalone server that replicates master, and
// waits until its link to the master is up.
func StartReplica(tb testing.TB, master *Server) *Server {
	tb.Helper()
	r := Start(tb, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := Command(r.Addr, "INFO", "replication")
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return r
		}
		if time.Now().After(deadline) {
			tb.Fatalf("replica %s did not sync with %s: %v %s", r.Addr, master.Addr, err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func startSentinel(tb testing.TB, master *Server, name string, quorum int) *Server {
	tb.Helper()
	return startServer(tb, sentinel(tb, master, name, quorum))
}

// UnstartedSentinels returns n Sentinels like StartSentinels's, with
// their ports and configuration but not running: Restart starts each.
func UnstartedSentinels(tb testing.TB, master *Server, name string, n int) []*Server {
	tb.Helper()
	out := make([]*Server, n)
	for i := range out {
		out[i] = allot(tb, sentinel(tb, master, name, n/2+1))
	}
	return out
}

// sentinel returns a Sentinel, not started, that monitors master under
// name and deems it down after 1s without an answer.
func sentinel(tb testing.TB, master *Server, name string, quorum int) *Server {
	tb.Helper()
	dir := tb.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d\nsentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 10000\n", name, master.Port, quorum, name, name)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		tb.Fatal(err)
	}
	return &Server{dir: dir, conf: conf}
}

func startServer(tb testing.TB, s *Server) *Server {
	tb.Helper()
	for attempt := 0; ; attempt++ {
		s.Port = freePort(tb)
		s.Addr = "127.0.0.1:" + strconv.Itoa(s.Port)
		err := s.start(tb)
		if err == nil {
			break
		}
		if attempt == 3 {
			tb.Fatalf("redis-server did not start: %v", err)
		}
	}
	tb.Cleanup(s.Stop)
	return s
}

func (s *Server) start(tb testing.TB) error {
	var args []string
	if s.conf != "" {
		args = append(args, s.conf, "--sentinel")
	}
	args = append(args,
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--daemonize", "no", "--protected-mode", "no",
		"--logfile", filepath.Join(s.dir, "redis.log"))
	if s.conf == "" {
		args = append(args, "--save", "", "--appendonly", "no")
	}
	args = append(args, s.args...)
	s.cmd = exec.Command(binary(tb, "redis-server"), args...)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(s.cmd, s.done)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("exited: %s", lastLines(string(log), 5))
		default:
		}
		if reply, err := Command(s.Addr, "PING"); err == nil && reply == "PONG" {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Stop()
	return fmt.Errorf("no PONG on %s within 5s", s.Addr)
}

// Stop stops the server (SIGTERM, then SIGKILL after 5s) and waits for it.
// It is idempotent.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a frozen server cannot stop
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Kill stops the server at once, as a crash would.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Freeze stops the server's process with SIGSTOP: it keeps its
// connections and answers nothing, so clients meet their timeouts rather
// than a refused connection. Thaw resumes it.
func (s *Server) Freeze() { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }

// Thaw resumes a frozen server with SIGCONT.
func (s *Server) Thaw() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

// Unstarted returns a server that has a free port and a directory but is
// not running: clients find nothing there until Restart starts it. extra
// are more redis-server arguments, as for Start.
func Unstarted(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	return allot(tb, &Server{dir: tb.TempDir(), args: extra})
}

// allot gives s a port that was free a moment ago, and stops s when the
// test ends.
func allot(tb testing.TB, s *Server) *Server {
	tb.Helper()
	s.Port = laterPort(tb)
	s.Addr = "127.0.0.1:" + strconv.Itoa(s.Port)
	tb.Cleanup(s.Stop)
	return s
}

// Restart starts the server again on the same port and directory.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Stop()
	if err := s.start(tb); err != nil {
		tb.Fatalf("restart: %v", err)
	}
}

// StartCluster starts masters redis-server processes in cluster mode and
// joins them with redis-cli --cluster create, then waits until every node
// reports cluster_state:ok.
func StartCluster(tb testing.TB, masters int) []*Server {
	tb.Helper()
	return StartClusterWithReplicas(tb, masters, 0)
}

// StartClusterWithReplicas starts a cluster of masters, each with replicas
// replicas (redis-cli assigns them); the first masters nodes returned are
// the masters as created. A master that stops answering for 2s is failed
// over to its replica.
func StartClusterWithReplicas(tb testing.TB, masters, replicas int) []*Server {
	tb.Helper()
	nodes := make([]*Server, masters*(1+replicas))
	for i := range nodes {
		nodes[i] = Start(tb, clusterArgs...)
	}
	joinCluster(tb, nodes, replicas)
	return nodes
}

// clusterArgs make a redis-server a cluster node that fails its master
// over after 2s without an answer.
var clusterArgs = []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"}

// UnstartedCluster returns the nodes of a cluster of masters, with their
// ports but not running: StartNodes starts them and makes them a cluster.
func UnstartedCluster(tb testing.TB, masters int) []*Server {
	tb.Helper()
	nodes := make([]*Server, masters)
	for i := range nodes {
		nodes[i] = Unstarted(tb, clusterArgs...)
	}
	return nodes
}

// StartNodes starts the nodes of UnstartedCluster and joins them into a
// cluster, as StartCluster does.
func StartNodes(tb testing.TB, nodes []*Server) {
	tb.Helper()
	for _, n := range nodes {
		n.Restart(tb)
	}
	joinCluster(tb, nodes, 0)
}

// joinCluster makes running nodes a cluster with redis-cli --cluster
// create, then waits until every node reports cluster_state:ok and every
// replica has synced.
func joinCluster(tb testing.TB, nodes []*Server, replicas int) {
	tb.Helper()
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	out, err := exec.CommandContext(ctx, binary(tb, "redis-cli"), args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range nodes {
		for {
			info, err := Command(n.Addr, "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("cluster node %s not ok: %v %s", n.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Replicas are assigned by redis-cli, and sync after it returns.
	for _, n := range nodes {
		for {
			info, err := Command(n.Addr, "INFO", "replication")
			if err == nil && (strings.Contains(info, "role:master") || strings.Contains(info, "master_link_status:up")) {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("cluster replica %s did not sync: %v %s", n.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// Command sends one command to addr and returns its reply as text: a
// status, an error, a bulk string, or an integer. Arrays are not read.
func Command(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case line == "":
		return "", fmt.Errorf("empty reply")
	case line[0] == '-':
		return "", fmt.Errorf("%s", line[1:])
	case line[0] == '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return line[1:], nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// CommandCalls returns how many times the server at addr ran each command
// since its last CONFIG RESETSTAT, by lower-case name (INFO commandstats).
func CommandCalls(addr string) (map[string]int64, error) {
	info, err := Command(addr, "INFO", "commandstats")
	if err != nil {
		return nil, err
	}
	calls := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if ok && strings.HasPrefix(name, "cmdstat_") {
			n, _, _ := strings.Cut(rest, ",")
			calls[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.ParseInt(n, 10, 64)
		}
	}
	return calls, nil
}

// ScriptStats returns how many script and function calls (EVAL, EVALSHA,
// FCALL) the server at addr ran since its last CONFIG RESETSTAT, and the
// time it spent in them, in µs (INFO commandstats).
func ScriptStats(addr string) (calls int64, usec float64, err error) {
	info, err := Command(addr, "INFO", "commandstats")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_eval" && name != "cmdstat_evalsha" && name != "cmdstat_fcall") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				n, _ := strconv.ParseInt(v, 10, 64)
				calls += n
			case "usec":
				u, _ := strconv.ParseFloat(v, 64)
				usec += u
			}
		}
	}
	return calls, usec, nil
}
