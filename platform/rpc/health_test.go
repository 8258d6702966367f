package rpc

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"

	"curia.dev/platform/run"
)

// get returns the status code and body of a plain-HTTP GET.
func get(url string) (int, string, error) {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// eventually polls f until it returns nil or the deadline passes.
func eventually(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReadinessDrivesHealth: NOT_SERVING (gRPC and /healthz) until every
// part of the group is ready, SERVING then, NOT_SERVING again once the
// group stops; /metrics serves the registry throughout.
func TestReadinessDrivesHealth(t *testing.T) {
	h := health.NewServer()
	h.SetServingStatus("", healthgrpc.HealthCheckResponse_NOT_SERVING)
	reg := NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "curia_test_things_total", Help: "Things."}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + lis.Addr().String()

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var g run.Group
	warm := make(chan struct{})
	g.Add("store", func(ctx context.Context) error {
		select {
		case <-warm:
			g.Ready("store")
		case <-ctx.Done():
		}
		<-ctx.Done()
		return nil
	})
	g.AddReady("metrics", func(ctx context.Context) error { return ServeMetrics(ctx, lis, reg, h) })
	g.Add("health", Readiness(h, &g, "health", "curia.test.v1.Test"))
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()

	status := func(svc string) healthgrpc.HealthCheckResponse_ServingStatus {
		resp, err := h.Check(t.Context(), &healthgrpc.HealthCheckRequest{Service: svc})
		if err != nil {
			return healthgrpc.HealthCheckResponse_UNKNOWN
		}
		return resp.GetStatus()
	}
	healthz := func(want int) func() error {
		return func() error {
			code, body, err := get(base + "/healthz")
			if err != nil || code != want {
				return fmt.Errorf("/healthz = %d %q (%v), want %d", code, body, err, want)
			}
			return nil
		}
	}
	// Everything but the store is ready: the server answers, NOT_SERVING.
	eventually(t, 10*time.Second, func() error {
		if r := g.Readiness(); !r["metrics"] || !r["health"] {
			return fmt.Errorf("readiness %v", r)
		}
		return healthz(http.StatusServiceUnavailable)()
	})
	if s := status(""); s != healthgrpc.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health before the store is ready: %v", s)
	}
	code, body, err := get(base + "/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics = %d (%v)", code, err)
	}
	for _, name := range []string{"curia_test_things_total", "curia_build_info", "go_goroutines"} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}

	close(warm)
	eventually(t, 10*time.Second, healthz(http.StatusOK))
	for _, svc := range []string{"", "curia.test.v1.Test"} {
		if s := status(svc); s != healthgrpc.HealthCheckResponse_SERVING {
			t.Fatalf("health(%q) after ready: %v", svc, s)
		}
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if s := status(""); s != healthgrpc.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health after stop: %v", s)
	}
}
