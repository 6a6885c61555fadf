package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/admitdev/admit/bench/load"
	"github.com/admitdev/admit/redistest"
)

// measureMemory sends n requests of n distinct users (in load.RLSTenants
// tenants) to each target in turn, on a redis-server emptied before each,
// and prints how much used_memory grew per key Redis then holds.
func measureMemory(redisAddr, domain string, targets []target, n, callers int) error {
	fmt.Printf("rlspeer -memory: %d distinct users in %d tenants, 2 descriptors per request (hourly windows), one redis-server emptied before each target\n", n, load.RLSTenants)
	fmt.Printf("%-22s %10s %14s %14s %12s\n", "target", "keys", "used_memory +", "bytes/key", "requests/s")
	results := map[string]float64{}
	for _, t := range targets {
		if _, err := redistest.Command(redisAddr, "FLUSHALL"); err != nil {
			return err
		}
		before, err := usedMemory(redisAddr)
		if err != nil {
			return err
		}
		start := time.Now()
		if err := sendDistinct(t.addr, domain, n, callers); err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		elapsed := time.Since(start)
		after, err := usedMemory(redisAddr)
		if err != nil {
			return err
		}
		v, err := redistest.Command(redisAddr, "DBSIZE")
		if err != nil {
			return err
		}
		keys, err := strconv.ParseInt(v, 10, 64)
		if err != nil || keys == 0 {
			return fmt.Errorf("DBSIZE: %q", v)
		}
		per := float64(after-before) / float64(keys)
		results[t.name] = per
		sample, err := redistest.Command(redisAddr, "RANDOMKEY")
		if err != nil {
			return err
		}
		value, err := redistest.Command(redisAddr, "GET", sample)
		if err != nil {
			return err
		}
		fmt.Printf("%-22s %10d %14d %14.1f %12.0f   e.g. %q = %q\n", t.name, keys, after-before, per, float64(n)/elapsed.Seconds(), sample, value)
	}
	for _, t := range targets[1:] {
		fmt.Printf("bytes per live key, %s ÷ envoyproxy/ratelimit: %.2f\n", t.name, results[t.name]/results["envoyproxy/ratelimit"])
	}
	return nil
}

// sendDistinct sends one request per user 0..n-1 to the rate limit
// service at addr from callers goroutines, and fails on any answer but OK.
func sendDistinct(addr, domain string, n, callers int) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	c := rlsv3.NewRateLimitServiceClient(cc)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				u := next.Add(1) - 1
				if u >= int64(n) {
					return
				}
				entry := func(k, v string) *rlext.RateLimitDescriptor_Entry {
					return &rlext.RateLimitDescriptor_Entry{Key: k, Value: v}
				}
				t := entry("tenant", "tenant-"+strconv.FormatInt(u%load.RLSTenants, 10))
				req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlext.RateLimitDescriptor{
					{Entries: []*rlext.RateLimitDescriptor_Entry{t}},
					{Entries: []*rlext.RateLimitDescriptor_Entry{t, entry("user", "user-"+strconv.FormatInt(u, 10))}},
				}}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := c.ShouldRateLimit(ctx, req)
				cancel()
				if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
					err = fmt.Errorf("user %d: %v", u, resp.OverallCode)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// usedMemory returns redis-server's used_memory.
func usedMemory(addr string) (int64, error) {
	v, err := redistest.Command(addr, "INFO", "memory")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(v, "\r\n") {
		if x, ok := strings.CutPrefix(line, "used_memory:"); ok {
			return strconv.ParseInt(x, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO memory has no used_memory")
}

// commandStats returns, per command, how many calls redis-server has run
// since its start and the µs they took, by INFO commandstats: the time
// Redis spends running commands, without reading, parsing and replying.
func commandStats(addr string) (map[string][2]int64, error) {
	v, err := redistest.Command(addr, "INFO", "commandstats")
	if err != nil {
		return nil, err
	}
	stats := map[string][2]int64{}
	for line := range strings.SplitSeq(v, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, ok2 := strings.CutPrefix(name, "cmdstat_")
		if !ok || !ok2 {
			continue
		}
		var st [2]int64
		for f := range strings.SplitSeq(fields, ",") {
			k, val, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(val, 10, 64)
			switch k {
			case "calls":
				st[0] = n
			case "usec":
				st[1] = n
			}
		}
		stats[name] = st
	}
	return stats, nil
}

// commandsRun returns the commands clients sent between two commandStats
// and their µs. Redis counts the commands a function runs as well as the
// FCALL that ran them: when FCALLs ran, they alone are the clients'.
func commandsRun(before, after map[string][2]int64) (calls, usec int64) {
	only := ""
	if after["fcall"][0] > before["fcall"][0] {
		only = "fcall"
	}
	for name, a := range after {
		if name == "info" || only != "" && name != only {
			continue
		}
		calls += a[0] - before[name][0]
		usec += a[1] - before[name][1]
	}
	return calls, usec
}
