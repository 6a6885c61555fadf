package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// netns is a network namespace the test made, joined to the host by a
// veth pair: the host's end has hostIP, the namespace's clientIP. A
// client inside reaches servers bound to hostIP from an address that is
// neither loopback nor a server's own.
type netns struct {
	name, hostIP, clientIP string
}

// newNetns makes a namespace and its veth pair, removed when the test
// ends. It needs CAP_SYS_ADMIN (root), as make test runs on this
// project's machines.
func newNetns(t *testing.T) *netns {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	n, _ := rand.Int(rand.Reader, big.NewInt(250))
	sub := n.Int64() + 2
	ns := &netns{name: "admit-" + id, hostIP: fmt.Sprintf("10.231.%d.1", sub), clientIP: fmt.Sprintf("10.231.%d.2", sub)}
	hostEnd, nsEnd := "adm"+id+"h", "adm"+id+"n"
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s (the proxy tests make a network namespace: run them as root, as make test does)", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", ns.name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns.name).Run() })
	run("link", "add", hostEnd, "type", "veth", "peer", "name", nsEnd)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", hostEnd).Run() })
	run("link", "set", nsEnd, "netns", ns.name)
	run("addr", "add", ns.hostIP+"/24", "dev", hostEnd)
	run("link", "set", hostEnd, "up")
	run("netns", "exec", ns.name, "ip", "addr", "add", ns.clientIP+"/24", "dev", nsEnd)
	run("netns", "exec", ns.name, "ip", "link", "set", nsEnd, "up")
	run("netns", "exec", ns.name, "ip", "link", "set", "lo", "up")
	return ns
}

// dial connects from inside the namespace. The socket is made on an OS
// thread moved into the namespace for the moment it takes, and stays in
// it after the thread moves back.
func (ns *netns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	home, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer home.Close()
	target, err := os.Open("/run/netns/" + ns.name)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	conn, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
	if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
		runtime.UnlockOSThread() // else the thread ends with the goroutine
	}
	return conn, err
}

// client is an HTTP client whose connections come from the namespace.
func (ns *netns) client() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: ns.dial, DisableKeepAlives: true}}
}

// TestNetns: a client in the namespace reaches a server on the host's end
// from the namespace's address.
func TestNetns(t *testing.T) {
	ns := newNetns(t)
	ln, err := net.Listen("tcp", ns.hostIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen <- r.RemoteAddr })}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	resp, err := ns.client().Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if host, _, _ := net.SplitHostPort(<-seen); host != ns.clientIP {
		t.Fatalf("the server saw %s, want the namespace's %s", host, ns.clientIP)
	}
}
