package dashboard_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"curia.dev/platform/proctest"
	cut "curia.dev/services/curator/curatortest"
)

// BenchmarkDashboardPages50 loads each page of a 50-node cluster (the bootstrap
// node and 49 seeded ones) as a browser's first request does: the time to
// the whole page. ms/slowest-page is the slowest page's mean, against the
// target of 200 ms.
func BenchmarkDashboardPages50(b *testing.B) {
	c := cut.New(b, 1)
	cut.SeedNodes(b, c.Etcd(c.Voters[0].ClientURL), 49)
	d := startDashboard(b, c, []string{c.Curators[0].Addr}, nil)
	// The view has every node before timing.
	proctest.Eventually(b, time.Minute, func() error {
		body, err := get(d.URL() + "/nodes")
		if err != nil {
			return err
		}
		if n := strings.Count(body, `<tr id="node-`); n != 50 {
			return fmt.Errorf("%d nodes on the page, want 50", n)
		}
		return nil
	})
	pages := []string{"/", "/nodes", "/membership", "/audit", "/nodes?filter=node.state%20%3D%3D%20NODE_STATE_UP"}
	took := make([]time.Duration, len(pages))
	b.ResetTimer()
	for b.Loop() {
		for i, p := range pages {
			begun := time.Now()
			if _, err := get(d.URL() + p); err != nil {
				b.Fatal(err)
			}
			took[i] += time.Since(begun)
		}
	}
	var slowest time.Duration
	for _, t := range took {
		slowest = max(slowest, t)
	}
	b.ReportMetric(float64(slowest.Milliseconds())/float64(b.N), "ms/slowest-page")
}

func get(url string) (string, error) {
	resp, err := http.Get(url) //nolint:gosec // G107: the test's own dashboard, on loopback
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %d", url, resp.StatusCode)
	}
	return string(body), err
}
