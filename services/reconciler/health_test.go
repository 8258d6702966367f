package reconciler_test

import (
	"net/http"
	"testing"
	"time"

	"curia.dev/platform/proctest"
	cut "curia.dev/services/curator/curatortest"
)

// TestHealthAndMetrics: a replica whose curator does not answer is
// NOT_SERVING; once its lease campaign runs (active or standby) it is
// SERVING; /metrics carries the reconciler's metrics.
func TestHealthAndMetrics(t *testing.T) {
	c := cut.New(t, 1)
	cur := c.Curators[0]
	cur.Pause()
	r := startReconciler(t, c, "reconciler-a")
	proctest.WaitHealthz(t, r.metrics, http.StatusServiceUnavailable, 30*time.Second)
	cur.Resume()
	proctest.WaitHealthz(t, r.metrics, http.StatusOK, 30*time.Second)

	standby := startReconciler(t, c, "reconciler-b")
	proctest.WaitHealthz(t, standby.metrics, http.StatusOK, 30*time.Second)

	proctest.MetricsHave(t, r.metrics, "curia_reconciler_refusals_total", "curia_reconciler_active", "curia_reconciler_convergence_seconds", "curia_build_info", "grpc_server_handled_total")
}
