package curator_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
	cut "curia.dev/services/curator/curatortest"
)

// hbSender plays a node agent's heartbeat loop: a stream to one of the
// given curators (in turn), a heartbeat every tick, and a new stream
// whenever one fails.
type hbSender struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	acks     int
	interval int64 // interval_millis of the last answer
}

func hbStart(t *testing.T, clients []curatorv1.CuratorClient, every time.Duration) *hbSender {
	ctx, cancel := context.WithCancel(context.Background())
	h := &hbSender{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			h.stream(ctx, clients[i%len(clients)], tick.C)
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(h.stop)
	return h
}

func (h *hbSender) stream(ctx context.Context, cl curatorv1.CuratorClient, tick <-chan time.Time) {
	st, err := cl.Heartbeat(ctx)
	if err != nil {
		return
	}
	for {
		if err := st.Send(&curatorv1.HeartbeatRequest{}); err != nil {
			return
		}
		resp, err := st.Recv()
		if err != nil {
			return
		}
		h.mu.Lock()
		h.acks++
		h.interval = resp.IntervalMillis
		h.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
	}
}

// stop ends the stream abruptly (as a node that dies).
func (h *hbSender) stop() {
	h.cancel()
	<-h.done
}

func (h *hbSender) answers() (acks int, interval int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.acks, h.interval
}

// hbOnce sends one heartbeat on a new stream and closes it cleanly.
func hbOnce(ctx context.Context, cl curatorv1.CuratorClient) (*curatorv1.HeartbeatResponse, error) {
	st, err := cl.Heartbeat(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&curatorv1.HeartbeatRequest{}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	resp, err := st.Recv() // on a refused stream: the server's status
	if err != nil {
		return nil, err
	}
	if err := st.CloseSend(); err != nil {
		return nil, err
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("after CloseSend: %v, want EOF", err)
	}
	return resp, nil
}

// hbClients is the node's Curator API through every replica.
func hbClients(c *cut.Cluster, a *cut.Agent) []curatorv1.CuratorClient {
	var out []curatorv1.CuratorClient
	for _, cur := range c.Curators {
		out = append(out, a.Curator(cur))
	}
	return out
}

// hbWant polls until node id has the health wanted, and returns the node.
func hbWant(t *testing.T, c *cut.Cluster, id string, want curatorv1.NodeHealth) *curatorv1.Node {
	t.Helper()
	var n *curatorv1.Node
	proctest.Eventually(t, time.Minute, func() error {
		nodes, err := hbList(c.Management())
		if err != nil {
			return err
		}
		if n = nodes[id]; n.GetHealth() != want {
			return fmt.Errorf("node %s is %v, want %v", id, n.GetHealth(), want)
		}
		return nil
	})
	return n
}

// hbList is GetNodes, errors returned.
func hbList(m curatorv1.ManagementClient) (map[string]*curatorv1.Node, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := m.GetNodes(ctx, &curatorv1.GetNodesRequest{})
	if err != nil {
		return nil, err
	}
	out := map[string]*curatorv1.Node{}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		for _, n := range resp.Nodes {
			out[n.Id] = n
		}
	}
}

// hbNow returns node id's health now.
func hbNow(t *testing.T, c *cut.Cluster, id string) *curatorv1.Node {
	t.Helper()
	n := getNodes(t, c.Management(), "")[id]
	if n == nil {
		t.Fatalf("node %s not listed", id)
	}
	return n
}

// TestHeartbeatHealth: UNKNOWN before any heartbeat, HEALTHY while
// heartbeating, HEARTBEAT_TIMEOUT once the heartbeats stop; all of it kept
// across a curator leader change. Only UP nodes heartbeat, each as itself.
func TestHeartbeatHealth(t *testing.T) {
	c := cut.New(t, 2, "--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s")
	ctx := ctxT(t)
	boot := c.Voters[0].ID
	a, b := c.NewAgent(), c.NewAgent()
	a.Enrol(ctx)
	b.Enrol(ctx)

	for _, id := range []string{boot, a.ID, b.ID} {
		if n := hbNow(t, c, id); n.Health != curatorv1.NodeHealth_NODE_HEALTH_UNKNOWN || n.LastHeartbeat != nil {
			t.Fatalf("before any heartbeat, %s is %v (last %v), want UNKNOWN", id, n.Health, n.LastHeartbeat)
		}
	}

	// a heartbeats (through both replicas in turn when one fails): it is
	// HEALTHY, and nobody else is — a node heartbeats only as itself.
	ha := hbStart(t, hbClients(c, a), 200*time.Millisecond)
	started := time.Now()
	n := hbWant(t, c, a.ID, curatorv1.NodeHealth_NODE_HEALTH_HEALTHY)
	if lh := n.LastHeartbeat.AsTime(); lh.Before(started.Add(-time.Second)) || lh.After(time.Now()) {
		t.Fatalf("last heartbeat %v, want after %v", lh, started)
	}
	// The answer follows the write that made a HEALTHY: poll for it.
	proctest.Eventually(t, 10*time.Second, func() error {
		if _, interval := ha.answers(); interval != 200 {
			return fmt.Errorf("interval_millis %d, want 200", interval)
		}
		return nil
	})
	for _, id := range []string{boot, b.ID} {
		if h := hbNow(t, c, id).Health; h != curatorv1.NodeHealth_NODE_HEALTH_UNKNOWN {
			t.Fatalf("%s is %v while only %s heartbeats", id, h, a.ID)
		}
	}

	// b sends one heartbeat and falls silent: HEARTBEAT_TIMEOUT after the
	// timeout, with the exact time of that heartbeat; a stays HEALTHY.
	before := time.Now()
	if _, err := hbOnce(ctx, b.Curator(c.Running())); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	n = hbWant(t, c, b.ID, curatorv1.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT)
	t.Logf("b timed out %v after its heartbeat (timeout 1s)", time.Since(after).Round(time.Millisecond))
	if lh := n.LastHeartbeat.AsTime(); lh.Before(before) || lh.After(after) {
		t.Fatalf("timed-out node's last heartbeat %v, want between %v and %v", lh, before, after)
	}
	bLast := n.LastHeartbeat.AsTime()
	if h := hbNow(t, c, a.ID).Health; h != curatorv1.NodeHealth_NODE_HEALTH_HEALTHY {
		t.Fatalf("a is %v while heartbeating", h)
	}

	// a's stream dies: HEARTBEAT_TIMEOUT; it comes back: HEALTHY.
	ha.stop()
	hbWant(t, c, a.ID, curatorv1.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT)
	hbStart(t, hbClients(c, a), 200*time.Millisecond)
	hbWant(t, c, a.ID, curatorv1.NodeHealth_NODE_HEALTH_HEALTHY)

	// The leader dies while a heartbeats. The next leader knows what the
	// last one knew: a is HEALTHY (its agent reconnects), b timed out (not
	// UNKNOWN, with its last heartbeat), the bootstrap node never sent one.
	old := c.Leader()
	old.Kill()
	next := c.Leader()
	t.Logf("leader %s killed, %s leads", old.Name, next.Name)
	hbWant(t, c, a.ID, curatorv1.NodeHealth_NODE_HEALTH_HEALTHY)
	n = hbNow(t, c, b.ID)
	if n.Health != curatorv1.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT || !n.LastHeartbeat.AsTime().Equal(bLast) {
		t.Fatalf("after failover b is %v (last %v), want HEARTBEAT_TIMEOUT (last %v)", n.Health, n.LastHeartbeat.AsTime(), bLast)
	}
	if h := hbNow(t, c, boot).Health; h != curatorv1.NodeHealth_NODE_HEALTH_UNKNOWN {
		t.Fatalf("after failover the bootstrap node is %v, want UNKNOWN", h)
	}

	// Who may heartbeat: nodes only, with their node certificate, and only
	// UP nodes that exist.
	_, err := hbOnce(ctx, curatorv1.NewCuratorClient(c.Conn(next, cut.Admin)))
	wantCode(t, err, codes.PermissionDenied, "")

	fresh := c.NewAgent() // registered: NEW, no node certificate yet
	ticket, err := c.Management().GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Enrolling(next).RegisterNode(ctx, &curatorv1.RegisterNodeRequest{RegisterTicket: ticket.Ticket, PublicKey: fresh.Key.Public().(ed25519.PublicKey)}); err != nil {
		t.Fatal(err)
	}
	_, err = hbOnce(ctx, fresh.Enrolling(next))
	wantCode(t, err, codes.PermissionDenied, "enrolling")
	// Even with a node certificate (which a NEW node cannot have) a NEW
	// node is refused, and so is a node that does not exist.
	_, err = hbOnce(ctx, hbAsNode(t, c, next, fresh.ID))
	wantCode(t, err, codes.FailedPrecondition, "NODE_STATE_NEW")
	_, ghost := newKey(t)
	_, err = hbOnce(ctx, hbAsNode(t, c, next, ghost))
	wantCode(t, err, codes.FailedPrecondition, "does not exist")
	if h := hbNow(t, c, fresh.ID).Health; h != curatorv1.NodeHealth_NODE_HEALTH_UNKNOWN {
		t.Fatalf("refused node is %v, want UNKNOWN", h)
	}
}

// hbAsNode is the Curator API with a node certificate for id straight from
// the test CA.
func hbAsNode(t *testing.T, c *cut.Cluster, cur *cut.Curator, id string) curatorv1.CuratorClient {
	cc, err := rpc.Dial(cur.Addr, rpc.ClientConfig{
		Credentials: c.PKI.Creds(t, pki.Principal{Kind: pki.KindNode, Name: id}),
		ServerKinds: []pki.Kind{pki.KindCurator},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return curatorv1.NewCuratorClient(cc)
}

// TestHealthSurvivesFailover: health is in etcd, not in the leader's
// memory. Right after the leader dies — before the node has reached the
// next one — the next leader reports the node HEALTHY with the last
// heartbeat the dead one recorded.
func TestHealthSurvivesFailover(t *testing.T) {
	c := cut.New(t, 2, "--heartbeat-interval", "200ms", "--heartbeat-timeout", "10s")
	ctx := ctxT(t)
	a := c.NewAgent()
	a.Enrol(ctx)
	old := c.Leader()

	// Heartbeats to the leader only: when it dies, they stop.
	ha := hbStart(t, []curatorv1.CuratorClient{a.Curator(old)}, 200*time.Millisecond)
	before := hbWant(t, c, a.ID, curatorv1.NodeHealth_NODE_HEALTH_HEALTHY).LastHeartbeat.AsTime()
	proctest.Eventually(t, time.Minute, func() error {
		if acks, _ := ha.answers(); acks < 5 {
			return fmt.Errorf("%d heartbeats answered", acks)
		}
		return nil
	})
	old.Kill()
	killed := time.Now()
	next := c.Leader()
	acks, _ := ha.answers()
	t.Logf("leader %s killed after %d heartbeats, %s leads after %v", old.Name, acks, next.Name, time.Since(killed).Round(time.Millisecond))

	n := hbNow(t, c, a.ID)
	if n.Health != curatorv1.NodeHealth_NODE_HEALTH_HEALTHY {
		t.Fatalf("after failover (%v after the kill), %s is %v, want HEALTHY", time.Since(killed), a.ID, n.Health)
	}
	if lh := n.LastHeartbeat.AsTime(); lh.Before(before) || lh.After(killed) {
		t.Fatalf("after failover, last heartbeat %v, want between %v and the kill at %v", lh, before, killed)
	}
	ha.stop()

	// The node reaches the next leader: HEALTHY, with a heartbeat recorded
	// after the kill.
	hbStart(t, []curatorv1.CuratorClient{a.Curator(next)}, 200*time.Millisecond)
	proctest.Eventually(t, time.Minute, func() error {
		nodes, err := hbList(c.Management())
		if err != nil {
			return err
		}
		n := nodes[a.ID]
		if n.GetHealth() != curatorv1.NodeHealth_NODE_HEALTH_HEALTHY || !n.LastHeartbeat.AsTime().After(killed) {
			return fmt.Errorf("%s is %v, last heartbeat %v", a.ID, n.Health, n.LastHeartbeat.AsTime())
		}
		return nil
	})
}

// hbWatchHealth watches node id on cur (as the node itself) and sends
// each health it is seen in, with when it was seen, until ctx ends.
func hbWatchHealth(ctx context.Context, t *testing.T, cl curatorv1.CuratorClient, id string) <-chan hbSeen {
	t.Helper()
	st, err := cl.Watch(ctx, &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_NodeId{NodeId: id}})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan hbSeen, 100)
	go func() {
		defer close(out)
		for {
			resp, err := st.Recv()
			if err != nil {
				return
			}
			for _, n := range resp.Nodes {
				if n.Id == id {
					out <- hbSeen{n.Health, n.LastHeartbeat.AsTime(), time.Now()}
				}
			}
		}
	}()
	return out
}

type hbSeen struct {
	health curatorv1.NodeHealth
	last   time.Time
	at     time.Time
}

// TestHeartbeatTimeoutBound: a node that falls silent is HEARTBEAT_TIMEOUT
// within the timeout plus a bounded lag, on the leader and on a follower:
// the leader's timer for the node writes the change at once, not at the
// next periodic write of the shards (timeout/2 later).
func TestHeartbeatTimeoutBound(t *testing.T) {
	const timeout, bound = 2 * time.Second, 500 * time.Millisecond
	c := cut.New(t, 2, "--heartbeat-interval", "200ms", "--heartbeat-timeout", timeout.String())
	ctx := ctxT(t)
	a := c.NewAgent()
	a.Enrol(ctx)
	leader := c.Leader()
	var seen []<-chan hbSeen
	for _, cur := range c.Curators {
		seen = append(seen, hbWatchHealth(ctx, t, a.Curator(cur), a.ID))
	}
	if _, err := hbOnce(ctx, a.Curator(leader)); err != nil {
		t.Fatal(err)
	}
	lastBeat := time.Now()
	for i, ch := range seen {
		var timedOut, last time.Time
		for s := range ch {
			if s.health == curatorv1.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT {
				timedOut, last = s.at, s.last
				if s.last.After(lastBeat) || lastBeat.Sub(s.last) > time.Second {
					t.Fatalf("replica %d: last heartbeat %v, want just before %v", i, s.last, lastBeat)
				}
				break
			}
		}
		if timedOut.IsZero() {
			t.Fatalf("replica %d: the watch ended before the node timed out", i)
		}
		lag := timedOut.Sub(last) - timeout
		t.Logf("replica %d: HEARTBEAT_TIMEOUT seen %v after the last beat's timeout", i, lag.Round(100*time.Microsecond))
		if lag < -50*time.Millisecond || lag > bound {
			t.Fatalf("replica %d: HEARTBEAT_TIMEOUT %v after the timeout, want within [0, %v]", i, lag, bound)
		}
	}
}

// TestHeartbeatNoWritePerBeat: nodes that beat often cost etcd a write of
// their shard every timeout/2, whatever their number and rate; no write
// per beat, none per node.
func TestHeartbeatNoWritePerBeat(t *testing.T) {
	const timeout = 2 * time.Second
	c := cut.New(t, 1, "--heartbeat-interval", "50ms", "--heartbeat-timeout", timeout.String())
	ctx := ctxT(t)
	cli := c.Etcd(c.Voters[0].ClientURL)
	var senders []*hbSender
	var ids []string
	for range 4 {
		a := c.NewAgent()
		a.Enrol(ctx)
		senders = append(senders, hbStart(t, hbClients(c, a), 50*time.Millisecond))
		ids = append(ids, a.ID)
	}
	for _, id := range ids {
		hbWant(t, c, id, curatorv1.NodeHealth_NODE_HEALTH_HEALTHY)
	}
	rev := func() (int64, int) {
		resp, err := cli.Get(ctx, "/curia/nothing")
		if err != nil {
			t.Fatal(err)
		}
		acks := 0
		for _, s := range senders {
			n, _ := s.answers()
			acks += n
		}
		return resp.Header.Revision, acks
	}
	rev0, acks0 := rev()
	start := time.Now()
	// A window of 3 shard periods (timeout/2 each), counted in beats.
	proctest.Eventually(t, time.Minute, func() error {
		if time.Since(start) < 3*timeout/2 {
			return fmt.Errorf("window not over")
		}
		return nil
	})
	rev1, acks1 := rev()
	writes, beats := rev1-rev0, acks1-acks0
	t.Logf("%d beats of %d nodes in %v: %d etcd writes", beats, len(ids), time.Since(start).Round(time.Millisecond), writes)
	if beats < 4*len(ids) {
		t.Fatalf("only %d beats in the window", beats)
	}
	// 3 periodic writes, one more for the window's edges, and one for
	// anything else the cluster writes.
	if writes > 5 {
		t.Fatalf("%d etcd writes for %d beats, want at most 5 (one a timeout/2)", writes, beats)
	}
	for _, id := range ids {
		if h := hbNow(t, c, id).Health; h != curatorv1.NodeHealth_NODE_HEALTH_HEALTHY {
			t.Fatalf("%s is %v while beating", id, h)
		}
	}
}

// TestHeartbeatFailoverKeepsBeatingNodes: a leader change longer than the
// heartbeat timeout (the session TTL is 2 s, the timeout 1.5 s) marks no
// node that beats again timed out: the next leader gives every HEALTHY node
// one full timeout from when it loads the shards. Seen on a Watch of the
// surviving replica from before the kill until the node is back.
func TestHeartbeatFailoverKeepsBeatingNodes(t *testing.T) {
	c := cut.New(t, 2, "--heartbeat-interval", "100ms", "--heartbeat-timeout", "1500ms")
	ctx := ctxT(t)
	a := c.NewAgent()
	a.Enrol(ctx)
	hbStart(t, hbClients(c, a), 100*time.Millisecond)
	hbWant(t, c, a.ID, curatorv1.NodeHealth_NODE_HEALTH_HEALTHY)
	old := c.Leader()
	var next *cut.Curator
	for _, cur := range c.Curators {
		if cur != old {
			next = cur
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	seen := hbWatchHealth(wctx, t, a.Curator(next), a.ID)
	if s := <-seen; s.health != curatorv1.NodeHealth_NODE_HEALTH_HEALTHY {
		t.Fatalf("before the kill: %v", s.health)
	}
	old.Kill()
	killed := time.Now()
	if c.Leader() != next {
		t.Fatal("the surviving replica does not lead")
	}
	t.Logf("%s leads %v after the kill", next.Name, time.Since(killed).Round(time.Millisecond))
	// HEALTHY throughout, until a beat after the kill is recorded (the
	// next periodic write) and a further timeout has passed.
	deadline := time.After(time.Minute)
	back := time.Time{}
	for back.IsZero() || time.Since(back) < 2*time.Second {
		select {
		case s, ok := <-seen:
			if !ok {
				t.Fatal("watch ended")
			}
			if s.health != curatorv1.NodeHealth_NODE_HEALTH_HEALTHY {
				t.Fatalf("%v after the kill the node is %v, want HEALTHY throughout", s.at.Sub(killed), s.health)
			}
		case <-deadline:
			t.Fatal("the node's beats never reached the next leader")
		case <-time.After(100 * time.Millisecond):
		}
		if back.IsZero() {
			if n := hbNow(t, c, a.ID); n.Health == curatorv1.NodeHealth_NODE_HEALTH_HEALTHY && n.LastHeartbeat.AsTime().After(killed) {
				back = time.Now()
			} else if n.Health != curatorv1.NodeHealth_NODE_HEALTH_HEALTHY {
				t.Fatalf("%v after the kill the node is %v, want HEALTHY throughout", time.Since(killed), n.Health)
			}
		}
	}
}

// TestHeartbeatLegacyKeys: the per-node heartbeat keys of older curators
// keep working. The hub serves them until a leader reads them into the
// shards (once, when it starts leading) and deletes them: a node that was
// HEALTHY gets a timeout to beat, one that had timed out stays so with its
// last heartbeat.
func TestHeartbeatLegacyKeys(t *testing.T) {
	c := cut.New(t, 2, "--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s")
	ctx := ctxT(t)
	cli := c.Etcd(c.Voters[0].ClientURL)
	a, b := c.NewAgent(), c.NewAgent()
	a.Enrol(ctx)
	b.Enrol(ctx)
	aAt := time.Now().Add(-time.Second).UTC().Truncate(time.Millisecond)
	bAt := aAt.Add(-time.Hour)
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	stamp := func(at time.Time) string { return at.Format(time.RFC3339Nano) }
	if _, err := cli.Txn(ctx).Then(
		clientv3.OpPut(keys.Heartbeat(a.ID), stamp(aAt), clientv3.WithLease(lease.ID)),
		clientv3.OpPut(keys.HeartbeatSeen(a.ID), stamp(aAt)),
		clientv3.OpPut(keys.HeartbeatSeen(b.ID), stamp(bAt)),
	).Commit(); err != nil {
		t.Fatal(err)
	}
	if n := hbWant(t, c, a.ID, curatorv1.NodeHealth_NODE_HEALTH_HEALTHY); !n.LastHeartbeat.AsTime().Equal(aAt) {
		t.Fatalf("a's last heartbeat %v, want %v", n.LastHeartbeat.AsTime(), aAt)
	}
	if n := hbWant(t, c, b.ID, curatorv1.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT); !n.LastHeartbeat.AsTime().Equal(bAt) {
		t.Fatalf("b's last heartbeat %v, want %v", n.LastHeartbeat.AsTime(), bAt)
	}

	// The next leader reads the keys into the shards and deletes them.
	c.Leader().Kill()
	c.Leader()
	proctest.Eventually(t, time.Minute, func() error {
		resp, err := cli.Get(ctx, keys.HeartbeatsPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		seen, err := cli.Get(ctx, keys.HeartbeatsSeenPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		if resp.Count+seen.Count > 0 {
			return fmt.Errorf("%d per-node heartbeat keys left", resp.Count+seen.Count)
		}
		return nil
	})
	shards, err := cli.Get(ctx, keys.HeartbeatShardsPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(shards.Kvs) != 1 || !strings.Contains(string(shards.Kvs[0].Value), a.ID) || !strings.Contains(string(shards.Kvs[0].Value), b.ID) {
		t.Fatalf("heartbeat shards after the move: %v", shards.Kvs)
	}
	if n := hbNow(t, c, b.ID); n.Health != curatorv1.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT || !n.LastHeartbeat.AsTime().Equal(bAt) {
		t.Fatalf("after the move b is %v (last %v), want HEARTBEAT_TIMEOUT (last %v)", n.Health, n.LastHeartbeat.AsTime(), bAt)
	}
	// a does not beat: it times out a timeout after the move, its last
	// heartbeat the one the old keys held.
	if n := hbWant(t, c, a.ID, curatorv1.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT); !n.LastHeartbeat.AsTime().Equal(aAt) {
		t.Fatalf("a's last heartbeat %v, want %v", n.LastHeartbeat.AsTime(), aAt)
	}
}
