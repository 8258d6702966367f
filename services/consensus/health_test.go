package consensus_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"curia.dev/platform/keys"
	"curia.dev/platform/proctest"
	ct "curia.dev/services/consensus/consensustest"
)

// TestHealthAndMetrics: an idle node is SERVING (its job is to take Start);
// a node restarting its member from disk is NOT_SERVING until etcd serves;
// /metrics carries this process's metrics (the curia_consensus_* gauges
// among them) and /metrics/etcd etcd's own, in full.
func TestHealthAndMetrics(t *testing.T) {
	c := ct.NewCluster(t)
	n := c.NewNode()
	proctest.WaitHealthz(t, n.Metrics, http.StatusOK, 30*time.Second)
	body := proctest.MetricsHave(t, n.Metrics, "curia_consensus_member_running", "curia_build_info", "grpc_server_handled_total",
		`curia_consensus_certificate_expiry_seconds{certificate="api"}`, `curia_consensus_certificate_expiry_seconds{certificate="member"}`)
	if !strings.Contains(body, "\ncuria_consensus_member_running 0") {
		t.Error("an idle node's member counts as running")
	}
	if strings.Contains(body, "\ncuria_consensus_voters") {
		t.Error("an idle node reports voters")
	}
	// consensustest issues certificates for a day or more.
	if v := metricValue(t, body, `curia_consensus_certificate_expiry_seconds{certificate="api"}`); v < 3600 || v > 400*24*3600 {
		t.Errorf("api certificate expires in %vs", v)
	}

	c.Bootstrap(n)
	body = proctest.MetricsHave(t, n.Metrics, "curia_consensus_voters", "curia_consensus_learners", "curia_consensus_failure_tolerance", "curia_consensus_pending_change_age_seconds")
	if !strings.Contains(body, "\ncuria_consensus_member_running 1") {
		t.Error("a bootstrapped member does not count as running")
	}
	for name, want := range map[string]float64{"curia_consensus_voters": 1, "curia_consensus_learners": 0, "curia_consensus_healthy_voters": 1, "curia_consensus_failure_tolerance": 0, "curia_consensus_pending_change_age_seconds": 0} {
		if got := metricValue(t, body, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if strings.Contains(body, "\netcd_server_has_leader") {
		t.Error("/metrics carries etcd's metrics: they belong on /metrics/etcd")
	}

	// etcd's own metrics, its client port's gRPC ones among them, after a
	// KV call.
	cli := c.Etcd(n.ClientURL)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "metrics-test", "x"); err != nil {
		t.Fatal(err)
	}
	etcd := proctest.MetricsAtHave(t, n.Metrics, "/metrics/etcd", "etcd_server_has_leader 1", "etcd_mvcc_db_total_size_in_bytes", "go_goroutines")
	// etcd registers every method's series at 0: the Put counts.
	if v := metricValue(t, etcd, `grpc_server_handled_total{grpc_code="OK",grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary"}`); v < 1 {
		t.Errorf("/metrics/etcd counts %v Puts served by etcd's KV", v)
	}
	if strings.Contains(etcd, "curia_consensus_") {
		t.Error("/metrics/etcd carries curia's metrics")
	}

	// A change pending: its age grows, and is 0 again once none is.
	if _, err := cli.Put(ctx, keys.MembershipPending, "\xff not a pending change record"); err != nil {
		t.Fatal(err)
	}
	ct.Eventually(t, 30*time.Second, func() error {
		if v := scrape(t, n.Metrics, "curia_consensus_pending_change_age_seconds"); v < 1 {
			return fmt.Errorf("pending change age %v, want at least 1", v)
		}
		return nil
	})
	if _, err := cli.Delete(ctx, keys.MembershipPending); err != nil {
		t.Fatal(err)
	}
	ct.Eventually(t, 30*time.Second, func() error {
		if v := scrape(t, n.Metrics, "curia_consensus_pending_change_age_seconds"); v != 0 {
			return fmt.Errorf("pending change age %v with none pending", v)
		}
		return nil
	})

	// Restart with etcd held before it serves.
	n.Stop()
	release := n.Hold("before-ready")
	n.Proc.Start()
	n.Reached("before-ready")
	proctest.WaitHealthz(t, n.Metrics, http.StatusServiceUnavailable, 30*time.Second)
	release()
	proctest.WaitHealthz(t, n.Metrics, http.StatusOK, 30*time.Second)
}

// TestMetricsMembership: voters, learners and the failure tolerance follow
// the membership and the voters' health.
func TestMetricsMembership(t *testing.T) {
	c := ct.NewCluster(t)
	a := c.NewNode()
	c.Bootstrap(a)
	leader := c.Campaign(c.Etcd(a.ClientURL))
	want := func(voters, learners, tolerance float64) {
		t.Helper()
		ct.Eventually(t, 30*time.Second, func() error {
			for name, want := range map[string]float64{"curia_consensus_voters": voters, "curia_consensus_learners": learners, "curia_consensus_failure_tolerance": tolerance} {
				if got := scrape(t, a.Metrics, name); got != want {
					return fmt.Errorf("%s = %v, want %v", name, got, want)
				}
			}
			return nil
		})
	}
	b := c.NewNode()
	id := c.Join(a, b, leader.Fence)
	want(1, 1, 0)
	c.Promote(a, id, leader.Fence)
	want(2, 0, 0) // 2 voters, quorum 2
	d := c.NewNode()
	c.Promote(a, c.Join(a, d, leader.Fence), leader.Fence)
	want(3, 0, 1)
	d.Stop()
	want(3, 0, 0)
}

// scrape is the value of one series (a name, with its labels if any) in
// http://addr/metrics.
func scrape(t testing.TB, addr, series string) float64 {
	t.Helper()
	_, body, err := proctest.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return metricValue(t, body, series)
}

// metricValue is the value of one series in a /metrics body.
func metricValue(t testing.TB, body, series string) float64 {
	t.Helper()
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", series)
	return 0
}
