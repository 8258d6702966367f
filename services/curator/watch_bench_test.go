package curator_test

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	cut "curia.dev/services/curator/curatortest"
)

// BenchmarkWatchFanout opens 1,000 and 10,000 all_nodes Watch streams on
// one curator (as an admin, over 8 connections: a handful of clients with
// many streams each) and measures, per status change of a node, the time
// from the UpdateNodeStatus call to the change's arrival on every stream
// (ms/delivery-to-all; ms/first-delivery for the first stream;
// ms/delivery-p99 over every stream's delivery of every change;
// ms/delivery-p99-past-write the same counted from the write call's
// return, which is the curator's part: the fan-out). MB-rss is
// the curator process's resident memory with the streams open, MB-rss-idle
// before they were opened, KB-rss/watcher the difference per stream;
// µs-cpu/delivery is the curator's CPU time (user and system) per stream
// per change; ms/write the UpdateNodeStatus call itself (etcd's commit:
// the harness's etcd does not fsync), which every delivery waits for, and
// which the change's own fan-out already shares the cores with. The streams' clients
// run in the benchmark's process, on the same cores as the curator.
func BenchmarkWatchFanout(b *testing.B) {
	for _, streams := range []int{1000, 10_000} {
		b.Run(fmt.Sprintf("watchers=%d", streams), func(b *testing.B) { benchmarkWatchFanout(b, streams) })
	}
}

func benchmarkWatchFanout(b *testing.B, streams int) {
	const conns = 8
	const deadline = 30 * time.Second // per change; the benchmark fails instead of hanging

	c := cut.New(b, 1)
	cur := c.Running()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a := c.NewAgent()
	a.Enrol(ctx)
	node := a.Curator(cur)
	idle := fanoutRSS(b, cur.PID())

	creds := c.PKI.Creds(b, cut.Admin)
	var clients []curatorv1.CuratorClient
	for range conns {
		cc, err := rpc.Dial(cur.Addr, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		clients = append(clients, curatorv1.NewCuratorClient(cc))
	}

	// Every stream reports each version of the node it receives, and
	// when: the time is taken as it arrives, not when the benchmark reads
	// it (a delivery may come before the write's call returns).
	type delivery struct {
		version string
		at      time.Time
	}
	delivered := make(chan delivery, 4*streams)
	opened := make(chan error, streams)
	sctx, scancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { scancel(); wg.Wait() }()
	for i := range streams {
		stream, err := clients[i%conns].Watch(sctx, &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_AllNodes{AllNodes: true}})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			snap, err := stream.Recv()
			if err == nil && !snap.Snapshot {
				err = fmt.Errorf("first response is no snapshot: %v", snap)
			}
			opened <- err
			for err == nil {
				var r *curatorv1.WatchResponse
				if r, err = stream.Recv(); err != nil {
					return
				}
				for _, n := range r.Nodes {
					if n.Id == a.ID {
						delivered <- delivery{n.GetStatus().GetVersion(), time.Now()}
					}
				}
			}
		})
	}
	for range streams {
		if err := <-opened; err != nil {
			b.Fatalf("open watch: %v", err)
		}
	}
	withStreams := fanoutRSS(b, cur.PID())

	var toAll, toFirst, write time.Duration
	var each []time.Duration // every stream's delivery of every change
	var past []time.Duration // the same, from when the write's call returned
	version := 0
	cpu0 := fanoutCPU(b, cur.PID())
	for b.Loop() {
		version++
		v := "fanout-" + strconv.Itoa(version)
		begun := time.Now()
		if _, err := node.UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: &curatorv1.NodeStatus{Version: v}}); err != nil {
			b.Fatal(err)
		}
		wrote := time.Since(begun)
		write += wrote
		timeout := time.After(deadline)
		first, last := time.Duration(math.MaxInt64), time.Duration(0)
		for got := 0; got < streams; got++ {
			select {
			case d := <-delivered:
				if d.version != v {
					b.Fatalf("a stream got version %q while waiting for %q", d.version, v)
				}
				took := d.at.Sub(begun)
				each = append(each, took)
				past = append(past, max(took-wrote, 0))
				first, last = min(first, took), max(last, took)
			case <-timeout:
				b.Fatalf("%d of %d streams got the change within %v", got, streams, deadline)
			}
		}
		toFirst += first
		toAll += last
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(b.N) }
	slices.Sort(each)
	slices.Sort(past)
	b.ReportMetric(float64(each[len(each)*99/100])/float64(time.Millisecond), "ms/delivery-p99")
	b.ReportMetric(float64(past[len(past)*99/100])/float64(time.Millisecond), "ms/delivery-p99-past-write")
	b.ReportMetric(ms(toAll), "ms/delivery-to-all")
	b.ReportMetric(ms(toFirst), "ms/first-delivery")
	b.ReportMetric(ms(write), "ms/write")
	b.ReportMetric(withStreams, "MB-rss")
	b.ReportMetric(idle, "MB-rss-idle")
	b.ReportMetric((withStreams-idle)*1024/float64(streams), "KB-rss/watcher")
	b.ReportMetric(float64((fanoutCPU(b, cur.PID())-cpu0).Microseconds())/float64(b.N*streams), "µs-cpu/delivery")
}

// fanoutCPU is the CPU time (user and system) process pid has used.
func fanoutCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command (which may hold spaces) in parentheses:
	// utime and stime are the 14th and 15th of the line, in clock ticks
	// (100 a second on Linux).
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	var ticks int64
	for _, i := range []int{11, 12} {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// fanoutRSS is the resident memory of process pid in MB (VmRSS).
func fanoutRSS(b *testing.B, pid int) float64 {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				b.Fatalf("VmRSS %q: %v", rest, err)
			}
			return kb / 1024
		}
	}
	b.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}
