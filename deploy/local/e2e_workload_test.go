//go:build e2e

package local_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/audit"
	"curia.dev/platform/proctest"
)

// configWrites is the workload the rolls run under (issue 30): cluster
// configuration writes one after another, each with its own reason and its
// own dead_node_threshold (a write that changes nothing is acknowledged
// without an audit event); a worker's kubernetes_worker role toggled; and a
// client that watches the configuration (WatchClusterConfig, dialled again
// when its stream breaks). check wants every acknowledged write in the
// audit log, the worker's role as the last acknowledged toggle left it,
// and the watcher to see the configuration's last value.
type configWrites struct {
	stop      func()
	threshold *durationpb.Duration
	worker    string

	mu                sync.Mutex
	acked             []string
	failed            int
	roleAcked         int
	roleFailed        int
	lastRole          *bool // the last toggle's value, nil when its outcome is unknown
	watched           *durationpb.Duration
	watchReconnects   int
	stopWatch         func()
	watchEvents       int
	workerRoleAtStart bool
}

// startConfigWrites starts the workload; mgmt dials the curators (the
// watcher calls it again after its stream breaks).
func startConfigWrites(ctx context.Context, t *testing.T, mgmt func() curatorv1.ManagementClient, prefix string) *configWrites {
	t.Helper()
	m := mgmt()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cur, err := m.GetClusterConfig(cctx, &curatorv1.GetClusterConfigRequest{})
	if err != nil {
		t.Fatal(err)
	}
	w := &configWrites{threshold: cur.GetConfig().GetDeadNodeThreshold()}
	if w.threshold == nil {
		w.threshold = durationpb.New(5 * time.Minute)
	}
	// A worker: a node with no etcd member (its role changes change no
	// membership).
	st, err := m.GetConsensusStatus(cctx, &curatorv1.GetConsensusStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var members []string
	for _, mem := range st.GetMembers() {
		members = append(members, mem.GetNodeId())
	}
	for _, n := range nodeRecords(cctx, t, m) {
		if !slices.Contains(members, n.GetId()) && n.GetState() == curatorv1.NodeState_NODE_STATE_UP {
			w.worker, w.workerRoleAtStart = n.GetId(), n.GetRoles().GetKubernetesWorker() != nil
			break
		}
	}
	if w.worker == "" {
		t.Fatal("no worker node for the workload's role changes")
	}

	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; wctx.Err() == nil; i++ {
			reason := fmt.Sprintf("%s %d", prefix, i)
			cctx, cancel := context.WithTimeout(wctx, 5*time.Second)
			_, err := m.UpdateClusterConfig(cctx, &curatorv1.UpdateClusterConfigRequest{
				Config:     &curatorv1.ClusterConfig{DeadNodeThreshold: durationpb.New(5*time.Minute + time.Duration(i+1)*time.Millisecond)},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"dead_node_threshold"}}, Reason: reason,
			})
			role := i%2 == 0 != w.workerRoleAtStart
			_, rerr := m.UpdateNodeRoles(cctx, &curatorv1.UpdateNodeRolesRequest{NodeId: w.worker, KubernetesWorker: proto.Bool(role), Reason: reason})
			cancel()
			w.mu.Lock()
			if err == nil {
				w.acked = append(w.acked, reason)
			} else {
				w.failed++
			}
			if rerr == nil {
				w.roleAcked++
				w.lastRole = &role
			} else {
				w.roleFailed++
				w.lastRole = nil
			}
			w.mu.Unlock()
			select {
			case <-wctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	w.stop = func() { stop(); wg.Wait() }

	watchCtx, stopWatch := context.WithCancel(context.Background())
	var watchWG sync.WaitGroup
	watchWG.Go(func() { w.watch(watchCtx, m, mgmt) })
	w.stopWatch = func() { stopWatch(); watchWG.Wait() }
	t.Cleanup(w.stopWatch)
	return w
}

// watch follows the configuration until ctx ends, dialling again (mgmt)
// when a stream breaks.
func (w *configWrites) watch(ctx context.Context, m curatorv1.ManagementClient, mgmt func() curatorv1.ManagementClient) {
	for ctx.Err() == nil {
		stream, err := m.WatchClusterConfig(ctx, &curatorv1.WatchClusterConfigRequest{})
		for err == nil {
			var resp *curatorv1.WatchClusterConfigResponse
			if resp, err = stream.Recv(); err == nil {
				w.mu.Lock()
				w.watched = resp.GetConfig().GetDeadNodeThreshold()
				w.watchEvents++
				w.mu.Unlock()
			}
		}
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		w.watchReconnects++
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
		m = mgmt()
	}
}

// check puts the cluster's threshold back as it was, then checks: every
// acknowledged config write is in the audit log, the worker's role is the
// last acknowledged toggle's, and the watcher saw the threshold put back.
func (w *configWrites) check(t *testing.T, m curatorv1.ManagementClient, during string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	proctest.Eventually(t, time.Minute, func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := m.UpdateClusterConfig(cctx, &curatorv1.UpdateClusterConfigRequest{
			Config:     &curatorv1.ClusterConfig{DeadNodeThreshold: w.threshold},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"dead_node_threshold"}}, Reason: "workload done: the threshold back",
		})
		return err
	})
	proctest.Eventually(t, time.Minute, func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		if !proto.Equal(w.watched, w.threshold) {
			return fmt.Errorf("the watcher's last dead_node_threshold is %v, want %v (it had %d events, %d new streams)",
				w.watched.AsDuration(), w.threshold.AsDuration(), w.watchEvents, w.watchReconnects)
		}
		return nil
	})
	w.stopWatch()

	events, err := audit.Backlog(ctx, m, 10000)
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]bool{}
	for _, e := range events {
		if e.GetAction() == auditv1.AuditAction_AUDIT_ACTION_CLUSTER_CONFIG_UPDATE {
			reasons[e.GetReason()] = true
		}
	}
	var node *curatorv1.Node
	for _, n := range nodeRecords(ctx, t, m) {
		if n.GetId() == w.worker {
			node = n
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	missing := 0
	for _, r := range w.acked {
		if !reasons[r] && !containsPrefix(reasons, r) {
			missing++
		}
	}
	t.Logf("%s: %d config writes acknowledged, %d failed, %d missing from the audit log; %d role changes acknowledged, %d failed; the watcher saw %d configurations over %d streams",
		during, len(w.acked), w.failed, missing, w.roleAcked, w.roleFailed, w.watchEvents, w.watchReconnects+1)
	if missing > 0 || len(w.acked) == 0 {
		t.Errorf("%d of %d acknowledged config writes are not in the audit log", missing, len(w.acked))
	}
	switch {
	case node == nil:
		t.Errorf("the worker %s is gone", w.worker)
	case w.roleAcked == 0:
		t.Error("no role change was acknowledged")
	case w.lastRole != nil && (node.GetRoles().GetKubernetesWorker() != nil) != *w.lastRole:
		t.Errorf("the worker's kubernetes_worker role is %v, the last acknowledged change set %v", node.GetRoles().GetKubernetesWorker() != nil, *w.lastRole)
	}
}
