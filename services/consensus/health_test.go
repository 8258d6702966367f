package consensus_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"curia.dev/platform/proctest"
	ct "curia.dev/services/consensus/consensustest"
)

// TestHealthAndMetrics: an idle node is SERVING (its job is to take Start);
// a node restarting its member from disk is NOT_SERVING until etcd serves;
// /metrics carries curia's and etcd's metrics.
func TestHealthAndMetrics(t *testing.T) {
	c := ct.NewCluster(t)
	n := c.NewNode()
	proctest.WaitHealthz(t, n.Metrics, http.StatusOK, 30*time.Second)
	body := proctest.MetricsHave(t, n.Metrics, "curia_consensus_member_running", "curia_build_info", "grpc_server_handled_total")
	if !strings.Contains(body, "\ncuria_consensus_member_running 0") {
		t.Error("an idle node's member counts as running")
	}

	c.Bootstrap(n)
	body = proctest.MetricsHave(t, n.Metrics, "etcd_server_has_leader")
	if !strings.Contains(body, "\ncuria_consensus_member_running 1") {
		t.Error("a bootstrapped member does not count as running")
	}

	// Restart with etcd held before it serves.
	n.Stop()
	release := n.Hold("before-ready")
	n.Proc.Start()
	n.Reached("before-ready")
	proctest.WaitHealthz(t, n.Metrics, http.StatusServiceUnavailable, 30*time.Second)
	release()
	proctest.WaitHealthz(t, n.Metrics, http.StatusOK, 30*time.Second)
}
