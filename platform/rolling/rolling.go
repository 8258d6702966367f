// Package rolling restarts every process of a curia cluster, one at a time,
// in the order that never costs the quorum: the rolling restart and the
// upgrade of every deployment (the process cluster's curia-local upgrade,
// the compose cluster's, Kubernetes's curia-kube roll). Where the
// processes run and how one is restarted is a Fleet's; the order, the
// maintenance and the health gate between two steps are here, once.
//
//	workers' nodes ─▶ voters' nodes (the etcd leader's last) ─▶ curators (the leader last) ─▶ reconcilers (the active one last)
//	      each node: StartNodeMaintenance ─▶ Fleet.RestartNode ─▶ healthy again ─▶ EndNodeMaintenance
//
// Healthy again means: no learner, every voter healthy, the failure
// tolerance back to what it was before the first step. A cluster that is
// not healthy before the first step is refused with nothing touched.
package rolling

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/audit"
)

// Node is a node whose processes (consensus, roleserve) a Fleet restarts.
type Node struct {
	// ID is the node's id in the registry.
	ID string
	// Name is the fleet's name for it (a process name prefix, a compose
	// service, a pod).
	Name string
}

// Fleet runs a cluster's processes. Every Restart returns the names of
// the processes (containers, pods) it restarted, once they serve again
// (their health checks pass), or an error that says where to look.
type Fleet interface {
	// Nodes are the nodes the fleet runs.
	Nodes(ctx context.Context) ([]Node, error)
	// RestartNode restarts the node's consensus and roleserve and names
	// the processes (containers, pods) it restarted.
	RestartNode(ctx context.Context, n Node) ([]string, error)
	// Curators are the curator replicas, each by the name it campaigns
	// under (GetCurrentLeader's leader_name).
	Curators(ctx context.Context) ([]string, error)
	RestartCurator(ctx context.Context, name string) ([]string, error)
	// Reconcilers are the reconciler replicas, each by the name it holds
	// the lease under (before the "/<incarnation>").
	Reconcilers(ctx context.Context) ([]string, error)
	RestartReconciler(ctx context.Context, name string) ([]string, error)
	// ActiveReconciler is the replica that holds the lease, "" if none
	// answers: it is restarted last.
	ActiveReconciler(ctx context.Context) string
}

// Options are what a roll talks to and how it reports.
type Options struct {
	// Management and Curator reach the curators with an admin identity.
	Management curatorv1.ManagementClient
	Curator    curatorv1.CuratorClient
	// Out gets one line per step, each starting with Prefix.
	Out    io.Writer
	Prefix string
	// Reason is recorded with each node's maintenance.
	Reason string
	// HealthTimeout bounds each wait for the cluster to be healthy again.
	HealthTimeout time.Duration
	// Poll is the period of the health gate and of the watch (default
	// 250 ms).
	Poll time.Duration
}

// Report is what a roll did and measured.
type Report struct {
	// Restarted names the processes restarted, in order.
	Restarted         []string
	MembershipChanges int
	LowestTolerance   int32
	LeaderMoves       int
	// AdminFailuresInARow is the longest run of failed admin calls
	// (GetConsensusStatus, every Poll).
	AdminFailuresInARow int
	// WithoutMaintenance counts the nodes restarted without maintenance:
	// curators of a release before it answered Unimplemented.
	WithoutMaintenance int
	// MostVotersSilent is the most voters that did not answer at once (in
	// one sample of the watch): one while a voter's node restarts; two of
	// three would be a lost quorum.
	MostVotersSilent int
	// LowestWhy says where the lowest failure tolerance was seen (the
	// step under way) and which voters were unhealthy then, and how: a
	// voter that answers without a leader is in an election (a restart of
	// the etcd leader's node without maintenance has one), not down.
	LowestWhy string
	Wall      time.Duration
}

func (r *Report) String() string {
	s := fmt.Sprintf("restarted %d processes in %v; etcd membership changes %d; lowest failure tolerance %d; etcd leader moves %d; admin calls failed at most %d in a row",
		len(r.Restarted), r.Wall.Round(100*time.Millisecond), r.MembershipChanges, r.LowestTolerance, r.LeaderMoves, r.AdminFailuresInARow)
	if r.WithoutMaintenance > 0 {
		s += fmt.Sprintf("; %d nodes without maintenance (older curators)", r.WithoutMaintenance)
	}
	s += fmt.Sprintf("; voters silent at once at most %d", r.MostVotersSilent)
	if r.LowestWhy != "" {
		s += "; the lowest tolerance " + r.LowestWhy
	}
	return s
}

// Check refuses a cluster that is not healthy now: the gate a roll passes
// before it touches anything, for callers that have work of their own to
// do first (install binaries, build images).
func Check(ctx context.Context, m curatorv1.ManagementClient) error {
	if _, err := healthy(ctx, m); err != nil {
		return fmt.Errorf("the cluster is not healthy, so nothing was changed: %w", err)
	}
	return nil
}

// Run rolls the fleet. The report is returned with the error too: what
// was restarted before a step failed.
func Run(ctx context.Context, f Fleet, o Options) (*Report, error) {
	if o.Poll <= 0 {
		o.Poll = 250 * time.Millisecond
	}
	if o.HealthTimeout <= 0 {
		o.HealthTimeout = 3 * time.Minute
	}
	r := &roll{f: f, o: o, report: &Report{}}
	before, err := healthy(ctx, o.Management)
	if err != nil {
		return nil, fmt.Errorf("the cluster is not healthy, so nothing was changed: %w", err)
	}
	r.report.LowestTolerance = before.GetFailureTolerance()
	changesBefore, err := membershipChanges(ctx, o.Management)
	if err != nil {
		return nil, err
	}
	begun := time.Now()
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { r.watch(wctx) })
	err = r.run(ctx, before)
	stop()
	wg.Wait()
	r.report.Wall = time.Since(begun)
	if changes, cerr := membershipChanges(ctx, o.Management); cerr == nil {
		r.report.MembershipChanges = changes - changesBefore
	}
	return r.report, err
}

type roll struct {
	f      Fleet
	o      Options
	mu     sync.Mutex
	report *Report
	// step is what the roll does now, for the report ("restarting
	// node-1").
	step string
}

// doing records the step under way.
func (r *roll) doing(step string) {
	r.mu.Lock()
	r.step = step
	r.mu.Unlock()
}

func (r *roll) say(format string, args ...any) {
	if r.o.Out != nil {
		fmt.Fprintf(r.o.Out, r.o.Prefix+": "+format+"\n", args...)
	}
}

func (r *roll) restarted(names ...string) {
	r.mu.Lock()
	r.report.Restarted = append(r.report.Restarted, names...)
	r.mu.Unlock()
	for _, n := range names {
		r.say("%s restarted", n)
	}
}

// healthy is the consensus status once the cluster is healthy: no
// learner, every voter healthy.
func healthy(ctx context.Context, m curatorv1.ManagementClient) (*curatorv1.GetConsensusStatusResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := m.GetConsensusStatus(cctx, &curatorv1.GetConsensusStatusRequest{})
	if err != nil {
		return nil, err
	}
	for _, mem := range st.GetMembers() {
		if mem.GetLearner() {
			return nil, fmt.Errorf("learner %s (node %s) is catching up", types.ID(mem.GetMemberId()), mem.GetNodeId())
		}
	}
	if st.GetHealthyVoters() != st.GetVoters() {
		return nil, fmt.Errorf("%d of %d voters are healthy", st.GetHealthyVoters(), st.GetVoters())
	}
	return st, nil
}

// awaitHealthy waits until the cluster is healthy with a failure
// tolerance of at least want.
func (r *roll) awaitHealthy(ctx context.Context, want int32, what string) error {
	ctx, cancel := context.WithTimeout(ctx, r.o.HealthTimeout)
	defer cancel()
	for {
		st, err := healthy(ctx, r.o.Management)
		if err == nil && st.GetFailureTolerance() >= want {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("failure tolerance %d, want %d", st.GetFailureTolerance(), want)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s, the cluster is not healthy again: %w", what, err)
		case <-time.After(r.o.Poll):
		}
	}
}

// watch samples the consensus status until ctx ends, for the report.
func (r *roll) watch(ctx context.Context) {
	var leader uint64
	failed := 0
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := r.o.Management.GetConsensusStatus(cctx, &curatorv1.GetConsensusStatusRequest{})
		cancel()
		r.mu.Lock()
		if err != nil && ctx.Err() == nil {
			failed++
			r.report.AdminFailuresInARow = max(r.report.AdminFailuresInARow, failed)
		} else if err == nil {
			failed = 0
			if t := st.GetFailureTolerance(); t < r.report.LowestTolerance {
				r.report.LowestTolerance = t
				r.report.LowestWhy = r.step + unhealthyVoters(st)
			}
			r.report.MostVotersSilent = max(r.report.MostVotersSilent, silentVoters(st))
			for _, mem := range st.GetMembers() {
				if mem.GetLeader() && mem.GetMemberId() != leader {
					if leader != 0 {
						r.report.LeaderMoves++
					}
					leader = mem.GetMemberId()
				}
			}
		}
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.o.Poll):
		}
	}
}

// silentVoters counts the voters that did not answer (the curator got no
// status from their consensus process: no raft index).
func silentVoters(st *curatorv1.GetConsensusStatusResponse) int {
	n := 0
	for _, m := range st.GetMembers() {
		if !m.GetLearner() && !m.GetHealthy() && m.GetRaftIndex() == 0 {
			n++
		}
	}
	return n
}

// unhealthyVoters names the unhealthy voters and how, in words: ", when
// node-1 did not answer and node-3 answered without a leader".
func unhealthyVoters(st *curatorv1.GetConsensusStatusResponse) string {
	var silent, leaderless []string
	for _, m := range st.GetMembers() {
		switch {
		case m.GetLearner() || m.GetHealthy():
		case m.GetRaftIndex() == 0:
			silent = append(silent, m.GetNodeId())
		default:
			leaderless = append(leaderless, m.GetNodeId())
		}
	}
	var parts []string
	if len(silent) > 0 {
		parts = append(parts, strings.Join(silent, ", ")+" did not answer")
	}
	if len(leaderless) > 0 {
		parts = append(parts, strings.Join(leaderless, ", ")+" answered without a leader (an election)")
	}
	if len(parts) == 0 {
		return ""
	}
	return ", when " + strings.Join(parts, " and ")
}

// membershipChanges counts the applied membership changes in the audit
// log.
func membershipChanges(ctx context.Context, m curatorv1.ManagementClient) (int, error) {
	events, err := audit.Backlog(ctx, m, 10000)
	if err != nil {
		return 0, fmt.Errorf("read the audit log: %w", err)
	}
	n := 0
	for _, e := range events {
		switch e.GetAction() {
		case auditv1.AuditAction_AUDIT_ACTION_MEMBER_ADD, auditv1.AuditAction_AUDIT_ACTION_MEMBER_PROMOTE, auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE:
			if e.GetOutcome() == auditv1.ChangeOutcome_CHANGE_OUTCOME_APPLIED {
				n++
			}
		}
	}
	return n, nil
}

// Order is the nodes in the order a roll takes them: workers' nodes
// first, then voters', the etcd leader's last.
func Order(nodes []Node, st *curatorv1.GetConsensusStatusResponse) []Node {
	var leaderNode string
	voters := map[string]bool{}
	for _, mem := range st.GetMembers() {
		voters[mem.GetNodeId()] = true
		if mem.GetLeader() {
			leaderNode = mem.GetNodeId()
		}
	}
	rank := func(n Node) int {
		switch {
		case n.ID == leaderNode:
			return 2
		case voters[n.ID]:
			return 1
		}
		return 0
	}
	out := slices.Clone(nodes)
	slices.SortStableFunc(out, func(a, b Node) int { return rank(a) - rank(b) })
	return out
}

// last sorts names with last at the end.
func last(names []string, last string) []string {
	out := slices.Clone(names)
	slices.SortStableFunc(out, func(a, b string) int { return boolInt(a == last) - boolInt(b == last) })
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// run takes every step; before is the status to come back to after each.
func (r *roll) run(ctx context.Context, before *curatorv1.GetConsensusStatusResponse) error {
	tolerance := before.GetFailureTolerance()
	nodes, err := r.f.Nodes(ctx)
	if err != nil {
		return err
	}
	for _, n := range Order(nodes, before) {
		if err := r.node(ctx, n, tolerance); err != nil {
			return err
		}
	}
	leader, err := r.curatorLeader(ctx)
	if err != nil {
		return err
	}
	curators, err := r.f.Curators(ctx)
	if err != nil {
		return err
	}
	r.say("curator %s leads: it is restarted last of the curators", leader)
	for _, name := range last(curators, leader) {
		r.doing("while restarting curator " + name)
		procs, err := r.f.RestartCurator(ctx, name)
		if err != nil {
			return err
		}
		r.restarted(procs...)
		if err := r.awaitHealthy(ctx, tolerance, "restarting curator "+name); err != nil {
			return err
		}
	}
	recs, err := r.f.Reconcilers(ctx)
	if err != nil {
		return err
	}
	active := r.f.ActiveReconciler(ctx)
	if active != "" {
		r.say("reconciler %s holds the lease: it is restarted last", active)
	} else {
		r.say("no reconciler said which holds the lease: they are restarted in their order")
	}
	for _, name := range last(recs, active) {
		r.doing("while restarting reconciler " + name)
		procs, err := r.f.RestartReconciler(ctx, name)
		if err != nil {
			return err
		}
		r.restarted(procs...)
	}
	return nil
}

// node restarts a node's processes, the node in maintenance meanwhile.
func (r *roll) node(ctx context.Context, n Node, tolerance int32) error {
	ctx2, cancel := context.WithTimeout(ctx, r.o.HealthTimeout)
	defer cancel()
	maintenance := true
	for {
		_, err := r.o.Management.StartNodeMaintenance(ctx2, &curatorv1.StartNodeMaintenanceRequest{NodeId: n.ID, Reason: r.o.Reason, Duration: durationpb.New(10 * time.Minute)})
		if err == nil {
			break
		}
		if status.Code(err) == codes.Unimplemented {
			// Curators of a release before maintenance (they are
			// upgraded after the nodes): the node restarts without it,
			// as it would have before; autopilot acts only on a node
			// silent for dead_node_threshold (default 5m).
			maintenance = false
			r.mu.Lock()
			r.report.WithoutMaintenance++
			r.mu.Unlock()
			break
		}
		select {
		case <-ctx2.Done():
			return fmt.Errorf("node %s (%s) cannot go into maintenance: %w", n.Name, n.ID, err)
		case <-time.After(time.Second):
		}
	}
	if maintenance {
		r.say("%s (%s) in maintenance", n.Name, n.ID)
	} else {
		r.say("%s (%s) restarts without maintenance: the curators predate it", n.Name, n.ID)
	}
	r.doing("while restarting " + n.Name + " (" + n.ID + ")")
	procs, err := r.f.RestartNode(ctx, n)
	if err != nil {
		return err
	}
	r.restarted(procs...)
	if err := r.awaitHealthy(ctx, tolerance, "restarting "+n.Name); err != nil {
		return err
	}
	if !maintenance {
		return nil
	}
	if _, err := r.o.Management.EndNodeMaintenance(ctx, &curatorv1.EndNodeMaintenanceRequest{NodeId: n.ID}); err != nil {
		return fmt.Errorf("end node %s's maintenance: %w", n.Name, err)
	}
	return nil
}

// curatorLeader is the name of the curator replica that leads.
func (r *roll) curatorLeader(ctx context.Context) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := r.o.Curator.GetCurrentLeader(cctx, &curatorv1.GetCurrentLeaderRequest{})
	if err != nil {
		return "", err
	}
	resp, err := stream.Recv()
	if err != nil {
		return "", err
	}
	if resp.GetLeaderName() == "" {
		return "", errors.New("no curator leads")
	}
	return resp.GetLeaderName(), nil
}
