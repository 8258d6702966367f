package curator_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/records"
	cut "curia.dev/services/curator/curatortest"
)

// seedNodes writes n UP nodes straight into etcd.
func seedNodes(b *testing.B, cli *clientv3.Client, n int) []string {
	return cut.SeedNodes(b, cli, n)
}

// BenchmarkGetNodes10k streams all of 10,000 nodes through the curator
// leader.
func BenchmarkGetNodes10k(b *testing.B) {
	c := cut.New(b, 1)
	seedNodes(b, c.Etcd(c.Voters[0].ClientURL), 10_000)
	m := c.Management()
	var toFirst time.Duration // call → first message, over the measured calls
	getAll := func() {
		begun := time.Now()
		stream, err := m.GetNodes(context.Background(), &curatorv1.GetNodesRequest{})
		if err != nil {
			b.Fatal(err)
		}
		got := 0
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			if got == 0 {
				toFirst += time.Since(begun)
			}
			got += len(resp.Nodes)
		}
		if got != 10_001 {
			b.Fatalf("streamed %d nodes, want 10001", got)
		}
	}
	getAll() // warm: connections, etcd's and the processes' caches
	toFirst = 0
	for b.Loop() {
		getAll()
	}
	b.ReportMetric(float64(10_001*b.N)/b.Elapsed().Seconds(), "nodes/s")
	b.ReportMetric(float64(toFirst)/float64(time.Millisecond)/float64(b.N), "ms/first-message")
}

// BenchmarkListNodes10k lists all of 10,000 seeded nodes (and the
// bootstrap node) through ListNodes on the curator leader, page after page
// of the default 500, in the BASIC and the FULL view. Every seeded node
// carries the bootstrap node's consensus_member role, its member
// certificate and the join's CA certificate and CRL: the most certificate
// bytes a listing can hold, what BASIC leaves out. resp-bytes/op is the
// size of the pages (protobuf), as the client received them.
func BenchmarkListNodes10k(b *testing.B) {
	const nodes = 10_001
	c := cut.New(b, 1)
	m := c.Management()
	ctx := context.Background()
	boot, err := m.ListNodes(ctx, &curatorv1.ListNodesRequest{View: curatorv1.NodeView_NODE_VIEW_FULL})
	if err != nil || len(boot.Nodes) != 1 || len(boot.Nodes[0].GetRoles().GetConsensusMember().GetMemberCertificate()) == 0 {
		b.Fatalf("the bootstrap node: %v, %v", boot, err)
	}
	member := boot.Nodes[0].Roles.ConsensusMember
	cut.SeedNodesWith(b, c.Etcd(c.Voters[0].ClientURL), nodes-1, func(n *curatorv1.Node) {
		n.Roles = &curatorv1.Roles{ConsensusMember: member}
	})
	for _, view := range []curatorv1.NodeView{curatorv1.NodeView_NODE_VIEW_BASIC, curatorv1.NodeView_NODE_VIEW_FULL} {
		b.Run("view="+strings.TrimPrefix(view.String(), "NODE_VIEW_"), func(b *testing.B) {
			var size int
			listAll := func() {
				size = 0
				req := &curatorv1.ListNodesRequest{View: view}
				got := 0
				for {
					resp, err := m.ListNodes(ctx, req)
					if err != nil {
						b.Fatal(err)
					}
					got += len(resp.Nodes)
					size += proto.Size(resp)
					if req.PageToken = resp.NextPageToken; req.PageToken == "" {
						break
					}
				}
				if got != nodes {
					b.Fatalf("listed %d nodes, want %d", got, nodes)
				}
			}
			listAll() // warm: connections, caches
			b.ReportAllocs()
			for b.Loop() {
				listAll()
			}
			b.ReportMetric(float64(size), "resp-bytes/op")
			b.ReportMetric(float64(nodes*b.N)/b.Elapsed().Seconds(), "nodes/s")
		})
	}
}

// BenchmarkRoleUpdates compares non-membership role updates per second
// through the curator (UpdateNodeRoles kubernetes_worker, term-guarded and
// audited) with raw guarded etcd transactions of the same record, at the
// same concurrency, and reports the ratio (over every round: one b.Loop
// round runs both).
func BenchmarkRoleUpdates(b *testing.B) {
	const workers, perWorker = 8, 50
	c := cut.New(b, 1)
	cli := c.Etcd(c.Voters[0].ClientURL)
	ids := seedNodes(b, cli, workers)
	m := c.Management()
	ctx := context.Background()

	run := func(op func(id string, i int) error) time.Duration {
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		begun := time.Now()
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perWorker {
					if err := op(ids[w], i); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		return time.Since(begun)
	}
	viaCurator := func(id string, i int) error {
		_, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: id, KubernetesWorker: new(i%2 == 0)})
		return err
	}
	rawEtcd := func(id string, i int) error {
		resp, err := cli.Get(ctx, keys.Node(id))
		if err != nil {
			return err
		}
		n, err := records.DecodeNode(resp.Kvs[0].Value)
		if err != nil {
			return err
		}
		n.Roles = &curatorv1.Roles{}
		if i%2 == 0 {
			n.Roles.KubernetesWorker = &curatorv1.KubernetesWorker{}
		}
		v, _ := records.EncodeNode(n)
		_, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(keys.Node(id)), "=", resp.Kvs[0].ModRevision)).
			Then(clientv3.OpPut(keys.Node(id), string(v))).Commit()
		return err
	}
	// Side by side: every round runs both, in turns which goes first (a
	// machine that gets busier or quieter during a round favours neither),
	// and the rates are over every round.
	var curatorTime, etcdTime time.Duration
	round := 0
	for b.Loop() {
		if round%2 == 0 {
			curatorTime += run(viaCurator)
			etcdTime += run(rawEtcd)
		} else {
			etcdTime += run(rawEtcd)
			curatorTime += run(viaCurator)
		}
		round++
	}
	ops := float64(workers * perWorker * round)
	b.ReportMetric(ops/curatorTime.Seconds(), "curator-updates/s")
	b.ReportMetric(ops/etcdTime.Seconds(), "etcd-txns/s")
	b.ReportMetric(etcdTime.Seconds()/curatorTime.Seconds(), "ratio")
}

// BenchmarkCuratorFailover kills -9 the curator leader of two replicas
// (the default session TTL, 5 s) and measures the time until an admin
// call through the other replica is answered (GetClusterConfig, which
// only a leader serves: the other replica once it leads): ms/failover,
// and ms/over-ttl beyond the session TTL, for which a crashed leader's
// session outlives it by design.
func BenchmarkCuratorFailover(b *testing.B) {
	const ttl = 5 * time.Second
	c := cut.New(b, 2, "--session-ttl", ttl.String())
	var took time.Duration
	for b.Loop() {
		b.StopTimer()
		leader := c.Leader()
		other := c.Curators[0]
		if other == leader {
			other = c.Curators[1]
		}
		c.Serving(other)
		m := curatorv1.NewManagementClient(c.Conn(other, cut.Admin))
		b.StartTimer()
		begun := time.Now()
		leader.Kill()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := m.GetClusterConfig(ctx, &curatorv1.GetClusterConfigRequest{})
			cancel()
			if err == nil {
				break
			}
			if time.Since(begun) > time.Minute {
				b.Fatalf("no admin call answered within a minute of the leader's kill: %v", err)
			}
			time.Sleep(10 * time.Millisecond) // a poll's interval
		}
		took += time.Since(begun)
		b.StopTimer()
		leader.Start()
		c.Serving(leader)
		b.StartTimer()
	}
	ms := float64(took.Microseconds()) / 1000 / float64(b.N)
	b.ReportMetric(ms, "ms/failover")
	b.ReportMetric(ms-float64(ttl.Milliseconds()), "ms/over-ttl")
}
