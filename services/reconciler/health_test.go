package reconciler_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
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

	proctest.MetricsHave(t, r.metrics, "curia_reconciler_refusals_total", "curia_reconciler_active", "curia_reconciler_convergence_seconds", "curia_build_info", "grpc_server_handled_total",
		`curia_reconciler_pass_results_total{result="refused"} 0`, `curia_reconciler_pass_results_total{result="error"}`)

	// The active replica's passes end converged (one voter, nothing to
	// do), the standby's as standby; exactly one is active.
	for _, w := range []struct {
		addr, result string
		active       float64
	}{{r.metrics, "converged", 1}, {standby.metrics, "standby", 0}} {
		proctest.Eventually(t, 30*time.Second, func() error {
			_, body, err := proctest.Get("http://" + w.addr + "/metrics")
			if err != nil {
				return err
			}
			if v := value(body, `curia_reconciler_pass_results_total{result="`+w.result+`"}`); v < 1 {
				return fmt.Errorf("%s: %v passes %s", w.addr, v, w.result)
			}
			if v := value(body, "curia_reconciler_active"); v != w.active {
				return fmt.Errorf("%s: curia_reconciler_active %v, want %v", w.addr, v, w.active)
			}
			return nil
		})
	}
}

// value is the value of one series in a /metrics body (-1 when absent).
func value(body, series string) float64 {
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return -1
			}
			return f
		}
	}
	return -1
}
