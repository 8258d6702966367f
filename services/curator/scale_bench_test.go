package curator_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/backoff"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/records"
	"curia.dev/platform/rpc"
	"curia.dev/services/curator"
	cut "curia.dev/services/curator/curatortest"
)

// The scale benchmarks: what heartbeats cost as the cluster grows (issue
// "Speed and scale", "Scale, and how cost grows"). Everything is real:
// three consensus processes (a 3-voter etcd), two curator processes, and
// in the benchmark's own process N node agents, each with its own key,
// node certificate and mTLS connection.
//
//	agent 0, 2, 4, … ──mTLS──▶ curator leader ───────────────┐
//	agent 1, 3, 5, … ──mTLS──▶ curator follower ─forwards──▶ │ heartbeats
//	                           (serves the Watch streams      ▼
//	                            of its agents itself)   etcd ×3 voters
//
// Cost is measured over a fixed window of steady state, with the agents
// beating at the curator's default interval and timeout. Nothing here is
// asserted: the figures go to the `make bench` table and the design notes.
const (
	// scaleWindow is one measurement window: two of the default
	// heartbeat's record periods (timeout/2 = 10 s), so that every node
	// records its heartbeat the same number of times whatever its phase.
	scaleWindow = 20 * time.Second
	// rampParallel bounds the agents starting at once (TLS handshake, the
	// Watch snapshot, the first heartbeat): a fleet coming up, not a
	// thundering herd.
	rampParallel = 64
	// rampTimeout bounds the whole ramp: a fleet that has not started by
	// then is measured as it is (agents-started says how far it got).
	rampTimeout = 3 * time.Minute
	// agentRetryMin and agentRetryMax bound an agent's wait before it
	// opens a failed stream again: roleserve's backoff (doubling, with
	// jitter, reset by a stream that worked), so that agents whose
	// streams a leader change broke do not come back in step.
	agentRetryMin = 200 * time.Millisecond
	agentRetryMax = 10 * time.Second
	// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's
	// CPU times: 100 on every Linux architecture curia builds for.
	clockTicks = 100
)

// scaleConsensusFlags give the consensus processes etcd's production
// timing (consensus.DefaultConfig's, written out: importing the consensus
// package would make etcd's server a dependency of the curator's module)
// instead of the tests' fast one (a 50 ms tick, a 500 ms election
// timeout), which a machine loaded by thousands of agents cannot keep:
// etcd's leader stepped down under it. Info logging, not the tests' debug:
// the figures are the cost of production processes.
func scaleConsensusFlags() []string {
	return []string{"--etcd-tick", "100ms", "--etcd-election-timeout", "1s", "--log-level", "info"}
}

// scaleCuratorFlags give the curators their production session TTL (the
// tests' is 2 s) and info logging.
func scaleCuratorFlags() []string {
	return []string{"--session-ttl", curator.DefaultConfig().SessionTTL.String(), "--log-level", "info"}
}

// scaleSizes are the fleet sizes of the issue: 1,000, 5,000 and 10,000
// agents on one curator pair. Sub-benchmarks are named n=1k, n=5k, n=10k,
// so that -bench '…/n=1k' selects one size.
var scaleSizes = []int{1_000, 5_000, 10_000}

// BenchmarkAgents runs N simulated node agents against a curator pair on a
// 3-voter etcd, with the production defaults of etcd's timing, the
// curator's session TTL and its heartbeat interval (5 s) and timeout
// (20 s). Each agent has its own node (seeded UP in etcd), its own
// ed25519 key and node certificate from the cluster CA, its own mTLS
// connection to one curator (half on the leader, half on the follower,
// which forwards heartbeats to the leader), one Heartbeat stream beating
// at the interval the curator asks for, and one Watch stream of its own
// node; a stream that fails is opened again on roleserve's backoff. The
// agents start rampParallel at a time (s/ramp: until every one has its
// watch snapshot and its first heartbeat acknowledged), and the windows
// begin steadyAfter later.
//
// Each b.Loop round is one scaleWindow of steady state:
//
//	%cpu-leader, %cpu-follower  curator CPU (user + system, every thread)
//	                            in % of one core; %cpu-etcd the three
//	                            consensus processes together, %cpu-agents
//	                            the benchmark's own process
//	MB-rss-leader, -follower    resident memory at the window's end
//	etcd-writes/s               etcd revisions per second: every write
//	                            transaction that changes a key bumps the
//	                            revision by exactly one (lease grants,
//	                            renewals and revokes do not)
//	etcd-writes/node/min        the same per node and minute
//	raft-entries/s              etcd's raft index per second: writes plus
//	                            lease grants and revokes
//	beats/s, ms/beat-p99        heartbeats acknowledged, and the p99 of
//	                            send → acknowledgement
//	stream-errors               heartbeat and watch streams that failed
//	                            (and were opened again) in the windows
//	agents-beating              agents with a heartbeat acknowledged in
//	                            the last window (of agents-started by the
//	                            ramp's end)
//
// Two probes run in each window, on agents of the follower: one agent
// stops beating (its stream ends, as when it dies), and GetNodes (filtered
// to its id) is polled until it says HEARTBEAT_TIMEOUT; ms/timeout-over-ttl
// is from its last heartbeat until that answer, less the timeout. A fresh
// agent sends its first heartbeat, and ms/first-beat-healthy is until
// GetNodes says HEALTHY. Each GetNodes reads every node (the filter is
// applied after the read), so ms/getnodes-poll, the mean time of one poll,
// is the probes' resolution. The probes add at most four etcd writes to a
// window of thousands.
func BenchmarkAgents(b *testing.B) {
	raiseFileLimit(b)
	for _, n := range scaleSizes {
		b.Run(fmt.Sprintf("n=%dk", n/1000), func(b *testing.B) { benchAgents(b, n) })
	}
}

func benchAgents(b *testing.B, n int) {
	cfg := curator.DefaultConfig()
	c := cut.NewWithOptions(b, cut.Options{Voters: 3, Curators: 2, ConsensusFlags: scaleConsensusFlags(), CuratorFlags: scaleCuratorFlags()})
	leader := c.Leader()
	follower := c.Curators[0]
	if follower == leader {
		follower = c.Curators[1]
	}
	var urls []string
	for _, v := range c.Voters {
		urls = append(urls, v.ClientURL)
	}
	cli := c.Etcd(urls...)
	m := c.Management()

	ctx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	b.Cleanup(func() { cancel(); running.Wait() })
	st := &agentStats{}
	fleet := newAgents(b, c, cli, n)
	begun := time.Now()
	started := rampAgents(b, ctx, &running, st, fleet, func(i int) *cut.Curator {
		if i%2 == 0 {
			return leader
		}
		return follower
	})
	ramp := time.Since(begun)
	if started == 0 {
		b.Fatalf("no agent of %d started within %v", n, rampTimeout)
	}
	if !pause(ctx, steadyAfter(cfg.HeartbeatInterval, cfg.HeartbeatTimeout)) {
		b.Fatal(ctx.Err())
	}

	var cpuLeader, cpuFollower, cpuEtcd, cpuAgents, wall time.Duration
	var writes int64
	var entries uint64
	var overTTL, firstHealthy, poll time.Duration
	var polls, probed, beating int
	round := 0
	for b.Loop() {
		round++
		// The probes' agents are made outside the window: one seeded
		// node is one etcd write.
		stopped := fleet[2*round-1] // odd: an agent of the follower
		fresh := newAgents(b, c, cli, 1)[0]

		before := snapshot(b, cli, urls[0], leader, follower, c)
		st.record(true)
		window := time.NewTimer(scaleWindow)
		probes := make(chan probeResult, 2)
		go func() { probes <- probeTimeout(ctx, m, stopped, cfg.HeartbeatTimeout) }()
		go func() { probes <- probeFresh(ctx, &running, st, m, fresh, follower) }()
		<-window.C
		st.record(false)
		after := snapshot(b, cli, urls[0], leader, follower, c)
		for range 2 {
			p := <-probes
			if p.err != nil {
				// Measured, not asserted: a fleet too large for the
				// machine fails its probes too; the window's figures say
				// how.
				b.Logf("probe: %v", p.err)
				continue
			}
			overTTL += p.overTTL
			firstHealthy += p.healthy
			poll += p.poll
			polls += p.polls
			probed++
		}
		beating = 0
		for _, a := range fleet {
			if a.lastAck.Load() > before.at.UnixNano() {
				beating++
			}
		}
		cpuLeader += after.leader - before.leader
		cpuFollower += after.follower - before.follower
		cpuEtcd += after.etcd - before.etcd
		cpuAgents += after.self - before.self
		wall += after.at.Sub(before.at)
		writes += after.revision - before.revision
		entries += after.raftIndex - before.raftIndex
		b.ReportMetric(fanoutRSS(b, leader.PID()), "MB-rss-leader")
		b.ReportMetric(fanoutRSS(b, follower.PID()), "MB-rss-follower")
	}
	beats, acked, streamErrors := st.take()

	pct := func(d time.Duration) float64 { return 100 * d.Seconds() / wall.Seconds() }
	perS := func(v int64) float64 { return float64(v) / wall.Seconds() }
	ms := func(d time.Duration, k int) float64 { return float64(d.Microseconds()) / 1000 / float64(k) }
	b.ReportMetric(0, "ns/op") // a round is a fixed window: its time says nothing
	b.ReportMetric(pct(cpuLeader), "%cpu-leader")
	b.ReportMetric(pct(cpuFollower), "%cpu-follower")
	b.ReportMetric(pct(cpuEtcd), "%cpu-etcd")
	b.ReportMetric(pct(cpuAgents), "%cpu-agents")
	b.ReportMetric(perS(writes), "etcd-writes/s")
	b.ReportMetric(perS(writes)*60/float64(n), "etcd-writes/node/min")
	b.ReportMetric(float64(entries)/wall.Seconds(), "raft-entries/s")
	b.ReportMetric(perS(acked), "beats/s")
	if len(beats) > 0 {
		slices.Sort(beats)
		b.ReportMetric(ms(beats[len(beats)*99/100], 1), "ms/beat-p99")
	}
	b.ReportMetric(float64(streamErrors), "stream-errors")
	if probed == 2*b.N {
		b.ReportMetric(ms(overTTL, b.N), "ms/timeout-over-ttl")
		b.ReportMetric(ms(firstHealthy, b.N), "ms/first-beat-healthy")
		b.ReportMetric(ms(poll, polls), "ms/getnodes-poll")
	}
	b.ReportMetric(ramp.Seconds(), "s/ramp")
	b.ReportMetric(float64(started), "agents-started")
	b.ReportMetric(float64(beating), "agents-beating")
}

// steadyAfter is how long after its first heartbeat a node's heartbeats
// cost etcd what they cost from then on (internal/nodewatch): its next record
// is the first beat at least timeout/2 after the first, which comes at
// most an interval later; from there on, one record every timeout/2.
func steadyAfter(interval, timeout time.Duration) time.Duration {
	return timeout/2 + interval
}

// simAgent is one simulated node agent.
type simAgent struct {
	id    string
	creds *rpc.Credentials
	// lastBeat is when the agent last sent a heartbeat, lastAck when one
	// was last acknowledged (unix ns).
	lastBeat, lastAck atomic.Int64
	// stopBeats ends the agent's heartbeats (its watch goes on).
	stopBeats context.CancelFunc
}

// newAgents makes n node agents: an ed25519 key each, its node written UP
// straight into etcd (100 per transaction), and a node certificate of its
// key from the cluster CA, as the curator would have issued at commit.
func newAgents(b *testing.B, c *cut.Cluster, cli *clientv3.Client, n int) []*simAgent {
	b.Helper()
	agents := make([]*simAgent, 0, n)
	var ops []clientv3.Op
	flush := func() {
		if len(ops) == 0 {
			return
		}
		if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
		ops = ops[:0]
	}
	for range n {
		pub, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			b.Fatal(err)
		}
		id := pki.NodeID(pub)
		v, err := records.EncodeNode(&curatorv1.Node{
			Id: id, PublicKey: pub, State: curatorv1.NodeState_NODE_STATE_UP,
			Status: &curatorv1.NodeStatus{Address: "10.0.0.1", Version: "bench"},
			Labels: map[string]string{"zone": "a"},
		})
		if err != nil {
			b.Fatal(err)
		}
		iss, err := c.PKI.CA.Issue(pki.IssueRequest{
			Cluster: c.PKI.Cluster, Principal: pki.Principal{Kind: pki.KindNode, Name: id},
			PublicKey: pub, Validity: 24 * time.Hour,
		})
		if err != nil {
			b.Fatal(err)
		}
		keyPEM, err := pki.MarshalPrivateKeyPEM(key)
		if err != nil {
			b.Fatal(err)
		}
		creds, err := rpc.NewCredentials(c.PKI.Cluster, c.PKI.CA.CertPEM, iss.CertPEM, keyPEM)
		if err != nil {
			b.Fatal(err)
		}
		agents = append(agents, &simAgent{id: id, creds: creds})
		ops = append(ops, clientv3.OpPut(keys.Node(id), string(v)))
		if len(ops) == 100 {
			flush()
		}
	}
	flush()
	return agents
}

// rampAgents starts the agents, rampParallel at a time, agent i on
// replica(i), and returns how many started (watch snapshot and first
// heartbeat acknowledged) before rampTimeout. Agents that had not started
// by then go on trying, as agents do; those not yet launched never are.
func rampAgents(b *testing.B, ctx context.Context, running *sync.WaitGroup, st *agentStats, fleet []*simAgent, replica func(int) *cut.Curator) int {
	b.Helper()
	rctx, cancel := context.WithTimeout(ctx, rampTimeout)
	defer cancel()
	begun := time.Now()
	slots := make(chan struct{}, rampParallel)
	var started atomic.Int64
	var wg sync.WaitGroup
	for i, a := range fleet {
		select {
		case slots <- struct{}{}:
		case <-rctx.Done():
		}
		if rctx.Err() != nil {
			b.Logf("ramp: %d of %d agents launched, %d started within %v; the rest are not launched", i, len(fleet), started.Load(), rampTimeout)
			break
		}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := a.start(ctx, rctx, running, st, replica(i)); err == nil {
				started.Add(1)
			} else if rctx.Err() == nil {
				b.Errorf("start agent %d of %d (%s): %v", i, len(fleet), a.id, err)
			}
		})
		if (i+1)%1000 == 0 {
			b.Logf("ramp: %d of %d agents launched after %v", i+1, len(fleet), time.Since(begun).Round(time.Second))
		}
	}
	wg.Wait()
	return int(started.Load())
}

// start connects the agent to cur and opens its Watch stream and its
// Heartbeat stream, which run under ctx from then on. It returns once the
// Watch stream has its snapshot and the first heartbeat is acknowledged,
// or with an error when startCtx ends before. A stream that fails is
// opened again, as roleserve does (a leader change, a replica too loaded
// to answer).
func (a *simAgent) start(ctx, startCtx context.Context, running *sync.WaitGroup, st *agentStats, cur *cut.Curator) error {
	conn, err := rpc.Dial(cur.Addr, rpc.ClientConfig{Credentials: a.creds, ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		return err
	}
	running.Go(func() { <-ctx.Done(); conn.Close() })
	cl := curatorv1.NewCuratorClient(conn)

	watching, beating := newStartup(), newStartup()
	bctx, stop := context.WithCancel(ctx)
	a.stopBeats = stop
	running.Go(func() { a.watch(ctx, st, cl, watching) })
	running.Go(func() { a.heartbeats(bctx, st, cl, beating) })
	if err := watching.wait(startCtx); err != nil {
		return fmt.Errorf("watch snapshot: %w", err)
	}
	if err := beating.wait(startCtx); err != nil {
		return fmt.Errorf("first heartbeat: %w", err)
	}
	return nil
}

// startup is what a stream reports until it first works: done once it
// does, and the last error until then.
type startup struct {
	done chan struct{}
	once sync.Once
	mu   sync.Mutex
	err  error
}

func newStartup() *startup { return &startup{done: make(chan struct{})} }

func (s *startup) ok() { s.once.Do(func() { close(s.done) }) }

func (s *startup) failed(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

// wait waits until the stream works or ctx ends.
func (s *startup) wait(ctx context.Context) error {
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		defer s.mu.Unlock()
		return fmt.Errorf("%w (the stream's last error: %v)", ctx.Err(), s.err)
	}
}

// watch keeps a Watch stream of the agent's own node open until ctx ends.
func (a *simAgent) watch(ctx context.Context, st *agentStats, cl curatorv1.CuratorClient, up *startup) {
	retry(ctx, st, up, func() (bool, error) { return a.watchOnce(ctx, cl, up) })
}

// watchOnce is one Watch stream, read until it ends; it reports whether
// the stream had its snapshot.
func (a *simAgent) watchOnce(ctx context.Context, cl curatorv1.CuratorClient, up *startup) (bool, error) {
	stream, err := cl.Watch(ctx, &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_NodeId{NodeId: a.id}})
	if err != nil {
		return false, err
	}
	worked := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			return worked, err
		}
		if resp.GetSnapshot() {
			worked = true
			up.ok()
		}
	}
}

// heartbeats beats, as roleserve does, at the interval the curator asks
// for, on one stream at a time, until ctx ends.
func (a *simAgent) heartbeats(ctx context.Context, st *agentStats, cl curatorv1.CuratorClient, up *startup) {
	retry(ctx, st, up, func() (bool, error) { return a.heartbeatOnce(ctx, st, cl, up) })
}

// retry runs stream again and again until ctx ends, waiting between as
// roleserve does (agentRetryMin to agentRetryMax, reset by a stream that
// worked). Each failure is counted and kept for up.
func retry(ctx context.Context, st *agentStats, up *startup, stream func() (worked bool, err error)) {
	bo := backoff.New(agentRetryMin, agentRetryMax)
	for {
		worked, err := stream()
		if ctx.Err() != nil {
			return
		}
		if worked {
			bo.Reset()
		}
		up.failed(err)
		st.failed()
		if !pause(ctx, bo.Next()) {
			return
		}
	}
}

// heartbeatOnce is one Heartbeat stream: send, wait for the answer, wait
// the interval, again. It reports whether any heartbeat was acknowledged.
func (a *simAgent) heartbeatOnce(ctx context.Context, st *agentStats, cl curatorv1.CuratorClient, up *startup) (bool, error) {
	stream, err := cl.Heartbeat(ctx)
	if err != nil {
		return false, err
	}
	acked := false
	for {
		sent := time.Now()
		a.lastBeat.Store(sent.UnixNano())
		if err := stream.Send(&curatorv1.HeartbeatRequest{}); err != nil {
			if errors.Is(err, io.EOF) {
				_, err = stream.Recv() // the stream's own error
			}
			return acked, err
		}
		resp, err := stream.Recv()
		if err != nil {
			return acked, err
		}
		st.beat(time.Since(sent))
		a.lastAck.Store(time.Now().UnixNano())
		acked = true
		up.ok()
		if !pause(ctx, time.Duration(resp.GetIntervalMillis())*time.Millisecond) {
			return acked, ctx.Err()
		}
	}
}

// pause waits d unless ctx ends first, and reports whether ctx goes on.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// agentStats counts what the agents see, while recording.
type agentStats struct {
	recording atomic.Bool
	mu        sync.Mutex
	rtts      []time.Duration
	acked     int64
	errors    int64
}

func (s *agentStats) record(on bool) { s.recording.Store(on) }

func (s *agentStats) beat(rtt time.Duration) {
	if !s.recording.Load() {
		return
	}
	s.mu.Lock()
	s.rtts = append(s.rtts, rtt)
	s.acked++
	s.mu.Unlock()
}

func (s *agentStats) failed() {
	if !s.recording.Load() {
		return
	}
	s.mu.Lock()
	s.errors++
	s.mu.Unlock()
}

func (s *agentStats) take() ([]time.Duration, int64, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rtts, s.acked, s.errors
}

// probeResult is what one latency probe measured.
type probeResult struct {
	overTTL, healthy time.Duration
	// poll is the time of the probe's polls together, polls their number.
	poll  time.Duration
	polls int
	err   error
}

// probeTimeout stops a's heartbeats and polls its health until
// HEARTBEAT_TIMEOUT: overTTL is from its last heartbeat until that answer,
// less timeout. Polling starts a second before the timeout can run out:
// nothing changes before (the curator expires a node exactly at the
// timeout, etcd's lease later), and each poll reads every node, a load
// that would be in the window's figures for nothing.
func probeTimeout(ctx context.Context, m curatorv1.ManagementClient, a *simAgent, timeout time.Duration) probeResult {
	a.stopBeats()
	last := time.Unix(0, a.lastBeat.Load())
	if !pause(ctx, time.Until(last.Add(timeout-time.Second))) {
		return probeResult{err: ctx.Err()}
	}
	at, poll, polls, err := untilHealth(ctx, m, a.id, curatorv1.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT, last.Add(timeout+time.Minute))
	return probeResult{overTTL: at.Sub(last) - timeout, poll: poll, polls: polls, err: err}
}

// probeFresh starts the fresh agent a on cur, as rampAgents does, and
// polls its health from the acknowledgement of its first heartbeat until
// HEALTHY; healthy counts from that heartbeat's send. The agent stays on.
func probeFresh(ctx context.Context, running *sync.WaitGroup, st *agentStats, m curatorv1.ManagementClient, a *simAgent, cur *cut.Curator) probeResult {
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := a.start(ctx, sctx, running, st, cur); err != nil {
		return probeResult{err: fmt.Errorf("fresh agent: %w", err)}
	}
	first := time.Unix(0, a.lastBeat.Load()) // the next one is an interval away
	at, poll, polls, err := untilHealth(ctx, m, a.id, curatorv1.NodeHealth_NODE_HEALTH_HEALTHY, first.Add(time.Minute))
	return probeResult{healthy: at.Sub(first), poll: poll, polls: polls, err: err}
}

// untilHealth polls GetNodes, filtered to node id, back to back until it
// reports health want, and returns when that answer arrived, with the
// polls' total time and number. It gives up at deadline.
func untilHealth(ctx context.Context, m curatorv1.ManagementClient, id string, want curatorv1.NodeHealth, deadline time.Time) (time.Time, time.Duration, int, error) {
	var spent time.Duration
	polls := 0
	var got curatorv1.NodeHealth
	for time.Now().Before(deadline) {
		begun := time.Now()
		health, err := nodeHealth(ctx, m, id)
		at := time.Now()
		spent += at.Sub(begun)
		polls++
		if err == nil && health == want {
			return at, spent, polls, nil
		}
		if ctx.Err() != nil {
			return at, spent, polls, ctx.Err()
		}
		got = health
		if err != nil && !pause(ctx, 100*time.Millisecond) { // e.g. a leader change: ask again soon
			return at, spent, polls, ctx.Err()
		}
	}
	return time.Time{}, spent, polls, fmt.Errorf("node %s is %s, not %s, at the deadline", id, got, want)
}

// nodeHealth is node id's health as GetNodes reports it.
func nodeHealth(ctx context.Context, m curatorv1.ManagementClient, id string) (curatorv1.NodeHealth, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := m.GetNodes(ctx, &curatorv1.GetNodesRequest{Filter: strconv.Quote(id) + " == node.id"})
	if err != nil {
		return 0, err
	}
	health := curatorv1.NodeHealth_NODE_HEALTH_UNSPECIFIED
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return health, nil
		}
		if err != nil {
			return 0, err
		}
		for _, n := range resp.Nodes {
			health = n.GetHealth()
		}
	}
}

// usage is one reading of what the processes have used and where etcd is.
type usage struct {
	at                           time.Time
	leader, follower, etcd, self time.Duration
	revision                     int64
	raftIndex                    uint64
}

func snapshot(b *testing.B, cli *clientv3.Client, endpoint string, leader, follower *cut.Curator, c *cut.Cluster) usage {
	b.Helper()
	u := usage{at: time.Now(), leader: cpuTime(b, leader.PID()), follower: cpuTime(b, follower.PID()), self: cpuTime(b, os.Getpid())}
	for _, v := range c.Voters {
		u.etcd += cpuTime(b, v.PID())
	}
	u.revision, u.raftIndex = etcdProgress(b, cli, endpoint)
	return u
}

// etcdProgress is etcd's revision and raft index, as endpoint reports them.
// An etcd loaded to its limit may take seconds to answer: the windows are
// timed from reading to reading, so a slow one stretches a window but
// does not skew it.
func etcdProgress(b *testing.B, cli *clientv3.Client, endpoint string) (int64, uint64) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := cli.Status(ctx, endpoint)
	if err != nil {
		b.Fatalf("etcd status of %s: %v", endpoint, err)
	}
	return st.Header.Revision, st.RaftIndex
}

// cpuTime is the CPU time process pid has used, user and system, all its
// threads (/proc/<pid>/stat: utime and stime, fields 14 and 15).
func cpuTime(b *testing.B, pid int) time.Duration {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name (field 2) is in parentheses and may hold spaces;
	// the fields after it start with the state (field 3).
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		b.Fatalf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	var ticks int64
	for _, field := range f[11:13] {
		v, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// raiseFileLimit lifts the process's open-file limit (which the processes
// it starts inherit) to 65536 where it is lower: 10,000 agents hold 10,000
// connections in this process, and the curators half as many each.
func raiseFileLimit(b *testing.B) {
	b.Helper()
	const want = 65536
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	if lim.Cur >= want {
		return
	}
	raised := syscall.Rlimit{Cur: want, Max: max(lim.Max, want)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
		// Not privileged to raise the hard limit: up to it.
		raised = syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			b.Fatalf("raise the open-file limit: %v", err)
		}
	}
	b.Logf("open-file limit raised from %d to %d", lim.Cur, raised.Cur)
}
