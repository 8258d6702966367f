//go:build e2e

// End-to-end tests against the process cluster that `make run` starts
// (curia-local), driven only through the public APIs and grpcurl, as an
// operator would. Run with `make test-e2e`.
package local_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	fencev1 "curia.dev/gen/curia/fence/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/audit"
	"curia.dev/platform/nodes"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
)

// cluster is a running curia-local.
type cluster struct {
	t     *testing.T
	state string
	proc  *proctest.Proc
	env   map[string]string
	ids   map[string]string // node name -> node id
	names map[string]string // node id -> node name
	creds *rpc.Credentials
	// frozen and deleted are the nodes the scenarios froze (and thawed)
	// and deleted, for the audit invariant.
	frozen, deleted string
	// nodes is the node count; bin holds the binaries; layout are
	// curia-local's flags that say where the cluster is.
	nodes  int
	bin    string
	layout []string
}

// nodeCount is the cluster's size: 3 control-plane nodes and 2 workers, so
// that autopilot can grow to 5.
const nodeCount = 5

func start(t *testing.T) *cluster { return startOn(t, "127.0.99", nodeCount) }

// startOn starts a cluster of nodes nodes (3 control-plane, the rest
// workers) on the loopback /24 subnet.
func startOn(t *testing.T, subnet string, nodes int) *cluster {
	t.Helper()
	return startWith(t, subnet, nodes, buildAll(t))
}

// startWith is startOn with the binaries of bin (curia-local among them).
func startWith(t *testing.T, subnet string, nodes int, bin string) *cluster {
	t.Helper()
	c := &cluster{t: t, state: filepath.Join(t.TempDir(), "state"), nodes: nodes, bin: bin,
		layout: []string{"--state", "", "--bin", bin, "--subnet", subnet, "--workers", strconv.Itoa(nodes - 3)}}
	c.layout[1] = c.state
	c.proc = proctest.New(t, "curia-local", filepath.Join(bin, "curia-local"), append(slices.Clone(c.layout), "--log-level", "debug",
		"--grpcurl", pinnedGrpcurl(t))...)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		logs, _ := filepath.Glob(filepath.Join(c.state, "logs", "*.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) > 25 {
				lines = lines[len(lines)-25:]
			}
			t.Logf("--- %s ---\n%s", filepath.Base(l), strings.Join(lines, "\n"))
		}
	})
	c.up()
	return c
}

// up starts curia-local and waits until it says the cluster is ready.
func (c *cluster) up() {
	t := c.t
	t.Helper()
	begun := time.Now()
	before := c.readyLines()
	c.proc.Start()
	proctest.Eventually(t, 3*time.Minute, func() error {
		if !c.proc.Running() {
			t.Fatal("curia-local exited")
		}
		if c.readyLines() == before {
			return errors.New("cluster not ready")
		}
		return nil
	})
	t.Logf("cluster ready %v after start", time.Since(begun).Round(100*time.Millisecond))
	c.readEnv()
}

// readyLines counts curia-local's "cluster ready" lines so far.
func (c *cluster) readyLines() int {
	b, _ := os.ReadFile(c.proc.Log)
	return strings.Count(string(b), "cluster ready")
}

func (c *cluster) readEnv() {
	t := c.t
	c.env = readEnvFile(t, filepath.Join(c.state, "env"))
	c.ids, c.names = map[string]string{}, map[string]string{}
	files, err := filepath.Glob(filepath.Join(c.state, "public", "node-*.id"))
	if err != nil || len(files) != c.nodes {
		t.Fatalf("node id files %v (%v), want %d", files, err, c.nodes)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name, id := strings.TrimSuffix(filepath.Base(f), ".id"), strings.TrimSpace(string(b))
		c.ids[name], c.names[id] = id, name
	}
	c.creds, err = rpc.LoadCredentials("curia", rpc.TLSFiles{CA: c.env["CURIA_CACERT"], Cert: c.env["CURIA_ADMIN_CERT"], Key: c.env["CURIA_ADMIN_KEY"]})
	if err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) conn(addrs string, kind pki.Kind) *grpc.ClientConn {
	cc, err := rpc.DialAny(strings.Split(addrs, ","), rpc.ClientConfig{Credentials: c.creds, ServerKinds: []pki.Kind{kind}})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cc.Close() })
	return cc
}

func (c *cluster) mgmt() curatorv1.ManagementClient {
	return curatorv1.NewManagementClient(c.conn(c.env["CURIA_CURATORS"], pki.KindCurator))
}

// pid reads the pid file curia-local keeps for a process.
func (c *cluster) pid(name string) int {
	b, err := os.ReadFile(filepath.Join(c.state, "run", name+".pid"))
	if err != nil {
		c.t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		c.t.Fatal(err)
	}
	return pid
}

// agreement checks the invariant every test ends with: every etcd member
// belongs to a node with ConsensusMember and every such node is a member,
// etcd has a leader, and no learner is left.
func (c *cluster) agreement() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.mgmt().GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{})
	if err != nil {
		return err
	}
	leader := false
	for _, m := range st.Members {
		if !m.NodeExists || !m.HasRole {
			return fmt.Errorf("member %x (node %s) has no node with ConsensusMember", m.MemberId, m.NodeId)
		}
		if m.Learner {
			return fmt.Errorf("member %x (node %s) is still a learner", m.MemberId, m.NodeId)
		}
		leader = leader || m.Leader
	}
	if len(st.RoleWithoutMember) > 0 {
		return fmt.Errorf("nodes with ConsensusMember that are not members: %v", st.RoleWithoutMember)
	}
	if !leader {
		return errors.New("no etcd leader")
	}
	return nil
}

// consensusStatus is GetConsensusStatus, asked again for up to 30 s while
// it fails: a frozen voter may hold one answer for a while.
func (c *cluster) consensusStatus() *curatorv1.GetConsensusStatusResponse {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := c.mgmt().GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{})
		cancel()
		if err == nil {
			return st
		}
		if time.Now().After(deadline) {
			c.t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *cluster) voters() map[string]bool {
	st := c.consensusStatus()
	out := map[string]bool{}
	for _, m := range st.Members {
		if !m.Learner {
			out[m.NodeId] = true
		}
	}
	return out
}

// leader is the node of the etcd leader.
func (c *cluster) leader() string {
	for _, m := range c.consensusStatus().Members {
		if m.Leader {
			return m.NodeId
		}
	}
	c.t.Fatal("no etcd leader")
	return ""
}

// voterNotLeader is a voter's node that does not lead etcd, the lowest
// name first.
func (c *cluster) voterNotLeader() string {
	leader := c.leader()
	var out []string
	for id := range c.voters() {
		if id != leader {
			out = append(out, c.names[id])
		}
	}
	if len(out) == 0 {
		c.t.Fatal("no voter but the leader")
	}
	slices.Sort(out)
	return c.ids[out[0]]
}

// worker is a node that is UP, healthy and no member, the lowest name
// first.
func (c *cluster) worker(t *testing.T) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	byID, err := nodes.ByID(ctx, c.mgmt(), "")
	if err != nil {
		t.Fatal(err)
	}
	v := c.voters()
	var out []string
	for id, n := range byID {
		if !v[id] && n.State == curatorv1.NodeState_NODE_STATE_UP && n.GetRoles().GetConsensusMember() == nil {
			out = append(out, c.names[id])
		}
	}
	if len(out) == 0 {
		t.Fatal("no worker")
	}
	slices.Sort(out)
	return c.ids[out[0]]
}

// zonesOf counts the nodes' zone labels.
func (c *cluster) zonesOf(ids map[string]bool) map[string]int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	byID, err := nodes.ByID(ctx, c.mgmt(), "")
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[string]int{}
	for id := range ids {
		out[byID[id].GetLabels()["zone"]]++
	}
	return out
}

func (c *cluster) eventuallyAgree() {
	c.t.Helper()
	proctest.Eventually(c.t, 2*time.Minute, c.agreement)
}

// TestE2E runs the scenarios in order against one process cluster.
func TestE2E(t *testing.T) {
	t.Parallel() // a cluster of its own, on its own loopback subnet
	c := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	setConfig := func(t *testing.T, cfg *curatorv1.ClusterConfig, paths ...string) time.Time {
		t.Helper()
		if _, err := c.mgmt().UpdateClusterConfig(ctx, &curatorv1.UpdateClusterConfigRequest{Config: cfg, UpdateMask: &fieldmaskpb.FieldMask{Paths: paths}, Reason: "e2e"}); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	// untilVoters waits for want voters that agree with the roles, then
	// logs how long it took since begun and how many membership changes.
	untilVoters := func(t *testing.T, want int, begun time.Time, what string) {
		t.Helper()
		proctest.Eventually(t, 3*time.Minute, func() error {
			if v := c.voters(); len(v) != want {
				return fmt.Errorf("%d voters, want %d", len(v), want)
			}
			return c.agreement()
		})
		t.Logf("%s: %d voters %v later, after %s", what, want, time.Since(begun).Round(100*time.Millisecond), membershipChanges(t, c, begun))
	}

	t.Run("cold start to three voters", func(t *testing.T) {
		// curia-local set control_plane_size 3 once every node was UP:
		// autopilot chose node-2 and node-3 (zone-b, zone-c; node-1 and
		// the workers are zone-a).
		c.eventuallyAgree()
		want := map[string]bool{c.ids["node-1"]: true, c.ids["node-2"]: true, c.ids["node-3"]: true}
		if v := c.voters(); !maps.Equal(v, want) {
			t.Fatalf("voters %v, want node-1..3 %v", v, want)
		}
		cfg, err := c.mgmt().GetClusterConfig(ctx, &curatorv1.GetClusterConfigRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Config.ControlPlaneSize != 3 {
			t.Fatalf("control_plane_size %d after make run, want 3", cfg.Config.ControlPlaneSize)
		}
		want = map[string]bool{c.ids["node-2"]: true, c.ids["node-3"]: true}
		if added := autopilotAdded(t, c); !maps.Equal(added, want) {
			t.Fatalf("the reconciler added the members of %v at the cold start, want node-2 and node-3 %v", added, want)
		}
	})

	t.Run("metrics of every process", func(t *testing.T) { metricsScenario(t, c) })

	t.Run("the printed command in a fresh shell", func(t *testing.T) {
		b, err := os.ReadFile(c.proc.Log)
		if err != nil {
			t.Fatal(err)
		}
		checkPrintedCommands(t, string(b), t.TempDir(), pinnedGrpcurl(t))
	})

	t.Run("doc curl", func(t *testing.T) { checkDocCurl(t, filepath.Join(c.state, "env")) })

	t.Run("dashboard", func(t *testing.T) { dashboardScenario(t, c) })

	t.Run("rolling restart keeps the quorum", func(t *testing.T) { rollingRestart(t, c) })

	t.Run("size 5, then back to 3 keeping the etcd leader", func(t *testing.T) {
		untilVoters(t, 5, setConfig(t, &curatorv1.ClusterConfig{ControlPlaneSize: 5}, "control_plane_size"), "size 3 → 5")
		leader := c.leader()
		untilVoters(t, 3, setConfig(t, &curatorv1.ClusterConfig{ControlPlaneSize: 3}, "control_plane_size"), "size 5 → 3")
		v := c.voters()
		if !v[leader] {
			t.Fatalf("the etcd leader %s was removed: voters %v", leader, v)
		}
		// The two removed were zone-a's (three voters there): one voter
		// per zone is left.
		if z := c.zonesOf(v); len(z) != 3 {
			t.Fatalf("voters %v in zones %v, want one per zone", v, z)
		}
	})

	t.Run("autopilot replaces a frozen voter", func(t *testing.T) {
		// make run's dead_node_threshold (30 s): a standby joins once the
		// voter is unhealthy (6 s), so etcd's slow join with a frozen
		// member runs within the threshold.
		cfg, err := c.mgmt().GetClusterConfig(ctx, &curatorv1.GetClusterConfigRequest{})
		if err != nil {
			t.Fatal(err)
		}
		threshold := cfg.Config.GetDeadNodeThreshold().AsDuration()
		before := c.voters()
		frozen := c.voterNotLeader()
		name := c.names[frozen]
		// Every process of the node, as a stalled VM.
		pids := []int{c.pid(name + "-consensus"), c.pid(name + "-roleserve")}
		for _, pid := range pids {
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
		}
		thawed := false
		thaw := func() {
			if !thawed {
				for _, pid := range pids {
					_ = syscall.Kill(pid, syscall.SIGCONT)
				}
				thawed = true
			}
		}
		defer thaw()
		begun := time.Now()
		minHealthy, polls, failed := 3, 0, 0
		proctest.Eventually(t, 3*time.Minute, func() error {
			pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			st, err := c.mgmt().GetConsensusStatus(pctx, &curatorv1.GetConsensusStatusRequest{})
			cancel()
			if err != nil {
				failed++
			}
			if err == nil && st.Voters >= 3 {
				polls++
				minHealthy = min(minHealthy, int(st.HealthyVoters))
				if st.HealthyVoters < 2 {
					t.Fatalf("%d healthy voters of %d while %s was replaced", st.HealthyVoters, st.Voters, name)
				}
			}
			if v := c.voters(); v[frozen] || len(v) != 3 {
				return fmt.Errorf("voters %v: %s not replaced yet", v, name)
			}
			return c.agreement()
		})
		after := c.voters()
		var spare string
		for id := range after {
			if !before[id] {
				spare = c.names[id]
			}
		}
		took := time.Since(begun)
		t.Logf("frozen voter %s replaced by %s %v after the freeze (dead_node_threshold %v + %v; heartbeat timeout 6s), after %s; at least %d healthy voters in %d status polls (%d failed):\n%s",
			name, spare, took.Round(100*time.Millisecond), threshold, (took - threshold).Round(100*time.Millisecond), membershipChanges(t, c, begun), minHealthy, polls, failed, timeline(t, c, begun))
		t.Logf("the reconcilers' and curators' warnings meanwhile:\n%s", c.logLines(begun, "reconciler-1", "reconciler-2", "curator-1", "curator-2"))

		// Thawed, the node is turned away and becomes a worker; the
		// cluster is untouched.
		thaw()
		proctest.Eventually(t, 2*time.Minute, func() error {
			if v := c.voters(); !maps.Equal(v, after) {
				return fmt.Errorf("voters %v after %s's thaw, want %v", v, name, after)
			}
			byID, err := nodes.ByID(ctx, c.mgmt(), "")
			if err != nil {
				return err
			}
			if n := byID[frozen]; n == nil || n.Roles.GetConsensusMember() != nil || slices.Contains(n.GetStatus().GetRunningServices(), "consensus") {
				return fmt.Errorf("%s after its thaw: %v, want a worker not running consensus", name, n)
			}
			return c.agreement()
		})
		c.frozen = frozen
	})

	t.Run("kill -9 the curator leader", func(t *testing.T) {
		leader := curatorLeader(t, c)
		begun := time.Now()
		if err := syscall.Kill(c.pid(leader), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		proctest.Eventually(t, time.Minute, func() error {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err := c.mgmt().GetClusterInfo(cctx, &curatorv1.GetClusterInfoRequest{})
			return err
		})
		t.Logf("admin calls succeed again %v after kill -9 of %s", time.Since(begun).Round(10*time.Millisecond), leader)
		c.eventuallyAgree()
	})

	t.Run("kill -9 the active reconciler", func(t *testing.T) {
		active, _ := reconcilers(t, c)
		killed := c.pid(active)
		begun := time.Now()
		if err := syscall.Kill(killed, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// The standby takes the lease once it expires, or the killed
		// replica, restarted by curia-local as a supervisor would, acquires
		// it anew (a new process is a new incarnation: it never resumes
		// the dead one's lease): either way a live process acts again.
		var next string
		proctest.Eventually(t, time.Minute, func() error {
			for _, name := range []string{"reconciler-1", "reconciler-2"} {
				st := reconcilerStatus(t, c, name)
				if st != nil && st.Role == reconcilerv1.Role_ROLE_ACTIVE && (name != active || c.pid(name) != killed) {
					next = name
					return nil
				}
			}
			return errors.New("no live replica holds the lease yet")
		})
		t.Logf("%s acts %v after kill -9 of %s", next, time.Since(begun).Round(10*time.Millisecond), active)
		c.eventuallyAgree()
	})

	t.Run("SIGSTOP the active reconciler past its lease", func(t *testing.T) {
		// Frozen, not dead: the supervisor does not restart it, so the
		// standby must take over when the lease expires; woken up, the old
		// one finds its lease gone and stands by — and nothing it sends
		// with its old fence is accepted, counted at the resource (the
		// audit log, written in the same transaction as every accepted
		// change).
		active, standby := reconcilers(t, c)
		oldFence := reconcilerStatus(t, c, active).GetFence()
		pid := c.pid(active)
		begun := time.Now()
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		proctest.Eventually(t, time.Minute, func() error {
			if st := reconcilerStatus(t, c, standby); st == nil || st.Role != reconcilerv1.Role_ROLE_ACTIVE {
				return fmt.Errorf("%s not active yet", standby)
			}
			return nil
		})
		took := time.Now()
		t.Logf("%s took over %v after %s froze", standby, time.Since(begun).Round(10*time.Millisecond), active)
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		proctest.Eventually(t, time.Minute, func() error {
			if st := reconcilerStatus(t, c, active); st == nil || st.Role != reconcilerv1.Role_ROLE_STANDBY {
				return fmt.Errorf("%s does not stand by after waking", active)
			}
			return nil
		})
		c.eventuallyAgree()
		if n := acceptedWithFence(t, c, oldFence, took); n != 0 {
			t.Fatalf("%d changes with %s's old fence accepted after %s took over", n, active, standby)
		}
	})

	t.Run("delete a node that is still an etcd member", func(t *testing.T) {
		// The reconciler removes its member; autopilot grows back to 3.
		victim := c.voterNotLeader()
		c.deleted = victim
		begun := time.Now()
		if _, err := c.mgmt().DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: victim, SafetyBypassHasRoles: true, SafetyBypassNotDecommissioned: true}); err != nil {
			t.Fatal(err)
		}
		proctest.Eventually(t, 2*time.Minute, func() error {
			if c.voters()[victim] {
				return errors.New("the deleted node is still a member")
			}
			return nil
		})
		untilVoters(t, 3, begun, "voter deleted → 3 voters again")
	})

	// The docs' commands (the administration page's) end by deleting a worker.
	t.Run("doc commands", func(t *testing.T) { runDocCommands(t, c) })

	t.Run("no member removed while its node existed", func(t *testing.T) { auditInvariant(t, c) })

	t.Run("restart from disk", func(t *testing.T) {
		before := c.voters()
		c.proc.Stop()
		c.up()
		c.eventuallyAgree()
		if after := c.voters(); !maps.Equal(after, before) {
			t.Fatalf("members before %v, after %v", before, after)
		}
	})
}

// acceptedWithFence counts the audit events recorded after since whose fence
// has every condition of f: changes accepted from its holder.
func acceptedWithFence(t *testing.T, c *cluster, f *fencev1.Fence, since time.Time) int {
	t.Helper()
	if len(f.GetConditions()) == 0 {
		t.Fatal("no fence to look for")
	}
	n := 0
	for _, ev := range auditEvents(t, c) {
		if ev.Time.AsTime().Before(since) {
			continue
		}
		all := true
		for _, cond := range f.GetConditions() {
			all = all && slices.Contains(ev.Fence, fmt.Sprintf("%s@%d", cond.Key, cond.CreateRevision))
		}
		if all {
			n++
		}
	}
	return n
}

func curatorLeader(t *testing.T, c *cluster) string {
	stream, err := curatorv1.NewCuratorClient(c.conn(c.env["CURIA_CURATORS"], pki.KindCurator)).GetCurrentLeader(context.Background(), &curatorv1.GetCurrentLeaderRequest{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return resp.LeaderName
}

func reconcilerStatus(t *testing.T, c *cluster, name string) *reconcilerv1.GetStatusResponse {
	i, _ := strconv.Atoi(strings.TrimPrefix(name, "reconciler-"))
	addr := strings.Split(c.env["CURIA_RECONCILERS"], ",")[i-1]
	cc, err := rpc.Dial(addr, rpc.ClientConfig{Credentials: c.creds, ServerKinds: []pki.Kind{pki.KindReconciler}})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := reconcilerv1.NewReconcilerClient(cc).GetStatus(ctx, &reconcilerv1.GetStatusRequest{})
	if err != nil {
		return nil
	}
	return st
}

func reconcilers(t *testing.T, c *cluster) (active, standby string) {
	proctest.Eventually(t, time.Minute, func() error {
		a, b := reconcilerStatus(t, c, "reconciler-1"), reconcilerStatus(t, c, "reconciler-2")
		switch {
		case a != nil && b != nil && a.Role == reconcilerv1.Role_ROLE_ACTIVE && b.Role == reconcilerv1.Role_ROLE_STANDBY:
			active, standby = "reconciler-1", "reconciler-2"
		case a != nil && b != nil && b.Role == reconcilerv1.Role_ROLE_ACTIVE && a.Role == reconcilerv1.Role_ROLE_STANDBY:
			active, standby = "reconciler-2", "reconciler-1"
		default:
			return errors.New("no active/standby pair yet")
		}
		return nil
	})
	return active, standby
}

// runDocCommands runs every grpcurl and curl command of the docs (README.md
// and the operator's manual, docs/operating/: docPages, in order), with the
// cluster's env file and NODE (the worker's id) set, as an operator would.
// A command ending in "# fails: <Code>" must fail with that code; a command
// that meets etcd's reconfiguration window (Unavailable) is retried, as an
// operator would. A line that sets a variable from a grpcurl command
// (SNAPSHOT=$(grpcurl ...)) sets it for the commands after it. Pipelines
// fail when any of their commands does; files they write land in a
// temporary directory.
func runDocCommands(t *testing.T, c *cluster) {
	grpcurl, err := exec.LookPath("grpcurl")
	if err != nil {
		t.Fatal("grpcurl is not on PATH: run the e2e tests with make test-e2e")
	}
	_ = grpcurl
	env := os.Environ()
	for k, v := range c.env {
		env = append(env, k+"="+v)
	}
	worker := c.worker(t)
	t.Logf("NODE is %s (%s), a worker", c.names[worker], worker)
	env = append(env, "NODE="+worker)
	ran := 0
	work := t.TempDir()
	for _, line := range adminCommands(readDocs(t)) {
		if m := assignCommand.FindStringSubmatch(line); m != nil {
			cmd := exec.Command("bash", "-c", "set -o pipefail; "+m[2])
			cmd.Env, cmd.Dir = env, work
			out, err := cmd.Output()
			if v := strings.TrimSpace(string(out)); err != nil || v == "" || v == "null" {
				t.Fatalf("%s: %v: %q", line, err, v)
			} else {
				t.Logf("%s=%s", m[1], v)
				env = append(env, m[1]+"="+v)
			}
			continue
		}
		if !strings.HasPrefix(line, "grpcurl ") && !strings.HasPrefix(line, "curl ") {
			continue
		}
		cmdline, wantFail, _ := strings.Cut(line, "# fails: ")
		wantFail = strings.TrimSpace(wantFail)
		ran++
		t.Run(fmt.Sprintf("%02d", ran), func(t *testing.T) {
			t.Log(cmdline)
			var out []byte
			proctest.Eventually(t, time.Minute, func() error {
				cmd := exec.Command("bash", "-c", "set -o pipefail; "+strings.Replace(cmdline, "grpcurl ", "grpcurl -max-time 20 ", 1))
				cmd.Env, cmd.Dir = env, work
				var err error
				out, err = cmd.CombinedOutput()
				if err != nil && wantFail == "" && (strings.Contains(string(out), "Unavailable") || strings.Contains(string(out), "Aborted")) {
					return fmt.Errorf("%w: %s", err, out)
				}
				if err != nil && wantFail == "" {
					t.Fatalf("%v\n%s", err, out)
				}
				if wantFail != "" && (err == nil || !strings.Contains(string(out), wantFail)) {
					t.Fatalf("want a %s failure, got %v\n%s", wantFail, err, out)
				}
				return nil
			})
		})
	}
	if ran < 10 {
		t.Fatalf("only %d grpcurl commands in the docs", ran)
	}
	c.eventuallyAgree()
}

// auditInvariant reads the whole audit log: every member the reconciler
// removed belonged to a node deleted before (or to no node at all), and
// every other removal was the curator taking ConsensusMember away for an
// operator.
//
// Every attempt is checked (the intent event, written before the change is
// made), but only applied changes are counted: etcd refuses a removal in
// the seconds after a membership change, the intent's outcome says so, and
// the reconciler's next pass tries again.
func auditInvariant(t *testing.T, c *cluster) {
	events := auditEvents(t, c)
	applied := appliedChanges(events)
	deleted := map[string]bool{}
	removals := 0
	var shrinks, attempts []string
	for _, ev := range events {
		switch {
		case ev.Action == auditv1.AuditAction_AUDIT_ACTION_NODE_DELETE:
			deleted[ev.NodeId] = true
		case ev.Outcome != auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED:
			// The outcome of a change whose intent was checked.
		case ev.Action == auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE && ev.Actor == "reconciler" && strings.Contains(ev.Reason, "is dead (no heartbeat for"):
			// Autopilot: a voter whose node was silent past the threshold
			// (the frozen one), never a live one.
			if ev.NodeId != c.frozen {
				t.Errorf("autopilot removed member %x of node %s as dead, which was not frozen: %v", ev.MemberId, ev.NodeId, ev)
			}
		case ev.Action == auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE && ev.Actor == "reconciler" && strings.Contains(ev.Reason, " is caught up but not needed: "):
			// Autopilot: a standby learner whose voter came back (a
			// learner: no voter is removed this way).
		case ev.Action == auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE && ev.Actor == "reconciler" && strings.Contains(ev.Reason, ", the target is "):
			// Autopilot: the size went from 5 to 3.
			line := fmt.Sprintf("%s %s: %s", ev.Time.AsTime().Format(time.TimeOnly), ev.NodeId, ev.Reason)
			if applied[ev.ChangeId] {
				shrinks = append(shrinks, line)
			}
			attempts = append(attempts, fmt.Sprintf("%s (applied: %t)", line, applied[ev.ChangeId]))
		case ev.Action == auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE && ev.Actor == "reconciler":
			if applied[ev.ChangeId] {
				removals++
			}
			if !deleted[ev.NodeId] {
				t.Errorf("the reconciler removed member %x of node %s, which was not deleted: %v", ev.MemberId, ev.NodeId, ev)
			}
		case ev.Action == auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE && ev.Actor != "curator":
			t.Errorf("member %x of node %s removed by %s", ev.MemberId, ev.NodeId, ev.Actor)
		}
	}
	if removals == 0 {
		t.Fatal("the reconciler removed no member: the delete scenario did not run?")
	}
	if len(shrinks) != 2 {
		t.Fatalf("autopilot removed %d members to shrink, want 2 (5 → 3); its attempts:\n%s", len(shrinks), strings.Join(attempts, "\n"))
	}
}

// auditEvents is the whole audit log, oldest first.
func auditEvents(t *testing.T, c *cluster) []*auditv1.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := audit.Backlog(ctx, c.mgmt(), 10000)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// membershipChanges describes the etcd membership changes (adds,
// promotions, removals) recorded since: how many were applied, and how
// many etcd did not apply (a promotion refused while the learner catches
// up, say) if any.
func membershipChanges(t *testing.T, c *cluster, since time.Time) string {
	applied, not := 0, 0
	for _, ev := range auditEvents(t, c) {
		if ev.Time.AsTime().Before(since) {
			continue
		}
		switch ev.Outcome {
		case auditv1.ChangeOutcome_CHANGE_OUTCOME_APPLIED:
			applied++
		case auditv1.ChangeOutcome_CHANGE_OUTCOME_NOT_APPLIED:
			not++
		}
	}
	if not > 0 {
		return fmt.Sprintf("%d membership changes (and %d that etcd did not apply)", applied, not)
	}
	return fmt.Sprintf("%d membership changes", applied)
}

// timeline is the membership and role changes since begun, one line each
// with its time after begun, for the test's log.
func timeline(t *testing.T, c *cluster, begun time.Time) string {
	var out []string
	for _, ev := range auditEvents(t, c) {
		if ev.Time.AsTime().Before(begun) || ev.Outcome == auditv1.ChangeOutcome_CHANGE_OUTCOME_NOT_APPLIED {
			continue
		}
		if ev.Outcome == auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED && ev.ChangeId != "" {
			continue // an intent: its outcome follows
		}
		switch ev.Action {
		case auditv1.AuditAction_AUDIT_ACTION_MEMBER_ADD, auditv1.AuditAction_AUDIT_ACTION_MEMBER_PROMOTE, auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE,
			auditv1.AuditAction_AUDIT_ACTION_ROLES_RECONCILE_ADD_CONSENSUS_MEMBER, auditv1.AuditAction_AUDIT_ACTION_ROLES_RECONCILE_REMOVE_CONSENSUS_MEMBER:
			out = append(out, fmt.Sprintf("  +%5.1fs %s %s (%s): %s", ev.Time.AsTime().Sub(begun).Seconds(), strings.TrimPrefix(ev.Action.String(), "AUDIT_ACTION_"), c.names[ev.NodeId], ev.Actor, ev.Reason))
		}
	}
	return strings.Join(out, "\n")
}

// logLines are the warnings (and errors) in the named processes' logs
// since begun.
func (c *cluster) logLines(since time.Time, names ...string) string {
	var out []string
	for _, name := range names {
		b, _ := os.ReadFile(filepath.Join(c.state, "logs", name+".log"))
		for _, l := range strings.Split(string(b), "\n") {
			ts, _, _ := strings.Cut(strings.TrimPrefix(l, "time="), " ")
			at, err := time.Parse(time.RFC3339Nano, ts)
			warning := strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR")
			if err != nil || at.Before(since) || !warning {
				continue
			}
			out = append(out, "  "+name+": "+l)
		}
	}
	return strings.Join(out, "\n")
}

// autopilotAdded are the nodes whose members the reconciler added.
func autopilotAdded(t *testing.T, c *cluster) map[string]bool {
	out := map[string]bool{}
	events := auditEvents(t, c)
	applied := appliedChanges(events)
	for _, ev := range events {
		if ev.Action == auditv1.AuditAction_AUDIT_ACTION_MEMBER_ADD && ev.Actor == "reconciler" && applied[ev.ChangeId] {
			out[ev.NodeId] = true
		}
	}
	return out
}

// appliedChanges are the ids of the membership changes whose outcome
// event says etcd applied them.
func appliedChanges(events []*auditv1.Event) map[string]bool {
	out := map[string]bool{}
	for _, ev := range events {
		if ev.Outcome == auditv1.ChangeOutcome_CHANGE_OUTCOME_APPLIED {
			out[ev.ChangeId] = true
		}
	}
	return out
}
