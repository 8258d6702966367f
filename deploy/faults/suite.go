package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"curia.dev/deploy/faults/internal/registry"
	"curia.dev/deploy/local"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// Config is one run of the suite.
type Config struct {
	// Seed decides the nemeses' schedule and the workload's choices.
	Seed uint64
	// Duration is how long faults are injected (the final heal and the
	// checks come on top).
	Duration time.Duration
	// Nemeses are the kinds injected (default: all).
	Nemeses []string
	// Mutations switch safety mechanisms off (failpoint.Mutated), to show
	// that the checker catches their absence.
	Mutations []string
	// Delays widen failpoints (name → duration) beyond the defaults, to
	// aim a run at one window.
	Delays map[string]string
	// Bin holds the service binaries, built with the failpoints tag.
	Bin string
	// Dir receives the cluster's state and logs, the report and, on a
	// linearizability violation, its visualization.
	Dir string
	// Subnet is the network's /24 (e.g. "10.77.7"); Name names its
	// namespaces and links.
	Subnet, Name string
	// VoterFloor is the reconcilers' --voter-floor.
	VoterFloor int
	// StrictReconfig keeps etcd's own checks before a membership change
	// (a quorum of voters in contact for 5s, the change keeping an active
	// quorum). Off by default: curia's quorum guard and its one change at
	// a time must hold alone, and without etcd's pause after each change
	// the nemeses land more changes in a run.
	StrictReconfig bool
	// Out receives the run's log.
	Out io.Writer
}

// Run runs the suite and returns its report; the run failed when the
// report has violations.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if len(cfg.Nemeses) == 0 {
		cfg.Nemeses = AllNemeses
	}
	for _, n := range cfg.Nemeses {
		if !slices.Contains(AllNemeses, n) {
			return nil, fmt.Errorf("unknown nemesis %q (know %s)", n, strings.Join(AllNemeses, ", "))
		}
	}
	if cfg.VoterFloor == 0 {
		cfg.VoterFloor = 1
	}
	rng := mrand.New(mrand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	c, stop, err := startCluster(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer stop()

	ck := &checker{}
	// The roller runs beside the deck of the others.
	deck := slices.DeleteFunc(slices.Clone(cfg.Nemeses), func(k string) bool { return k == NemRollingRestart })
	nem := newNemesis(c, rng, deck)
	var roll *roller
	if len(deck) < len(cfg.Nemeses) {
		roll = &roller{c: c, nem: nem, rng: mrand.New(mrand.NewPCG(rng.Uint64(), 7))}
	}
	report := &Report{Seed: cfg.Seed, Nemeses: cfg.Nemeses, Mutations: cfg.Mutations, StrictReconfig: cfg.StrictReconfig, Faults: map[string]int{}}
	reg := &registry.History{}
	w := &workload{cluster: c, admin: c.admin, registry: reg, callTimeout: 10 * time.Second,
		internal: func(what string, err error) {
			ck.violate(InvNoInternalError, time.Now(), "%s answered %v", what, err)
		}}

	runCtx, cancelRun := context.WithTimeout(ctx, cfg.Duration)
	defer cancelRun()
	var wg sync.WaitGroup
	spawn := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}

	// The sampler runs until the very end (through the final heal).
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	var timings timingsRecorder
	samplerDone := make(chan struct{})
	go func() {
		defer close(samplerDone)
		c.sample(sampleCtx, ck, nem, cfg.VoterFloor)
	}()

	// The workload.
	ticket, err := c.ticket(ctx)
	if err != nil {
		return nil, err
	}
	synth, err := newSynthetics(6)
	if err != nil {
		return nil, err
	}
	// Every node but the bootstrap node, as they are now (a reinstalled
	// node has a new id).
	operable := func() []string {
		var ids []string
		for _, n := range c.lc.NodeList()[1:] {
			ids = append(ids, n.ID)
		}
		return ids
	}
	for i := range 2 {
		r := mrand.New(mrand.NewPCG(rng.Uint64(), uint64(i)))
		spawn(func() { w.operator(runCtx, r, operable, 3*time.Second) })
	}
	for i := range 3 {
		r := mrand.New(mrand.NewPCG(rng.Uint64(), uint64(100+i)))
		spawn(func() { w.registryClient(runCtx, i, r, synth, ticket, 400*time.Millisecond) })
	}
	spawn(func() { w.auditReader(runCtx, 2*time.Second) })
	spawn(func() {
		w.watcher(runCtx, func(s string) { ck.violate(InvLinearizable, time.Now(), "%s", s) })
	})

	// The nemeses, and what their faults take to get over.
	if roll != nil {
		spawn(func() { roll.run(runCtx) })
	}
	spawn(func() {
		if len(deck) == 0 {
			return
		}
		nem.run(runCtx, func(f *fault) {
			if f.takeover != "" {
				spawn(func() { timings.takeover(runCtx, c, f, func() bool { return nem.isHealed(f) }) })
			}
		}, func(f *fault) {
			if took := timings.convergence(runCtx, c, f); took > 0 {
				nem.converged(f, took)
			}
		})
	})
	begun := time.Now()
	<-runCtx.Done()
	wg.Wait()
	report.Duration = time.Since(begun).Round(time.Second).String()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	// The final heal: every cut mended, every process running.
	if err := c.net.HealAll(); err != nil {
		return nil, err
	}
	for _, p := range c.processes() {
		if pid := c.pid(p); pid != 0 {
			_ = syscall.Kill(pid, syscall.SIGCONT) // fails only once it has exited
		}
	}
	final := time.Now()
	if err := c.converged(ctx, 3*time.Minute); err != nil {
		ck.violate(InvConverged, time.Now(), "%v", err)
		report.FinalConvergence = "not within 3m0s: " + err.Error()
	} else {
		report.FinalConvergence = time.Since(final).Round(time.Millisecond).String()
	}
	stopSampling()
	<-samplerDone

	// The recorded history (read within bounds: etcd may have no quorum
	// left, which the final convergence reported already).
	hctx, cancelHistory := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelHistory()
	if events, err := readAudit(hctx, c.etcd); err != nil {
		ck.violate(InvConverged, time.Now(), "the audit log could not be read after the final heal: %v", err)
	} else {
		ck.checkAudit(hctx, c.etcd, events)
		ck.checkExplained(events, nem.injectedMembers(), cfg.VoterFloor)
	}
	viz := filepath.Join(cfg.Dir, fmt.Sprintf("registry-seed-%d.html", cfg.Seed))
	verdict, err := registry.Check(reg, time.Minute, viz)
	if err != nil {
		return nil, err
	}
	report.Registry, report.RegistryOps = verdict.String(), verdict.Ops
	report.RoleWrites, report.RoleWritesUnchecked = ck.checkDurable(hctx, c.etcd, &w.roleAcks)
	if !verdict.OK() {
		report.Visualization = viz
		ck.violate(InvLinearizable, time.Now(), "%s", verdict)
	}

	var slowest fault
	for _, f := range nem.Faults() {
		report.Faults[f.Kind]++
		report.FaultLog = append(report.FaultLog, f)
		if f.convergedIn > slowest.convergedIn {
			slowest = f
		}
	}
	if slowest.convergedIn > 0 {
		report.SlowestHeal = fmt.Sprintf("%s after %s on %s (healed %s)", slowest.ConvergedIn, slowest.Kind, slowest.Target, slowest.Healed.Format("15:04:05.000"))
	}
	if roll != nil {
		report.Rolls, report.RollsStopped = roll.Rolls, roll.Refused
	}
	report.Ops = w.stats.snapshot()
	report.Violations = ck.Violations()
	report.Convergence, report.CuratorFailover, report.ReconcilerTakeover = timings.summary()
	report.Samples, report.MaxSampleGap = ck.sampleStats()
	if err := report.Save(filepath.Join(cfg.Dir, fmt.Sprintf("report-seed-%d.json", cfg.Seed))); err != nil {
		return nil, err
	}
	return report, nil
}

// startCluster builds the network and brings the cluster up in it, with
// the failpoint directory and mutations every process inherits.
func startCluster(ctx context.Context, cfg Config) (*cluster, func(), error) {
	state := filepath.Join(cfg.Dir, "cluster")
	fp := filepath.Join(cfg.Dir, "failpoints")
	for _, d := range []string{state, fp} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, nil, err
		}
	}
	// Every change stays in flight a little after its fenced start, and
	// every reconciler call waits a little before it goes out: other
	// actors land inside those windows.
	delays := map[string]string{"after-commit": "20ms", "before-call": "100ms"}
	maps.Copy(delays, cfg.Delays)
	for point, d := range delays {
		if err := os.WriteFile(filepath.Join(fp, point+".delay"), []byte(d), 0o600); err != nil {
			return nil, nil, err
		}
	}
	os.Setenv("CURIA_FAILPOINT_DIR", fp)
	os.Setenv("CURIA_MUTATIONS", strings.Join(cfg.Mutations, ","))

	consensusArgs := []string{"--member-call-timeout", "3s", "--max-member-call-timeout", "3s"}
	if !cfg.StrictReconfig {
		consensusArgs = append(consensusArgs, "--unsafe-no-strict-reconfig")
	}
	lcfg := local.Config{
		State: state, Bin: cfg.Bin, Cluster: "faults.curia",
		ControlPlane: 3, Workers: 1, Curators: 2, Reconcilers: 2,
		Subnet: cfg.Subnet, Out: io.Discard,
		Log: slog.New(slog.NewTextHandler(cfg.Out, &slog.HandlerOptions{Level: slog.LevelWarn})),
		ExtraArgs: map[string][]string{
			"consensus":  consensusArgs,
			"reconciler": {"--lease-ttl", "6s", "--tick", "1s", "--stabilization", "2s", "--voter-floor", fmt.Sprint(cfg.VoterFloor)},
			"curator":    {"--session-ttl", "3s"},
		},
	}
	lc := local.New(lcfg)
	hosts := map[string]string{}
	for _, n := range lc.Nodes {
		hosts[n.Name] = n.Host
	}
	for i, addr := range lc.Curators {
		hosts[fmt.Sprintf("curator-%d", i+1)] = strings.Split(addr, ":")[0]
	}
	for i, addr := range lc.Reconcilers {
		hosts[fmt.Sprintf("reconciler-%d", i+1)] = strings.Split(addr, ":")[0]
	}
	net, err := NewNet(cfg.Name, cfg.Subnet, hosts)
	if err != nil {
		return nil, nil, err
	}
	byIP := map[string]string{}
	for name, ip := range hosts {
		byIP[ip] = name
	}
	lcfg.Wrap = func(ip string) []string { return net.Exec(byIP[ip]) }
	lc = local.New(lcfg)
	runCtx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- lc.Run(runCtx) }()
	c := &cluster{net: net, lc: lc, state: state, name: cfg.Name, hosts: hosts, failpoints: fp, out: cfg.Out}
	stop := func() {
		cancel()
		if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
			lcfg.Log.Warn("curia-local ended", "err", err)
		}
		c.mu.Lock()
		for _, t := range c.twins {
			t.Signal(syscall.SIGKILL)
		}
		c.mu.Unlock()
		c.closeConns()
		if c.admin != nil {
			c.admin.Close()
		}
		if c.etcd != nil {
			c.etcd.Close()
		}
		net.Close()
	}
	fail := func(err error) (*cluster, func(), error) { stop(); return nil, nil, err }

	// Wait for the PKI, then for roles and membership to agree.
	if err := waitFile(ctx, filepath.Join(state, "pki", pki.CACertFile), runErr); err != nil {
		return fail(err)
	}
	ca, err := os.ReadFile(lc.AdminFiles().CA)
	if err != nil {
		return fail(err)
	}
	c.caPEM = ca
	if c.adminCreds, err = rpc.LoadCredentials(lcfg.Cluster, lc.AdminFiles()); err != nil {
		return fail(err)
	}
	if c.admin, err = lc.AdminConn(); err != nil {
		return fail(err)
	}
	curatorCreds, err := rpc.LoadCredentials(lcfg.Cluster, lc.TLSFiles("curator"))
	if err != nil {
		return fail(err)
	}
	if c.etcd, err = newEtcd(curatorCreds, lc.Nodes); err != nil {
		return fail(err)
	}
	if err := c.converged(ctx, 3*time.Minute); err != nil {
		return fail(fmt.Errorf("the cluster did not come up: %w", err))
	}
	// curia-local's cluster keeps 3 voters with autopilot; the suite's
	// operators give and take ConsensusMember by hand, and the checker
	// counts every removal of a live member: manual, as an operator who
	// hand-picks the control plane sets it.
	mctx, mcancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = curatorv1.NewManagementClient(c.admin).UpdateClusterConfig(mctx, &curatorv1.UpdateClusterConfigRequest{
		Config: &curatorv1.ClusterConfig{ControlPlaneSize: 0}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"control_plane_size"}}, Reason: "fault suite: the operators hand-pick the control plane",
	})
	mcancel()
	if err != nil {
		return fail(fmt.Errorf("set the control plane to manual: %w", err))
	}
	c.logf("cluster up: %d nodes, %d curators, %d reconcilers in namespaces of %s", len(lc.Nodes), len(lc.Curators), len(lc.Reconcilers), cfg.Subnet)
	return c, stop, nil
}

func waitFile(ctx context.Context, path string, runErr chan error) error {
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		select {
		case err := <-runErr:
			if err == nil {
				return errors.New("curia-local stopped")
			}
			return fmt.Errorf("curia-local stopped: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ticket is the cluster's register ticket.
func (c *cluster) ticket(ctx context.Context) ([]byte, error) {
	resp, err := curatorv1.NewManagementClient(c.admin).GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{})
	if err != nil {
		return nil, err
	}
	return resp.GetTicket(), nil
}

// agreement says why roles, membership and the agents disagree ("" when
// they agree): every member a voter of a node with ConsensusMember, no
// role without a member, an etcd leader, every member started, and every
// node's agent acting on its record's roles.
func (c *cluster) agreement(ctx context.Context) string {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := curatorv1.NewManagementClient(c.admin).GetConsensusStatus(cctx, &curatorv1.GetConsensusStatusRequest{})
	if err != nil {
		return fmt.Sprintf("consensus status: %v", err)
	}
	leader := false
	members := map[string]bool{}
	for _, m := range st.GetMembers() {
		switch {
		case !m.GetNodeExists():
			return fmt.Sprintf("member %x belongs to no node", m.GetMemberId())
		case !m.GetHasRole():
			return fmt.Sprintf("member %x's node %s lacks ConsensusMember", m.GetMemberId(), m.GetNodeId())
		case m.GetLearner():
			return fmt.Sprintf("member %x (node %s) is still a learner", m.GetMemberId(), m.GetNodeId())
		case !m.GetStarted():
			return fmt.Sprintf("member %x (node %s) never started", m.GetMemberId(), m.GetNodeId())
		}
		leader = leader || m.GetLeader()
		members[m.GetNodeId()] = true
	}
	if !leader {
		return "etcd has no leader"
	}
	if len(st.GetRoleWithoutMember()) > 0 {
		return fmt.Sprintf("nodes with ConsensusMember but no member: %v", st.GetRoleWithoutMember())
	}
	for _, n := range c.lc.NodeList() {
		as, err := c.agentStatus(ctx, n)
		if err != nil {
			return fmt.Sprintf("agent of %s: %v", n.Name, err)
		}
		if got := as.GetRoles().GetConsensusMember() != nil; got != members[n.ID] {
			return fmt.Sprintf("the agent of %s acts on ConsensusMember=%v, etcd membership says %v", n.Name, got, members[n.ID])
		}
		phase := as.GetLauncher().GetPhase()
		if members[n.ID] && phase != "running" || !members[n.ID] && phase != "left" && phase != "none" && phase != "" {
			return fmt.Sprintf("the agent of %s is %q, want its consensus %s", n.Name, phase, map[bool]string{true: "running", false: "left"}[members[n.ID]])
		}
	}
	return ""
}

// converged waits until agreement, at most within.
func (c *cluster) converged(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	why := ""
	for time.Now().Before(deadline) {
		if why = c.agreement(ctx); why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return errors.New(why)
}

// sample looks at the cluster every 150 ms (so that no two looks are more
// than 200 ms apart, even on a busy machine) until ctx ends; each look runs
// on its own, so that a slow answer (etcd without quorum, a paused
// process) does not delay the next.
func (c *cluster) sample(ctx context.Context, ck *checker, nem *nemesis, floor int) {
	tick := time.NewTicker(150 * time.Millisecond)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := c.look(ctx)
			ck.observe(s, c.quorumLossExplained(s, nem), floor, 10*time.Second)
		}()
	}
}

// look is one sample: a linearizable read, the member list, and which
// reconciler processes say they hold the lease.
func (c *cluster) look(ctx context.Context) sample {
	s := sample{at: time.Now(), active: map[string]activeLease{}}
	qctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := c.etcd.Get(qctx, "/curia/faults-quorum-probe")
	s.quorum = err == nil
	if list, err := c.etcd.MemberList(qctx); err == nil {
		s.members = map[uint64]memberView{}
		for _, m := range list.Members {
			s.members[m.ID] = memberView{node: m.Name, learner: m.IsLearner}
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, addr := range c.reconcilerAddrs() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := c.reconcilerStatus(ctx, addr)
			if err != nil || st.GetRole() != reconcilerv1.Role_ROLE_ACTIVE {
				return
			}
			mu.Lock()
			s.active[name] = activeLease{fence: st.GetFence().String(), expires: st.GetLeaseExpires().AsTime()}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return s
}

// quorumLossExplained says whether the faults in force (or healed a
// moment ago) stop or cut off enough voters to cost etcd its quorum.
func (c *cluster) quorumLossExplained(s sample, nem *nemesis) bool {
	down, recent := nem.downHosts(s.at, 15*time.Second)
	if recent {
		return true
	}
	c.lastMembersMu.Lock()
	if s.members != nil {
		c.lastMembers = s.members
	}
	members := c.lastMembers
	c.lastMembersMu.Unlock()
	voters, cut := 0, 0
	for _, m := range members {
		if m.learner {
			continue
		}
		voters++
		// (A voter of no node is an orphan the nemesis added: never started.)
		if m.node == "" || slices.Contains(down, c.hostOfNode(m.node)) {
			cut++
		}
	}
	return voters > 0 && voters-cut < voters/2+1
}
