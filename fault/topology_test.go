package fault

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/admitdev/admit/redistest"
)

var modes = []string{"open", "closed", "local"}

// cli runs redis-cli against addr (following Cluster redirects) and
// returns its output, trimmed.
func cli(addr string, args ...string) (string, error) {
	host, port, _ := strings.Cut(addr, ":")
	out, err := exec.Command("redis-cli", append([]string{"-c", "-h", host, "-p", port}, args...)...).Output()
	return strings.TrimSpace(string(out)), err
}

func isMaster(addr string) bool {
	info, err := redistest.Command(addr, "INFO", "replication")
	return err == nil && strings.Contains(info, "role:master")
}

// waitMaster waits until addr has become a master, and returns when.
func waitMaster(t *testing.T, addr string, within time.Duration) time.Time {
	t.Helper()
	if !waitFor(within, func() bool { return isMaster(addr) }) {
		t.Fatalf("%s was not promoted within %v", addr, within)
	}
	return time.Now()
}

// duringFailover is what a front end may answer while a master is being
// replaced: the mode's answer while it is gone, the store's once the
// replica serves (and, in Cluster, for every slot the failed master did
// not hold).
func duringFailover(mode string) func(string) []string {
	return func(fe string) []string { return append(allowed(mode, fe), "admitted", "refused") }
}

// TestSentinelFailover: 1 master, 1 replica, 3 sentinels; the master is
// killed. Decisions are the store's again within 1s of the promotion, and
// nothing written before the kill is lost (WAIT made the replica hold it).
func TestSentinelFailover(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel() // most of a cell is waiting for a failover
			master := redistest.Start(t)
			replica := redistest.StartReplica(t, master)
			sentinels := redistest.StartSentinels(t, master, "mymaster", 3)
			addrs := make([]string, len(sentinels))
			for i, s := range sentinels {
				addrs[i] = s.Addr
			}
			d := deploy(t, "redis+sentinel://mymaster@"+strings.Join(addrs, ","), mode, true)
			d.prepare()
			if n, err := redistest.Command(master.Addr, "WAIT", "1", "2000"); err != nil || n != "1" {
				t.Fatalf("WAIT for the replica: %q %v", n, err)
			}
			killed := time.Now()
			master.Kill()
			d.duringFault(duringFailover(mode), 5*time.Second)
			// The failover ends when the sentinels name the new master.
			if !waitFor(20*time.Second, func() bool {
				got, err := cli(sentinels[0].Addr, "SENTINEL", "get-master-addr-by-name", "mymaster")
				return err == nil && strings.HasSuffix(got, "\n"+strconv.Itoa(replica.Port))
			}) {
				t.Fatal("the sentinels did not fail over within 20s")
			}
			promoted := time.Now()
			t.Logf("the sentinels named the replica master %v after the kill", promoted.Sub(killed).Round(time.Millisecond))
			report(t, "failover", promoted.Sub(killed))
			d.recovered(promoted, time.Second)
			d.afterFault(true, false, func(key string) (string, error) { return redistest.Command(replica.Addr, "GET", key) })
		})
	}
}

// clusterOwner returns the master that holds the keys of tenant open (it
// finds one by its user "spent"), and that master's replica.
func clusterOwner(t *testing.T, nodes []*redistest.Server) (owner, replica *redistest.Server, key string) {
	t.Helper()
	for _, n := range nodes {
		if !isMaster(n.Addr) {
			continue
		}
		keys, err := cli(n.Addr, "--scan", "--pattern", "*spent*")
		if err == nil && keys != "" {
			owner, key = n, strings.Split(keys, "\n")[0]
		}
	}
	if owner == nil {
		t.Fatal("no master holds tenant open's keys")
	}
	for _, n := range nodes {
		info, err := redistest.Command(n.Addr, "INFO", "replication")
		if err == nil && strings.Contains(info, "master_port:"+strconv.Itoa(owner.Port)+"\r\n") {
			replica = n
		}
	}
	if replica == nil {
		t.Fatal("the owner has no replica")
	}
	return owner, replica, key
}

// TestClusterFailover: 3 masters with a replica each; the master holding
// tenant open's slot is killed and its replica promoted.
func TestClusterFailover(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel() // most of a cell is waiting for a failover
			nodes := redistest.StartClusterWithReplicas(t, 3, 1)
			d := deploy(t, "redis+cluster://"+nodes[0].Addr+","+nodes[1].Addr+","+nodes[2].Addr, mode, true)
			d.prepare()
			owner, replica, _ := clusterOwner(t, nodes)
			if n, err := redistest.Command(owner.Addr, "WAIT", "1", "2000"); err != nil || n != "1" {
				t.Fatalf("WAIT for the replica: %q %v", n, err)
			}
			killed := time.Now()
			owner.Kill()
			d.duringFault(duringFailover(mode), 5*time.Second)
			waitMaster(t, replica.Addr, 20*time.Second)
			// The failover ends when every live node serves all slots
			// again (cluster_state:ok), the promotion known to all.
			if !waitFor(20*time.Second, func() bool {
				for _, n := range nodes {
					if n == owner {
						continue
					}
					if info, err := redistest.Command(n.Addr, "CLUSTER", "INFO"); err != nil || !strings.Contains(info, "cluster_state:ok") {
						return false
					}
				}
				return true
			}) {
				t.Fatal("the cluster did not recover within 20s of the promotion")
			}
			promoted := time.Now()
			t.Logf("the cluster served every slot again %v after the kill", promoted.Sub(killed).Round(time.Millisecond))
			report(t, "failover", promoted.Sub(killed))
			// The store asks the cluster who serves a slot it cannot
			// reach, rather than wait for the client's next refresh of
			// its slot map (delayed at random by up to 1s).
			d.recovered(promoted, time.Second)
			d.afterFault(true, false, func(key string) (string, error) { return cli(replica.Addr, "GET", key) })
		})
	}
}

// TestClusterSlotMigration: tenant open's slot moves to another master
// (MIGRATING/IMPORTING, MIGRATE, SETSLOT NODE) while requests run; they see
// ASK and MOVED, and get nothing but what the mode allows.
func TestClusterSlotMigration(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel() // most of a cell is waiting for a failover
			nodes := redistest.StartCluster(t, 3)
			d := deploy(t, "redis+cluster://"+nodes[0].Addr+","+nodes[1].Addr+","+nodes[2].Addr, mode, true)
			d.prepare()
			var src *redistest.Server
			var key string
			for _, n := range nodes {
				if keys, err := cli(n.Addr, "--scan", "--pattern", "*spent*"); err == nil && keys != "" {
					src, key = n, strings.Split(keys, "\n")[0]
				}
			}
			if src == nil {
				t.Fatal("no master holds tenant open's keys")
			}
			dst := nodes[0]
			if dst == src {
				dst = nodes[1]
			}
			slot, err := redistest.Command(src.Addr, "CLUSTER", "KEYSLOT", key)
			if err != nil {
				t.Fatal(err)
			}
			srcID, _ := redistest.Command(src.Addr, "CLUSTER", "MYID")
			dstID, _ := redistest.Command(dst.Addr, "CLUSTER", "MYID")

			// Load: check requests of fresh users until the slot has moved.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var mu sync.Mutex
			seen := map[string]int{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					mu.Lock()
					u := d.user()
					mu.Unlock()
					code, _ := d.post("/v1/check", "POST", `{"tenant":"open","user":"`+u+`"}`, "")
					mu.Lock()
					seen[httpOutcome(code)]++
					mu.Unlock()
				}
			}()
			must := func(addr string, args ...string) {
				if _, err := redistest.Command(addr, args...); err != nil {
					close(stop)
					wg.Wait()
					t.Fatalf("%v on %s: %v", args, addr, err)
				}
			}
			time.Sleep(100 * time.Millisecond)
			must(dst.Addr, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID)
			must(src.Addr, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID)
			time.Sleep(200 * time.Millisecond) // requests meet ASK while keys are on both sides
			for {
				keys, err := cli(src.Addr, "CLUSTER", "GETKEYSINSLOT", slot, "10")
				if err != nil {
					t.Fatal(err)
				}
				if keys == "" {
					break
				}
				for _, k := range strings.Split(keys, "\n") {
					must(src.Addr, "MIGRATE", "127.0.0.1", strconv.Itoa(dst.Port), k, "0", "5000")
				}
				time.Sleep(20 * time.Millisecond)
			}
			for _, n := range nodes {
				must(n.Addr, "CLUSTER", "SETSLOT", slot, "NODE", dstID)
			}
			time.Sleep(300 * time.Millisecond) // and MOVED once it has
			close(stop)
			wg.Wait()
			t.Logf("answers while slot %s moved: %v", slot, seen)
			report(t, "answers while the slot moved", fmt.Sprint(seen))
			ok := duringFailover(mode)("POST /v1/check")
			for outcome, n := range seen {
				if !slicesContains(ok, outcome) {
					t.Errorf("%d answers %q while the slot moved; want only %v", n, outcome, ok)
				}
			}
			d.recovered(time.Now(), time.Second)
			d.afterFault(true, false, func(key string) (string, error) { return cli(dst.Addr, "GET", key) })
		})
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestTopologyUnreachableAtStart: admit serve and admit proxy start while
// the Sentinels, or every Cluster node, are down. They serve by the mode
// meanwhile, and decide with the store within 1s of the deployment
// answering: the client asks for the topology in the background.
func TestTopologyUnreachableAtStart(t *testing.T) {
	for _, topology := range []string{"sentinel", "cluster"} {
		for _, mode := range modes {
			t.Run(topology+"/"+mode, func(t *testing.T) {
				t.Parallel() // most of a cell is starting Redis processes
				var url string
				var start func()
				switch topology {
				case "sentinel":
					master := redistest.Start(t)
					sentinels := redistest.UnstartedSentinels(t, master, "mymaster", 3)
					addrs := make([]string, len(sentinels))
					for i, s := range sentinels {
						addrs[i] = s.Addr
					}
					url = "redis+sentinel://mymaster@" + strings.Join(addrs, ",")
					start = func() {
						for _, s := range sentinels {
							s.Restart(t)
						}
					}
				case "cluster":
					nodes := redistest.UnstartedCluster(t, 3)
					url = "redis+cluster://" + nodes[0].Addr + "," + nodes[1].Addr + "," + nodes[2].Addr
					start = func() { redistest.StartNodes(t, nodes) }
				}
				d := deploy(t, url, mode, false)
				d.duringFault(faultAnswers(mode, false, true), 5*time.Second)
				if mode == "local" {
					d.localLimits()
				}
				start()
				d.recovered(time.Now(), time.Second)
				d.afterFault(false, true, nil)
			})
		}
	}
}
