package curator_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	cut "curia.dev/services/curator/curatortest"
)

// TestHealthAndMetrics: a replica that cannot reach etcd is NOT_SERVING;
// once etcd answers (session, leader known, nodes loaded) it is SERVING;
// /metrics carries the curator's metrics.
func TestHealthAndMetrics(t *testing.T) {
	c := cut.New(t, 1)
	proctest.WaitHealthz(t, c.Curators[0].Metrics, http.StatusOK, 30*time.Second)

	v := c.Voters[0]
	v.Pause()
	cur := c.AddCurator()
	proctest.WaitHealthz(t, cur.Metrics, http.StatusServiceUnavailable, 30*time.Second)
	v.Resume()
	proctest.WaitHealthz(t, cur.Metrics, http.StatusOK, 30*time.Second)
	resp, err := healthpb.NewHealthClient(c.Conn(cur, pki.Principal{Kind: pki.KindAdmin, Name: "test"})).Check(t.Context(), &healthpb.HealthCheckRequest{Service: "curia.curator.v1.Management"})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health of Management: %v (%v)", resp.GetStatus(), err)
	}

	body := proctest.MetricsHave(t, cur.Metrics, "curia_curator_leader", "curia_curator_leader_term", "curia_curator_watch_revision", "curia_build_info", "grpc_server_handled_total",
		`curia_curator_nodes{health="healthy",state="up"}`, `curia_curator_certificate_expiry_seconds{certificate="curator"}`, `curia_curator_certificate_expiry_seconds{certificate="ca"}`)
	for _, cert := range []string{"curator", "ca"} {
		// The test PKI issues for a day or more.
		if v := metricValue(t, body, `curia_curator_certificate_expiry_seconds{certificate="`+cert+`"}`); v < 3600 {
			t.Errorf("the %s certificate expires in %vs", cert, v)
		}
	}

	// A node enrolled counts, under its state, on every replica.
	before := nodeCounts(body)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	n := c.NewAgent().Enrol(ctx)
	state := strings.ToLower(strings.TrimPrefix(n.GetState().String(), "NODE_STATE_"))
	for _, r := range []*cut.Curator{c.Curators[0], cur} {
		proctest.Eventually(t, 30*time.Second, func() error {
			_, body, err := proctest.Get("http://" + r.Metrics + "/metrics")
			if err != nil {
				return err
			}
			after := nodeCounts(body)
			if after[""] != before[""]+1 || after[state] != before[state]+1 {
				return fmt.Errorf("nodes by state %v, before the enrolment %v: want one more %s", after, before, state)
			}
			return nil
		})
	}
}

// nodeCounts sums curia_curator_nodes by state ("": all nodes).
func nodeCounts(body string) map[string]float64 {
	counts := map[string]float64{}
	for line := range strings.SplitSeq(body, "\n") {
		rest, ok := strings.CutPrefix(line, "curia_curator_nodes{")
		if !ok {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		v, _ := strconv.ParseFloat(value, 64)
		_, state, _ := strings.Cut(labels, `state="`)
		state, _, _ = strings.Cut(state, `"`)
		counts[state] += v
		counts[""] += v
	}
	return counts
}
