package curator_test

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/leaktest"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
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
// Two more sides are measured in the same rounds, with as many streams
// over 8 connections of their own:
//   - the peer, etcd's own watch: streams on one key outside curia's, a
//     put of a value the size of the curator's message →
//     ms/etcd-delivery-p99, ms/etcd-delivery-to-all and ratio-p99-vs-etcd
//     (curia's p99 over etcd's);
//   - the floor, the same fan-out with nothing of the curator but its gRPC
//     server (rpc.NewServer: the same mTLS, interceptors and codec) in a
//     process of its own, this test binary (fanoutFloor): its
//     UpdateNodeStatus marshals one response (the node's id and status)
//     and wakes every Watch stream, which sends it. No etcd write, no hub:
//     what gRPC, TLS and the clients on this machine cost alone →
//     ms/floor-delivery-p99 and ratio-p99-vs-floor (curia's p99 over
//     the floor's, both from the write's call).
//
// Each round changes all three, the order rotating.
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

	var etcds []*clientv3.Client
	for range conns {
		etcds = append(etcds, c.Etcd(c.Voters[0].ClientURL))
	}

	curia := &fanoutSide{streams: streams, delivered: make(chan fanoutDelivery, 4*streams)}
	curia.write = func(ctx context.Context, v string) error {
		_, err := node.UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: &curatorv1.NodeStatus{Version: v}})
		return err
	}
	sctx, scancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { scancel(); wg.Wait() }()
	snap := watchAll(sctx, b, &wg, dialCurators(b, c, cur.Addr, conns), curia, a.ID)
	size := proto.Size(snap) // of the curator's message for a change, for etcd's value
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
	opened := make(chan error, streams)
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

	floor := startFanoutFloor(sctx, b, c, &wg, streams, conns, a.ID)
	// The floor's message carries the node's status as the snapshot has it.
	i := slices.IndexFunc(snap.Nodes, func(n *curatorv1.Node) bool { return n.Id == a.ID })
	if i < 0 {
		b.Fatalf("node %s not in the snapshot", a.ID)
	}
	floor.write = func(ctx context.Context, v string) error {
		st := proto.CloneOf(snap.Nodes[i].GetStatus())
		if st == nil {
			st = &curatorv1.NodeStatus{}
		}
		st.Version = v
		_, err := floor.client.UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: st})
		return err
	}

	// One change each before the rounds, not counted: a stream's first
	// send after its snapshot (stack growth, flow-control windows) is
	// what a round of three changes would otherwise measure.
	sides := []*fanoutSide{curia, peer, &floor.fanoutSide}
	for _, side := range sides {
		side.change(b, ctx, "fanout-0")
		side.each, side.past, side.toAll, side.toFirst, side.wrote = nil, nil, 0, 0, 0
	}
	var cpu time.Duration // the curator's, during its own changes
	version := 0
	for b.Loop() {
		version++
		v := "fanout-" + strconv.Itoa(version)
		for i := range sides {
			side := sides[(version+i)%len(sides)]
			cpu0 := fanoutCPU(b, cur.PID())
			side.change(b, ctx, v)
			if side == curia {
				cpu += fanoutCPU(b, cur.PID()) - cpu0
			}
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
	b.ReportMetric(p99(floor.each), "ms/floor-delivery-p99")
	b.ReportMetric(p99(curia.each)/p99(floor.each), "ratio-p99-vs-floor")
	b.ReportMetric(withStreams, "MB-rss")
	b.ReportMetric(idle, "MB-rss-idle")
	b.ReportMetric((withStreams-idle)*1024/float64(streams), "KB-rss/watcher")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*streams), "µs-cpu/delivery")
}

// fanoutFloorEnv, set, makes this test binary the floor's server
// (TestMain): its arguments are the address, the cluster and the TLS files.
const fanoutFloorEnv = "CURIA_FANOUT_FLOOR"

func TestMain(m *testing.M) {
	if os.Getenv(fanoutFloorEnv) != "" {
		if err := serveFanoutFloor(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "fanout floor:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	leaktest.VerifyTestMain(m)
}

// fanoutFloor is BenchmarkWatchFanout's floor: a curator's gRPC server and
// the least a fan-out does (one marshal per change, one wake-up, a send
// per stream), with nothing of curia behind it.
type fanoutFloor struct {
	curatorv1.UnimplementedCuratorServer
	mu      sync.Mutex
	latest  *rpc.Encoded
	changed chan struct{} // closed and replaced at every change
}

func serveFanoutFloor(args []string) error {
	if len(args) != 5 {
		return fmt.Errorf("want address, cluster, CA, certificate and key; got %q", args)
	}
	creds, err := rpc.LoadCredentials(args[1], rpc.TLSFiles{CA: args[2], Cert: args[3], Key: args[4]})
	if err != nil {
		return err
	}
	admin := rpc.Rule{Allow: []pki.Kind{pki.KindAdmin}}
	srv, err := rpc.NewServer(rpc.ServerConfig{Credentials: creds, Policy: rpc.Policy{
		curatorv1.Curator_Watch_FullMethodName:            admin,
		curatorv1.Curator_UpdateNodeStatus_FullMethodName: admin,
	}})
	if err != nil {
		return err
	}
	curatorv1.RegisterCuratorServer(srv.GRPC(), &fanoutFloor{changed: make(chan struct{})})
	lis, err := net.Listen("tcp", args[0])
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return srv.Serve(ctx, lis)
}

func (f *fanoutFloor) UpdateNodeStatus(_ context.Context, req *curatorv1.UpdateNodeStatusRequest) (*curatorv1.UpdateNodeStatusResponse, error) {
	e, err := rpc.Encode(&curatorv1.WatchResponse{Nodes: []*curatorv1.Node{{Id: req.GetNodeId(), Status: req.GetStatus()}}})
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.latest = e
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
	return &curatorv1.UpdateNodeStatusResponse{}, nil
}

func (f *fanoutFloor) Watch(_ *curatorv1.WatchRequest, stream curatorv1.Curator_WatchServer) error {
	f.mu.Lock()
	changed := f.changed
	f.mu.Unlock()
	if err := stream.Send(&curatorv1.WatchResponse{Snapshot: true}); err != nil {
		return err
	}
	done := stream.Context().Done()
	for {
		select {
		case <-done:
			return nil
		case <-changed:
		}
		f.mu.Lock()
		e := f.latest
		changed = f.changed
		f.mu.Unlock()
		if err := stream.SendMsg(e); err != nil {
			return err
		}
	}
}

// floorSide is the floor's side of the benchmark, and the client its
// changes are written through.
type floorSide struct {
	fanoutSide
	client curatorv1.CuratorClient
}

// startFanoutFloor starts the floor's server and opens streams Watch
// streams on it over conns connections, reporting node id's versions to
// the side.
func startFanoutFloor(ctx context.Context, b *testing.B, c *cut.Cluster, wg *sync.WaitGroup, streams, conns int, id string) *floorSide {
	b.Helper()
	files := c.PKI.Files(b, pki.Principal{Kind: pki.KindCurator})
	addr := proctest.FreeAddr(b)
	p := proctest.New(b, "fanout-floor", os.Args[0], addr, c.PKI.Cluster, files.CA, files.Cert, files.Key)
	p.Env = append(p.Env, fanoutFloorEnv+"=1")
	p.Start()
	floor := &floorSide{fanoutSide: fanoutSide{streams: streams, delivered: make(chan fanoutDelivery, 4*streams)}}
	clients := dialCurators(b, c, addr, conns)
	floor.client = clients[0]
	proctest.Eventually(b, 30*time.Second, func() error { // the server is up
		_, err := floor.client.UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: "node-00000000000000000000000000000000", Status: &curatorv1.NodeStatus{Version: "probe"}})
		return err
	})
	watchAll(ctx, b, wg, clients, &floor.fanoutSide, id)
	return floor
}

// dialCurators opens conns connections to the curator (or the floor) at
// addr, as an admin.
func dialCurators(b *testing.B, c *cut.Cluster, addr string, conns int) []curatorv1.CuratorClient {
	b.Helper()
	creds := c.PKI.Creds(b, cut.Admin)
	var clients []curatorv1.CuratorClient
	for range conns {
		cc, err := rpc.Dial(addr, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		clients = append(clients, curatorv1.NewCuratorClient(cc))
	}
	return clients
}

// watchAll opens side.streams all_nodes Watch streams over clients, in
// turn, and waits until each has sent its snapshot; each then reports to
// side every version of node id it receives, until ctx ends. It returns
// one of the snapshots.
func watchAll(ctx context.Context, b *testing.B, wg *sync.WaitGroup, clients []curatorv1.CuratorClient, side *fanoutSide, id string) *curatorv1.WatchResponse {
	b.Helper()
	snaps := make(chan *curatorv1.WatchResponse, side.streams)
	errs := make(chan error, side.streams)
	for i := range side.streams {
		stream, err := clients[i%len(clients)].Watch(ctx, &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_AllNodes{AllNodes: true}})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			snap, err := stream.Recv()
			if err == nil && !snap.Snapshot {
				err = fmt.Errorf("first response is no snapshot: %v", snap)
			}
			if err != nil {
				errs <- err
				return
			}
			snaps <- snap
			for {
				r, err := stream.Recv()
				if err != nil {
					return
				}
				for _, n := range r.Nodes {
					if n.Id == id {
						side.delivered <- fanoutDelivery{n.GetStatus().GetVersion(), time.Now()}
					}
				}
			}
		})
	}
	var snap *curatorv1.WatchResponse
	for range side.streams {
		select {
		case snap = <-snaps:
		case err := <-errs:
			b.Fatalf("open watch: %v", err)
		}
	}
	return snap
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
