package faults

// The nemeses: faults injected at random times chosen from the seed, each
// healed before the next one and all of them before the run ends.

import (
	"context"
	"fmt"
	"maps"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/records"
	"curia.dev/platform/run"
)

// The nemesis kinds (FAULT_NEMESES selects among them).
const (
	NemKill              = "kill"                // kill -9 a process; its supervisor restarts it
	NemPause             = "pause"               // SIGSTOP a process past every TTL and lease, then SIGCONT
	NemIsolateNode       = "isolate-node"        // cut one node off from every other host
	NemIsolateEtcdLeader = "isolate-etcd-leader" // the same, for the etcd leader's node
	NemCuratorFromEtcd   = "curator-from-etcd"   // cut the curator leader off from every node
	NemReconcilerFromCur = "reconciler-from-curators"
	NemOrphanLearner     = "orphan-learner"     // a learner of no node, added straight in etcd
	NemOrphanVoter       = "orphan-voter"       // a voter of no node (never started), added straight in etcd
	NemDeleteNode        = "delete-node"        // a member's node deleted through the admin API with both bypasses, then re-enrolled
	NemNodeGoneAndBack   = "node-gone-and-back" // a member's node record deleted straight in etcd, put back a moment later
	NemCorruptNode       = "corrupt-node"       // a member's node record overwritten with garbage for a while
	NemCrashAfterChange  = "crash-after-change" // the curator crashes between a membership call and its role write
	NemTwin              = "twin"               // the active reconciler paused and a twin started under its name
	NemRestartNode       = "restart-node"       // a node restarted the operator's way: in maintenance, its processes stopped (SIGTERM) and started again
	NemRollingRestart    = "rolling-restart"    // the whole cluster rolled, again and again, beside the other nemeses (roller.go)
)

// AllNemeses lists every kind.
var AllNemeses = []string{NemKill, NemPause, NemIsolateNode, NemIsolateEtcdLeader, NemCuratorFromEtcd, NemReconcilerFromCur,
	NemOrphanLearner, NemOrphanVoter, NemDeleteNode, NemNodeGoneAndBack, NemCorruptNode, NemCrashAfterChange, NemTwin, NemRestartNode, NemRollingRestart}

// fault is one injected fault.
type fault struct {
	Kind   string    `json:"kind"`
	Target string    `json:"target"`
	Began  time.Time `json:"began"`
	Healed time.Time `json:"healed"`
	// ConvergedIn is how long roles, membership and the agents took to
	// agree after the heal ("" if they did not within a minute).
	ConvergedIn string `json:"converged_in,omitempty"`
	convergedIn time.Duration
	// down are the hosts the fault stops or cuts off from the others,
	// while it is in force (the quorum check's excuse).
	down []string
	heal func() error
	// takeover says what to time after the fault: a curator failover or a
	// reconciler takeover ("" if none).
	takeover string
}

// nemesis injects faults into the cluster.
type nemesis struct {
	c     *cluster
	rng   *mrand.Rand
	kinds []string
	// hold is how long a fault stays; pause outlasts every TTL and lease.
	hold, pause time.Duration

	mu     sync.Mutex
	faults []*fault
	// injected are etcd members added or removed behind curia's back.
	injected map[uint64]string
}

func newNemesis(c *cluster, rng *mrand.Rand, kinds []string) *nemesis {
	return &nemesis{c: c, rng: rng, kinds: kinds, hold: 8 * time.Second, pause: 15 * time.Second, injected: map[uint64]string{}}
}

// downHosts are the hosts faults in force at t stop or cut off, and
// whether some fault was healed less than settle ago (elections and
// restarts still going on).
func (n *nemesis) downHosts(t time.Time, settle time.Duration) ([]string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	recent := false
	for _, f := range n.faults {
		if !t.Before(f.Began) && (f.Healed.IsZero() || t.Before(f.Healed)) {
			out = append(out, f.down...)
		}
		if !f.Healed.IsZero() && t.After(f.Healed) && t.Sub(f.Healed) < settle {
			recent = true
		}
	}
	return out, recent
}

func (n *nemesis) record(f *fault) {
	n.mu.Lock()
	n.faults = append(n.faults, f)
	n.mu.Unlock()
}

func (n *nemesis) healed(f *fault) {
	n.mu.Lock()
	f.Healed = time.Now()
	n.mu.Unlock()
}

// Faults returns the faults injected so far.
func (n *nemesis) Faults() []fault {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]fault, len(n.faults))
	for i, f := range n.faults {
		out[i] = *f
	}
	return out
}

// run injects one fault after another until ctx ends: a quiet spell
// (1–4 s), a fault (onInject), its hold, its heal, and then onHeal, which
// returns when the cluster got over it (or gave up waiting).
func (n *nemesis) run(ctx context.Context, onInject, onHeal func(*fault)) {
	var deck []string
	for ctx.Err() == nil {
		run.Sleep(ctx, time.Second+time.Duration(n.rng.Int64N(int64(3*time.Second))))
		if ctx.Err() != nil {
			return
		}
		// Every kind once, in an order from the seed, then again: a short
		// run still sees each kind.
		if len(deck) == 0 {
			deck = slices.Clone(n.kinds)
			n.rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		kind := deck[0]
		deck = deck[1:]
		f, err := n.inject(ctx, kind)
		if err != nil {
			n.c.logf("nemesis %s: not injected: %v", kind, err)
			continue
		}
		n.record(f)
		n.c.logf("nemesis %s on %s", f.Kind, f.Target)
		onInject(f)
		hold := n.hold
		if kind == NemPause || kind == NemTwin {
			hold = n.pause
		}
		run.Sleep(ctx, hold/2+time.Duration(n.rng.Int64N(int64(hold))))
		if f.heal != nil {
			if err := f.heal(); err != nil {
				n.c.logf("nemesis %s: heal: %v", kind, err)
			}
		}
		n.healed(f)
		n.c.logf("nemesis %s on %s healed", f.Kind, f.Target)
		onHeal(f)
	}
}

// converged notes how long the cluster took to get over f.
func (n *nemesis) converged(f *fault, took time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f.convergedIn, f.ConvergedIn = took, took.Round(time.Millisecond).String()
}

// isHealed says whether f was healed.
func (n *nemesis) isHealed(f *fault) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return !f.Healed.IsZero()
}

// injectedMembers are the etcd members the nemeses added behind curia's
// back.
func (n *nemesis) injectedMembers() map[uint64]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.injected)
}

// inject starts one fault of kind.
func (n *nemesis) inject(ctx context.Context, kind string) (*fault, error) {
	c := n.c
	f := &fault{Kind: kind, Began: time.Now()}
	switch kind {
	case NemKill, NemPause:
		procs := c.processes()
		proc := procs[n.rng.IntN(len(procs))]
		pid := c.pid(proc)
		if pid == 0 {
			return nil, fmt.Errorf("%s is not running", proc)
		}
		f.Target, f.takeover = proc, c.takeoverKind(ctx, proc)
		if c.isConsensus(proc) {
			f.down = []string{c.hostOf(proc)}
		}
		if kind == NemKill {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				return nil, err
			}
			// Down until its supervisor restarted it and etcd caught up.
			f.heal = func() error { return nil }
			return f, nil
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return nil, err
		}
		f.heal = func() error { return syscall.Kill(pid, syscall.SIGCONT) }
		return f, nil
	case NemIsolateNode, NemIsolateEtcdLeader:
		host := c.nodes()[n.rng.IntN(len(c.nodes()))]
		if kind == NemIsolateEtcdLeader {
			h, err := c.etcdLeaderHost(ctx)
			if err != nil {
				return nil, err
			}
			host = h
		}
		f.Target, f.down = host, []string{host}
		if err := c.net.Isolate(host); err != nil {
			return nil, err
		}
		f.heal = func() error { return c.net.HealAll() }
		return f, nil
	case NemCuratorFromEtcd:
		leader, err := c.curatorLeader(ctx)
		if err != nil {
			return nil, err
		}
		f.Target, f.takeover = leader, "curator"
		for _, node := range c.nodes() {
			if err := c.net.Partition(leader, node); err != nil {
				return nil, err
			}
		}
		f.heal = func() error { return c.net.HealAll() }
		return f, nil
	case NemReconcilerFromCur:
		active, err := c.activeReconciler(ctx)
		if err != nil {
			return nil, err
		}
		f.Target, f.takeover = active, "reconciler"
		for _, cur := range c.curatorHosts() {
			if err := c.net.Partition(active, cur); err != nil {
				return nil, err
			}
		}
		f.heal = func() error { return c.net.HealAll() }
		return f, nil
	case NemOrphanLearner, NemOrphanVoter:
		// etcd refuses a voter that would leave too few started members
		// for a quorum, except a second one for a single voter (restores
		// need it): that one would end the quorum for good.
		if kind == NemOrphanVoter {
			list, err := c.etcd.MemberList(ctx)
			if err != nil {
				return nil, err
			}
			started := 0
			for _, m := range list.Members {
				if !m.IsLearner && m.Name != "" {
					started++
				}
			}
			if started < 2 {
				return nil, fmt.Errorf("%d started voter(s): an orphan voter would take the quorum for good", started)
			}
		}
		url := fmt.Sprintf("https://%s:2380", c.spareIP())
		add := c.etcd.MemberAddAsLearner
		if kind == NemOrphanVoter {
			add = c.etcd.MemberAdd
		}
		resp, err := add(ctx, []string{url})
		if err != nil {
			return nil, fmt.Errorf("add an %s: %w", kind, err)
		}
		n.mu.Lock()
		n.injected[resp.Member.ID] = kind + " " + url
		n.mu.Unlock()
		f.Target = fmt.Sprintf("member %x at %s", resp.Member.ID, url)
		return f, nil // the reconciler removes it
	case NemRestartNode:
		// As curia-local upgrade does one node: maintenance first (refused
		// while the cluster could not lose its voter: then no fault), then
		// its consensus and agent stop; their supervisors start them again.
		ids := c.nodeIDs()
		id := ids[n.rng.IntN(len(ids))]
		host := c.hostOfNode(id)
		mgmt := curatorv1.NewManagementClient(c.admin)
		mctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := mgmt.StartNodeMaintenance(mctx, &curatorv1.StartNodeMaintenanceRequest{NodeId: id, Reason: "fault suite: " + NemRestartNode})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("maintenance for %s: %w", id, err)
		}
		f.Target, f.down = host, []string{host}
		for _, proc := range c.processes() {
			if c.hostOf(proc) != host {
				continue
			}
			if pid := c.pid(proc); pid != 0 {
				if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
					return nil, err
				}
			}
		}
		f.heal = func() error {
			ectx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			_, err := mgmt.EndNodeMaintenance(ectx, &curatorv1.EndNodeMaintenanceRequest{NodeId: id})
			return err
		}
		return f, nil
	case NemDeleteNode:
		id, err := c.memberNode(ctx, n.rng)
		if err != nil {
			return nil, err
		}
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = curatorv1.NewManagementClient(c.admin).DeleteNode(dctx, &curatorv1.DeleteNodeRequest{NodeId: id, SafetyBypassHasRoles: true, SafetyBypassNotDecommissioned: true})
		cancel()
		if err != nil {
			// An outcome unknown to the caller may still have deleted it.
			if got, gerr := c.etcd.Get(ctx, keys.Node(id), clientv3.WithCountOnly()); gerr != nil || got.Count > 0 {
				return nil, fmt.Errorf("delete node %s: %w", id, err)
			}
		}
		name := c.hostOfNode(id)
		f.Target = name
		// The reconciler removes its member meanwhile; the heal reinstalls
		// the node with a new identity (the deleted id never registers
		// again), and its agent registers with the ticket. Not before the
		// member is gone: a machine wiped while still a voter is a voter
		// lost, and with two voters (one just promoted) the quorum with it.
		f.heal = func() error {
			if err := c.awaitMemberGone(id); err != nil {
				return err
			}
			return c.reinstall(name)
		}
		return f, nil
	case NemNodeGoneAndBack, NemCorruptNode:
		id, err := c.memberNode(ctx, n.rng)
		if err != nil {
			return nil, err
		}
		got, err := c.etcd.Get(ctx, keys.Node(id))
		if err != nil {
			return nil, fmt.Errorf("read node %s: %w", id, err)
		}
		if len(got.Kvs) == 0 {
			return nil, fmt.Errorf("read node %s: not found", id)
		}
		record := got.Kvs[0].Value
		f.Target = id
		if kind == NemCorruptNode {
			if _, err := c.etcd.Put(ctx, keys.Node(id), "\xff\xfe not a node record"); err != nil {
				return nil, err
			}
			f.heal = func() error { return c.restoreNode(id, record) }
			return f, nil
		}
		if _, err := c.etcd.Delete(ctx, keys.Node(id)); err != nil {
			return nil, err
		}
		// Back a moment later: a plan made in between must not remove the
		// member of the node that exists again.
		run.Sleep(ctx, time.Duration(n.rng.Int64N(int64(300*time.Millisecond))))
		if err := c.restoreNode(id, record); err != nil {
			return nil, err
		}
		return f, nil
	case NemCrashAfterChange:
		point := []string{"after-add-node", "after-remove-member"}[n.rng.IntN(2)]
		f.Target = point
		if err := c.armCrash(point); err != nil {
			return nil, err
		}
		f.heal = func() error { c.disarmCrash(point); return nil }
		return f, nil
	case NemTwin:
		active, err := c.activeReconciler(ctx)
		if err != nil {
			return nil, err
		}
		pid := c.pid(active)
		if pid == 0 {
			return nil, fmt.Errorf("%s is not running", active)
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return nil, err
		}
		stopTwin, err := c.startTwin(active)
		if err != nil {
			_ = syscall.Kill(pid, syscall.SIGCONT) // undo the pause; err says what failed
			return nil, err
		}
		f.Target, f.takeover = active, "reconciler"
		f.heal = func() error {
			err := syscall.Kill(pid, syscall.SIGCONT)
			// Both run a while: the resumed one and its twin.
			run.Sleep(ctx, 3*time.Second)
			stopTwin()
			return err
		}
		return f, nil
	}
	return nil, fmt.Errorf("unknown nemesis %q", kind)
}

// reinstall gives a deleted node a new identity and fresh data
// (local.Cluster.Reinstall); it approves the node and waits (at most a
// minute) until the agent committed it.
func (c *cluster) reinstall(name string) error {
	id, err := c.lc.Reinstall(name, 10*time.Second)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := curatorv1.NewManagementClient(c.admin)
	var approveErr error // the last approval's, for the timeout
	for {
		var node *curatorv1.Node // nil (no state) until a record decodes
		if got, err := c.etcd.Get(ctx, keys.Node(id)); err == nil && len(got.Kvs) > 0 {
			node, _ = records.DecodeNode(got.Kvs[0].Value)
		}
		switch node.GetState() {
		case curatorv1.NodeState_NODE_STATE_UP:
			return nil
		case curatorv1.NodeState_NODE_STATE_NEW:
			_, approveErr = m.ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: id})
		}
		if !run.Sleep(ctx, 200*time.Millisecond) {
			if approveErr != nil {
				return fmt.Errorf("reinstall %s: node %s is %v after a minute; approve: %w", name, id, node.GetState(), approveErr)
			}
			return fmt.Errorf("reinstall %s: node %s is %v after a minute", name, id, node.GetState())
		}
	}
}

// awaitMemberGone waits until no etcd member is named after node id.
func (c *cluster) awaitMemberGone(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var why string
	for {
		list, err := c.etcd.MemberList(ctx)
		switch {
		case err != nil:
			why = "the last member list failed: " + err.Error()
		case !slices.ContainsFunc(list.Members, func(m *etcdserverpb.Member) bool { return m.Name == id }):
			return nil
		default:
			why = "it is still a member"
		}
		if !run.Sleep(ctx, 200*time.Millisecond) {
			return fmt.Errorf("the deleted node %s: its etcd member not removed within 2 minutes (%s): not reinstalled", id, why)
		}
	}
}

// restoreNode puts a node's record back as it was.
func (c *cluster) restoreNode(id string, record []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.etcd.Put(ctx, keys.Node(id), string(record))
	return err
}

// memberNode picks a node of the cluster that is an etcd member (not the
// bootstrap node, through which the curators reach etcd).
func (c *cluster) memberNode(ctx context.Context, rng *mrand.Rand) (string, error) {
	list, err := c.etcd.MemberList(ctx)
	if err != nil {
		return "", err
	}
	var ids []string
	for _, m := range list.Members {
		if m.Name != "" && m.Name != c.bootstrapID() && slices.Contains(c.nodeIDs(), m.Name) {
			ids = append(ids, m.Name)
		}
	}
	if len(ids) == 0 {
		return "", fmt.Errorf("no member node but the bootstrap node")
	}
	slices.Sort(ids)
	return ids[rng.IntN(len(ids))], nil
}
