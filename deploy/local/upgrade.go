package local

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/audit"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// Upgrade replaces every process of a running process cluster (curia-local
// run, make run) with the binaries of dir, one at a time, in the order that
// never costs the quorum: the workers' nodes, the voters' nodes that do
// not lead etcd, the leader's node (its leadership moved first), the
// curators (the leader last), the reconcilers (the active one last). Each
// node is in maintenance (StartNodeMaintenance) while its processes are
// down, so autopilot neither replaces its voter nor adds a standby; the
// next step starts only once the cluster is healthy again: no learner,
// failure tolerance back to where it was, every curator answering. With dir
// the cluster's own binary directory, it is a rolling restart.
//
// The binaries are installed into the cluster's directory first (each by
// a rename: a running process keeps the file it started from); the
// supervisor of curia-local run starts each process again, from the new
// binary, after the upgrade stops it (SIGTERM).
//
// What it measured comes back in the report: membership changes, the
// lowest failure tolerance and the etcd leader moves seen, admin calls that
// failed twice in a row, the wall time.
func (c *Cluster) Upgrade(ctx context.Context, dir string) (*UpgradeReport, error) {
	if err := c.ReadIDs(); err != nil {
		return nil, err
	}
	bins := []string{"consensus", "curator", "reconciler", "roleserve"}
	if err := checkBinaries(dir, bins); err != nil {
		return nil, err
	}
	admin, err := c.AdminConn()
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	m := curatorv1.NewManagementClient(admin)
	u := &upgrade{c: c, m: m, admin: admin, report: &UpgradeReport{}}
	// Healthy before anything is touched: a cluster that is not gets
	// no restart.
	before, err := u.healthy(ctx)
	if err != nil {
		return nil, fmt.Errorf("the cluster is not healthy, so nothing was changed: %w", err)
	}
	u.report.LowestTolerance = before.GetFailureTolerance()
	changesBefore, err := u.membershipChanges(ctx)
	if err != nil {
		return nil, err
	}
	if err := installBinaries(dir, c.cfg.Bin, bins); err != nil {
		return nil, err
	}
	begun := time.Now()
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { u.watch(wctx) })
	err = u.run(ctx, before.GetFailureTolerance())
	stop()
	wg.Wait()
	u.report.Wall = time.Since(begun)
	if changes, cerr := u.membershipChanges(ctx); cerr == nil {
		u.report.MembershipChanges = changes - changesBefore
	}
	return u.report, err
}

// UpgradeReport is what an upgrade did and measured.
type UpgradeReport struct {
	Restarted         []string
	MembershipChanges int
	LowestTolerance   int32
	LeaderMoves       int
	// AdminFailuresInARow is the longest run of failed admin calls
	// (GetConsensusStatus, every 250 ms).
	AdminFailuresInARow int
	// WithoutMaintenance counts the nodes restarted without maintenance:
	// curators of a release before it answered Unimplemented.
	WithoutMaintenance int
	Wall               time.Duration
}

func (r *UpgradeReport) String() string {
	s := fmt.Sprintf("restarted %d processes in %v; etcd membership changes %d; lowest failure tolerance %d; etcd leader moves %d; admin calls failed at most %d in a row",
		len(r.Restarted), r.Wall.Round(100*time.Millisecond), r.MembershipChanges, r.LowestTolerance, r.LeaderMoves, r.AdminFailuresInARow)
	if r.WithoutMaintenance > 0 {
		s += fmt.Sprintf("; %d nodes without maintenance (older curators)", r.WithoutMaintenance)
	}
	return s
}

// checkBinaries refuses a directory that lacks one of bins.
func checkBinaries(dir string, bins []string) error {
	var missing []string
	for _, b := range bins {
		st, err := os.Stat(filepath.Join(dir, b))
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s has no executable %s: nothing was changed (make build writes them to bin/)", dir, strings.Join(missing, ", "))
	}
	return nil
}

// installBinaries copies bins from dir into to, each by a rename; the
// same directory installs nothing (a rolling restart).
func installBinaries(dir, to string, bins []string) error {
	a, err1 := filepath.Abs(dir)
	b, err2 := filepath.Abs(to)
	if err1 == nil && err2 == nil && a == b {
		return nil
	}
	for _, bin := range bins {
		data, err := os.ReadFile(filepath.Join(dir, bin))
		if err != nil {
			return err
		}
		tmp := filepath.Join(to, "."+bin+".new")
		if err := os.WriteFile(tmp, data, 0o755); err != nil { //nolint:gosec // G306: an executable
			return err
		}
		if err := os.Rename(tmp, filepath.Join(to, bin)); err != nil {
			return err
		}
	}
	return nil
}

type upgrade struct {
	c      *Cluster
	m      curatorv1.ManagementClient
	admin  *grpc.ClientConn
	mu     sync.Mutex
	report *UpgradeReport
}

// healthy is the consensus status once the cluster is healthy: no learner,
// every voter healthy, every member's node known.
func (u *upgrade) healthy(ctx context.Context) (*curatorv1.GetConsensusStatusResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := u.m.GetConsensusStatus(cctx, &curatorv1.GetConsensusStatusRequest{})
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
func (u *upgrade) awaitHealthy(ctx context.Context, want int32, what string) error {
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	for {
		st, err := u.healthy(ctx)
		if err == nil && st.GetFailureTolerance() >= want {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("failure tolerance %d, want %d", st.GetFailureTolerance(), want)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s, the cluster is not healthy again: %w", what, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// watch samples the consensus status until ctx ends, for the report.
func (u *upgrade) watch(ctx context.Context) {
	var leader uint64
	failed := 0
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := u.m.GetConsensusStatus(cctx, &curatorv1.GetConsensusStatusRequest{})
		cancel()
		u.mu.Lock()
		if err != nil && ctx.Err() == nil {
			failed++
			u.report.AdminFailuresInARow = max(u.report.AdminFailuresInARow, failed)
		} else if err == nil {
			failed = 0
			u.report.LowestTolerance = min(u.report.LowestTolerance, st.GetFailureTolerance())
			for _, mem := range st.GetMembers() {
				if mem.GetLeader() && mem.GetMemberId() != leader {
					if leader != 0 {
						u.report.LeaderMoves++
					}
					leader = mem.GetMemberId()
				}
			}
		}
		u.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// membershipChanges counts the membership changes in the audit log.
func (u *upgrade) membershipChanges(ctx context.Context) (int, error) {
	events, err := audit.Backlog(ctx, u.m, 10000)
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

// run takes every step; tolerance is the failure tolerance to come back to
// after each.
func (u *upgrade) run(ctx context.Context, tolerance int32) error {
	st, err := u.m.GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{})
	if err != nil {
		return err
	}
	var leaderNode string
	voters := map[string]bool{}
	for _, mem := range st.GetMembers() {
		voters[mem.GetNodeId()] = true
		if mem.GetLeader() {
			leaderNode = mem.GetNodeId()
		}
	}
	// Nodes: workers, then voters, the etcd leader's last.
	var order []Node
	for _, n := range u.c.Nodes {
		if !voters[n.ID] {
			order = append(order, n)
		}
	}
	for _, n := range u.c.Nodes {
		if voters[n.ID] && n.ID != leaderNode {
			order = append(order, n)
		}
	}
	for _, n := range u.c.Nodes {
		if n.ID == leaderNode {
			order = append(order, n)
		}
	}
	for _, n := range order {
		if err := u.node(ctx, n, tolerance); err != nil {
			return err
		}
	}
	// Curators, the leader last.
	leader, err := u.curatorLeader(ctx)
	if err != nil {
		return err
	}
	curators := slices.Clone(u.c.Curators)
	slices.SortStableFunc(curators, func(a, b string) int {
		return boolInt(curatorName(u.c, a) == leader) - boolInt(curatorName(u.c, b) == leader)
	})
	for _, addr := range curators {
		name := curatorName(u.c, addr)
		if err := u.restart(ctx, name, "curator", hostOf(addr)); err != nil {
			return err
		}
		if err := u.awaitHealthy(ctx, tolerance, "restarting "+name); err != nil {
			return err
		}
	}
	// Reconcilers, the active one last.
	active := u.activeReconciler(ctx)
	recs := slices.Clone(u.c.Reconcilers)
	slices.SortStableFunc(recs, func(a, b string) int {
		return boolInt(reconcilerName(u.c, a) == active) - boolInt(reconcilerName(u.c, b) == active)
	})
	for _, addr := range recs {
		if err := u.restart(ctx, reconcilerName(u.c, addr), "reconciler", hostOf(addr)); err != nil {
			return err
		}
	}
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func curatorName(c *Cluster, addr string) string {
	return fmt.Sprintf("curator-%d", slices.Index(c.Curators, addr)+1)
}

func reconcilerName(c *Cluster, addr string) string {
	return fmt.Sprintf("reconciler-%d", slices.Index(c.Reconcilers, addr)+1)
}

// node restarts a node's consensus and roleserve processes, the node in
// maintenance meanwhile.
func (u *upgrade) node(ctx context.Context, n Node, tolerance int32) error {
	reason := "rolling restart (curia-local upgrade)"
	ctx2, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	maintenance := true
	for {
		_, err := u.m.StartNodeMaintenance(ctx2, &curatorv1.StartNodeMaintenanceRequest{NodeId: n.ID, Reason: reason, Duration: durationpb.New(10 * time.Minute)})
		if err == nil {
			break
		}
		if status.Code(err) == codes.Unimplemented {
			// Curators of a release before maintenance (they are
			// upgraded after the nodes): the node restarts without it,
			// as it would have before; autopilot acts only on a node
			// silent for dead_node_threshold (default 5m).
			maintenance = false
			u.mu.Lock()
			u.report.WithoutMaintenance++
			u.mu.Unlock()
			break
		}
		select {
		case <-ctx2.Done():
			return fmt.Errorf("node %s (%s) cannot go into maintenance: %w", n.Name, n.ID, err)
		case <-time.After(time.Second):
		}
	}
	if maintenance {
		fmt.Fprintf(u.c.cfg.Out, "curia-local upgrade: %s (%s) in maintenance\n", n.Name, n.ID)
	} else {
		fmt.Fprintf(u.c.cfg.Out, "curia-local upgrade: %s (%s) restarts without maintenance: the curators predate it\n", n.Name, n.ID)
	}
	for _, bin := range []string{"consensus", "roleserve"} {
		if err := u.restart(ctx, n.Name+"-"+bin, bin, n.Host); err != nil {
			return err
		}
	}
	if err := u.awaitHealthy(ctx, tolerance, "restarting "+n.Name); err != nil {
		return err
	}
	if !maintenance {
		return nil
	}
	if _, err := u.m.EndNodeMaintenance(ctx, &curatorv1.EndNodeMaintenanceRequest{NodeId: n.ID}); err != nil {
		return fmt.Errorf("end node %s's maintenance: %w", n.Name, err)
	}
	return nil
}

// restart stops one process (SIGTERM), waits until its supervisor started
// it again and it reports SERVING.
func (u *upgrade) restart(ctx context.Context, name, bin, host string) error {
	pidFile := u.c.path("run", name+".pid")
	old, err := readPID(pidFile)
	if err != nil {
		return fmt.Errorf("%s: %w (is the cluster running under curia-local run?)", name, err)
	}
	if err := syscall.Kill(old, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop %s (pid %d): %w", name, old, err)
	}
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	url := "http://" + metricsAddr(host, bin) + "/healthz"
	client := &http.Client{Timeout: 2 * time.Second}
	var last string
	for {
		if pid, err := readPID(pidFile); err == nil && pid != old {
			if last = healthz(client, url); last == "" {
				break
			}
		} else {
			last = "not started again yet"
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not come back healthy (%s); see %s", name, last, u.c.path("logs", name+".log"))
		case <-time.After(250 * time.Millisecond):
		}
	}
	u.mu.Lock()
	u.report.Restarted = append(u.report.Restarted, name)
	u.mu.Unlock()
	fmt.Fprintf(u.c.cfg.Out, "curia-local upgrade: %s restarted\n", name)
	return nil
}

func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s holds no pid", path)
	}
	return pid, nil
}

// curatorLeader is the curator replica that leads.
func (u *upgrade) curatorLeader(ctx context.Context) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := curatorv1.NewCuratorClient(u.admin).GetCurrentLeader(cctx, &curatorv1.GetCurrentLeaderRequest{})
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

// activeReconciler is the reconciler replica that holds the lease ("" if
// none answers).
func (u *upgrade) activeReconciler(ctx context.Context) string {
	creds, err := rpc.LoadCredentials(u.c.cfg.Cluster, u.c.AdminFiles())
	if err != nil {
		return ""
	}
	cc, err := rpc.DialAny(u.c.Reconcilers, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindReconciler}})
	if err != nil {
		return ""
	}
	defer cc.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := reconcilerv1.NewReconcilerClient(cc).GetStatus(cctx, &reconcilerv1.GetStatusRequest{})
	if err != nil {
		return ""
	}
	return st.GetLeaseHolder()
}
