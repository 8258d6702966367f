package curator_test

import (
	"net/http"
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

	proctest.MetricsHave(t, cur.Metrics, "curia_curator_leader", "curia_curator_leader_term", "curia_curator_watch_revision", "curia_build_info", "grpc_server_handled_total")
}
