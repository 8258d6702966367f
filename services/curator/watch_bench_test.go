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

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

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
// return, which is the curator's part: the fan-out). MB-rss is the
// curator process's resident memory with the streams open, MB-rss-idle
// before they were opened, KB-rss/watcher the difference per stream;
// µs-cpu/delivery is the curator's CPU time (user and system) per stream
// per change; ms/write the UpdateNodeStatus call itself (etcd's commit:
// the harness's etcd does not fsync), which every delivery waits for, and
// which the change's own fan-out already shares the cores with. The
// streams' clients run in the benchmark's process, on the same cores as
// the curator.
//
// The peer, measured side by side in the same rounds: etcd's own watch,
// as many streams (one per watcher, over 8 clients) on one key outside
// curia's, a put of a value the size of the curator's message →
// ms/etcd-delivery-p99 and ms/etcd-delivery-to-all, and ratio-p99-vs-etcd,
// curia's p99 over etcd's. Each round writes both, the order alternating.
func BenchmarkWatchFanout(b *testing.B) {
	for _, streams := range []int{1000, 10_000} {
		b.Run(fmt.Sprintf("watchers=%d", streams), func(b *testing.B) { benchmarkWatchFanout(b, streams) })
	}
}

// fanoutDelivery is one stream's receipt of a change: the version it
// carried, and when it arrived (taken as it arrived, not when the
// benchmark read it: a delivery may come before the write's call returns).
type fanoutDelivery struct {
	version string
	at      time.Time
}

// fanoutSide is one side of the benchmark, curia or etcd: how to write a
// change, where its streams report what they receive, and what was
// measured.
type fanoutSide struct {
	write     func(ctx context.Context, version string) error
	delivered chan fanoutDelivery
	streams   int

	toAll, toFirst, wrote time.Duration
	each                  []time.Duration // every stream's delivery of every change
	past                  []time.Duration // the same, from when the write's call returned
}

// change writes version and waits for every stream to receive it.
func (s *fanoutSide) change(b *testing.B, ctx context.Context, version string) {
	const deadline = 30 * time.Second // the benchmark fails instead of hanging
	begun := time.Now()
	if err := s.write(ctx, version); err != nil {
		b.Fatal(err)
	}
	wrote := time.Since(begun)
	s.wrote += wrote
	timeout := time.After(deadline)
	first, last := time.Duration(math.MaxInt64), time.Duration(0)
	for got := 0; got < s.streams; got++ {
		select {
		case d := <-s.delivered:
			if d.version != version {
				b.Fatalf("a stream got version %q while waiting for %q", d.version, version)
			}
			took := d.at.Sub(begun)
			s.each = append(s.each, took)
			s.past = append(s.past, max(took-wrote, 0))
			first, last = min(first, took), max(last, took)
		case <-timeout:
			b.Fatalf("%d of %d streams got the change within %v", got, s.streams, deadline)
		}
	}
	s.toFirst += first
	s.toAll += last
}

// p99 is the 99th percentile of ds, in ms.
func p99(ds []time.Duration) float64 {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return float64(ds[len(ds)*99/100]) / float64(time.Millisecond)
}

func benchmarkWatchFanout(b *testing.B, streams int) {
	const conns = 8

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
	var etcds []*clientv3.Client
	for range conns {
		cc, err := rpc.Dial(cur.Addr, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		clients = append(clients, curatorv1.NewCuratorClient(cc))
		etcds = append(etcds, c.Etcd(c.Voters[0].ClientURL))
	}

	curia := &fanoutSide{streams: streams, delivered: make(chan fanoutDelivery, 4*streams)}
	curia.write = func(ctx context.Context, v string) error {
		_, err := node.UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: &curatorv1.NodeStatus{Version: v}})
		return err
	}
	opened := make(chan error, 2*streams)
	sctx, scancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { scancel(); wg.Wait() }()
	var size int // of the curator's message for a change, for etcd's value
	var sizeOnce sync.Once
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
			if err == nil {
				sizeOnce.Do(func() { size = proto.Size(snap) })
			}
			opened <- err
			for err == nil {
				var r *curatorv1.WatchResponse
				if r, err = stream.Recv(); err != nil {
					return
				}
				for _, n := range r.Nodes {
					if n.Id == a.ID {
						curia.delivered <- fanoutDelivery{n.GetStatus().GetVersion(), time.Now()}
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

	// etcd's side: the value is the version, then padding to the size of
	// the curator's message.
	const peerKey = "/bench/watch-fanout"
	pad := "|" + strings.Repeat("x", max(size-len("fanout-0000")-1, 0))
	peer := &fanoutSide{streams: streams, delivered: make(chan fanoutDelivery, 4*streams)}
	peer.write = func(ctx context.Context, v string) error {
		_, err := etcds[0].Put(ctx, peerKey, v+pad)
		return err
	}
	for i := range streams {
		// Distinct metadata: etcd's client gives each watcher a gRPC
		// stream of its own, as each curia watcher has, instead of
		// sharing one.
		wctx := metadata.AppendToOutgoingContext(sctx, "watcher", strconv.Itoa(i))
		wch := etcds[i%conns].Watch(clientv3.WithRequireLeader(wctx), peerKey, clientv3.WithCreatedNotify())
		wg.Go(func() {
			created, ok := <-wch
			if !ok || !created.Created {
				opened <- fmt.Errorf("etcd watch not created: %v", created.Err())
				return
			}
			opened <- nil
			for resp := range wch {
				for _, ev := range resp.Events {
					v, _, _ := strings.Cut(string(ev.Kv.Value), "|")
					peer.delivered <- fanoutDelivery{v, time.Now()}
				}
			}
		})
	}
	for range streams {
		if err := <-opened; err != nil {
			b.Fatalf("open etcd watch: %v", err)
		}
	}

	var cpu time.Duration // the curator's, during its own changes
	curiaChange := func(v string) {
		cpu0 := fanoutCPU(b, cur.PID())
		curia.change(b, ctx, v)
		cpu += fanoutCPU(b, cur.PID()) - cpu0
	}
	version := 0
	for b.Loop() {
		version++
		v := "fanout-" + strconv.Itoa(version)
		if version%2 == 0 {
			peer.change(b, ctx, v)
			curiaChange(v)
		} else {
			curiaChange(v)
			peer.change(b, ctx, v)
		}
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(b.N) }
	b.ReportMetric(p99(curia.each), "ms/delivery-p99")
	b.ReportMetric(p99(curia.past), "ms/delivery-p99-past-write")
	b.ReportMetric(ms(curia.toAll), "ms/delivery-to-all")
	b.ReportMetric(ms(curia.toFirst), "ms/first-delivery")
	b.ReportMetric(ms(curia.wrote), "ms/write")
	b.ReportMetric(p99(peer.each), "ms/etcd-delivery-p99")
	b.ReportMetric(ms(peer.toAll), "ms/etcd-delivery-to-all")
	b.ReportMetric(p99(curia.each)/p99(peer.each), "ratio-p99-vs-etcd")
	b.ReportMetric(withStreams, "MB-rss")
	b.ReportMetric(idle, "MB-rss-idle")
	b.ReportMetric((withStreams-idle)*1024/float64(streams), "KB-rss/watcher")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*streams), "µs-cpu/delivery")
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
