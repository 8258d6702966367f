package local

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"
)

// metricsPort is where each binary serves /metrics and /healthz
// (--listen-metrics) on its host's address.
var metricsPort = map[string]string{"consensus": "9100", "curator": "9200", "reconciler": "9300", "roleserve": "9400"}

// metricsAddr is the --listen-metrics address of a process of bin on host.
func metricsAddr(host, bin string) string { return net.JoinHostPort(host, metricsPort[bin]) }

// healthTimeout bounds each waitHealthy.
const healthTimeout = 3 * time.Minute

// waitHealthy waits until every process of the given binaries answers
// /healthz with 200, that is, reports SERVING: each service says so only
// once it can do its job (consensus: idle, or its member serving; curator:
// etcd reached and the leader known; reconciler: its lease campaign runs;
// roleserve: its API serves with the node certificate).
func (c *Cluster) waitHealthy(ctx context.Context, bins ...string) error {
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	for _, p := range c.processes() {
		if !slices.Contains(bins, p.bin) {
			continue
		}
		url := "http://" + metricsAddr(p.host, p.bin) + "/healthz"
		var last string
		for {
			if last = healthz(client, url); last == "" {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s is not healthy (%s: %s); see %s: %w", p.name, url, last, c.path("logs", p.name+".log"), ctx.Err())
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return nil
}

// healthz asks url (a process's /healthz) once: "" when it answers 200
// (SERVING), else what it answered or why it did not.
func healthz(client *http.Client, url string) string {
	resp, err := client.Get(url)
	if err != nil {
		return err.Error()
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return ""
	}
	return fmt.Sprintf("%s %s", resp.Status, strings.TrimSpace(string(b)))
}
