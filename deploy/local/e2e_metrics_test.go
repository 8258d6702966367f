//go:build e2e

package local_test

import (
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"curia.dev/platform/proctest"
)

// metricsScenario scrapes every process of the cluster (curia-local's
// layout: nodes at .11 and up, curators at .21 and .22, reconcilers at .31
// and .32 of the subnet; metrics ports as deploy/local/health.go) and checks
// the series docs/metrics.md describes, on a cluster of three healthy
// voters: each consensus process's own and its etcd's (/metrics/etcd), the
// curators', the reconcilers', the agents'.
func metricsScenario(t *testing.T, c *cluster) {
	subnet := c.layout[slices.Index(c.layout, "--subnet")+1]
	host := func(i int) string { return fmt.Sprintf("%s.%d", subnet, i) }
	var curators, reconcilers []string
	for i := range 2 {
		curators = append(curators, net.JoinHostPort(host(21+i), "9200"))
		reconcilers = append(reconcilers, net.JoinHostPort(host(31+i), "9300"))
	}
	// The three control-plane nodes are the voters (the cold start).
	for i := range c.nodes {
		addr := net.JoinHostPort(host(11+i), "9100")
		proctest.MetricsHave(t, addr, `curia_consensus_certificate_expiry_seconds{certificate="api"}`)
		proctest.MetricsHave(t, net.JoinHostPort(host(11+i), "9400"), `curia_roleserve_certificate_expiry_seconds{certificate="node"}`)
		if i >= 3 {
			continue
		}
		proctest.Eventually(t, time.Minute, func() error {
			body, err := get(addr, "/metrics")
			if err != nil {
				return err
			}
			for series, want := range map[string]float64{"curia_consensus_voters": 3, "curia_consensus_learners": 0, "curia_consensus_healthy_voters": 3, "curia_consensus_failure_tolerance": 1, "curia_consensus_pending_change_age_seconds": 0} {
				if got := seriesValue(body, series); got != want {
					return fmt.Errorf("%s of %s = %v, want %v", series, addr, got, want)
				}
			}
			if v := seriesValue(body, `curia_consensus_certificate_expiry_seconds{certificate="member"}`); !(v >= 3600) {
				return fmt.Errorf("the member certificate of %s expires in %vs", addr, v)
			}
			return nil
		})
		etcd := proctest.MetricsAtHave(t, addr, "/metrics/etcd", "etcd_server_has_leader 1", "etcd_mvcc_db_total_size_in_bytes", "etcd_server_quota_backend_bytes",
			`grpc_server_handled_total{grpc_code="OK",grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"}`)
		if strings.Contains(etcd, "curia_consensus_") {
			t.Errorf("/metrics/etcd of %s carries curia's series", addr)
		}
	}
	// The curators: one leads; each counts every node (UP and healthy).
	proctest.Eventually(t, time.Minute, func() error {
		leaders := 0.0
		for _, addr := range curators {
			body, err := get(addr, "/metrics")
			if err != nil {
				return err
			}
			leaders += seriesValue(body, "curia_curator_leader")
			if v := seriesValue(body, `curia_curator_nodes{health="healthy",state="up"}`); v != float64(c.nodes) {
				return fmt.Errorf("%s counts %v healthy nodes up, want %d", addr, v, c.nodes)
			}
			for _, cert := range []string{"curator", "ca"} {
				if v := seriesValue(body, `curia_curator_certificate_expiry_seconds{certificate="`+cert+`"}`); !(v >= 3600) {
					return fmt.Errorf("the %s certificate of %s expires in %vs", cert, addr, v)
				}
			}
		}
		if leaders != 1 {
			return fmt.Errorf("%v curator leaders", leaders)
		}
		return nil
	})
	// The reconcilers: one active, and its passes counted.
	proctest.Eventually(t, time.Minute, func() error {
		active, passes := 0.0, 0.0
		for _, addr := range reconcilers {
			body, err := get(addr, "/metrics")
			if err != nil {
				return err
			}
			active += seriesValue(body, "curia_reconciler_active")
			passes += seriesValue(body, `curia_reconciler_pass_results_total{result="converged"}`)
		}
		if active != 1 || !(passes >= 1) {
			return fmt.Errorf("%v active reconcilers, %v converged passes", active, passes)
		}
		return nil
	})
}

// get is the body of http://addr<path>.
func get(addr, path string) (string, error) {
	code, body, err := proctest.Get("http://" + addr + path)
	if err == nil && code != 200 {
		err = fmt.Errorf("%s of %s: %d", path, addr, code)
	}
	return body, err
}

// seriesValue is the value of one series in a /metrics body (NaN when
// absent: no comparison holds).
func seriesValue(body, series string) float64 {
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return f
			}
		}
	}
	return math.NaN()
}
