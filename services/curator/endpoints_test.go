package curator_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/proctest"
	cut "curia.dev/services/curator/curatortest"
)

// TestFrozenEtcdMember: a voter that freezes (SIGSTOP: its connections stay
// open, nothing answers) stops costing the curator within a few seconds:
// admin calls that read etcd answer, one after another, each within a
// second — long before gRPC's keepalive (12 s) would have closed the
// connection to the frozen member that a third of them went to. Thawed,
// the member is an endpoint again.
func TestFrozenEtcdMember(t *testing.T) {
	c := cut.NewWithOptions(t, cut.Options{Voters: 3, Curators: 1})
	m := c.Management()
	frozen := c.Voters[2]
	frozen.Pause()
	thawed := false
	defer func() {
		if !thawed {
			frozen.Resume()
		}
	}()
	answered := func() error {
		for i := range 9 { // three rounds of the three endpoints
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := m.GetClusterInfo(ctx, &curatorv1.GetClusterInfoRequest{})
			cancel()
			if err != nil {
				return fmt.Errorf("call %d of 9: %w", i+1, err)
			}
		}
		return nil
	}
	begun := time.Now()
	proctest.Eventually(t, 8*time.Second, answered)
	t.Logf("calls answered again %v after the freeze", time.Since(begun).Round(time.Millisecond))

	endpoints(t, c, 2)

	frozen.Resume()
	thawed = true
	endpoints(t, c, 3)
}

// endpoints waits until the curator sends requests to want etcd voters.
func endpoints(t *testing.T, c *cut.Cluster, want int) {
	t.Helper()
	proctest.Eventually(t, 30*time.Second, func() error {
		_, body, err := proctest.Get("http://" + c.Curators[0].Metrics + "/metrics")
		if err != nil {
			return err
		}
		for line := range strings.Lines(body) {
			if v, ok := strings.CutPrefix(line, "curia_curator_etcd_endpoints "); ok {
				if got := strings.TrimSpace(v); got != strconv.Itoa(want) {
					return fmt.Errorf("%s etcd endpoints, want %d", got, want)
				}
				return nil
			}
		}
		return fmt.Errorf("no curia_curator_etcd_endpoints in /metrics")
	})
}
