package rpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"

	"curia.dev/platform/run"
	"curia.dev/platform/version"
)

// Readiness is the part of a run.Group that drives gRPC health (DESIGN §8):
// it marks itself ready, waits until every other part of g is, then reports
// SERVING for the server as a whole ("") and for services; when the group
// stops it reports NOT_SERVING at once, before the parts wind down. Add it
// under the name part:
//
//	g.Add("health", rpc.Readiness(srv.Health(), &g, "health", svcName))
//
// Readiness is a start gate: what a service needs before it can do its job
// (a listener, a connection, a first snapshot). A part that loses what it
// needs later keeps serving and says so in its status and metrics.
func Readiness(h *health.Server, g *run.Group, part string, services ...string) run.Runnable {
	return func(ctx context.Context) error {
		g.Ready(part)
		if err := g.WaitReady(ctx); err != nil {
			return nil // stopped before ready: still NOT_SERVING
		}
		for _, s := range append([]string{""}, services...) {
			h.SetServingStatus(s, healthgrpc.HealthCheckResponse_SERVING)
		}
		<-ctx.Done()
		h.Shutdown() // NOT_SERVING for every service, and it stays so
		return nil
	}
}

// Healthz answers 200 "SERVING" while h reports the server as a whole
// SERVING and 503 otherwise: gRPC health over plain HTTP, for probes that
// hold no certificate (curia-probe --http).
func Healthz(h *health.Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := h.Check(r.Context(), &healthgrpc.HealthCheckRequest{})
		if err != nil || resp.GetStatus() != healthgrpc.HealthCheckResponse_SERVING {
			http.Error(w, fmt.Sprintf("NOT_SERVING %v", resp.GetStatus()), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "SERVING")
	})
}

// NewRegistry is a service's private metrics registry: Go and process
// collectors and curia_build_info. It is not the default registry, which
// embedded etcd fills.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.Collector())
	return reg
}

// MetricsPath is a further path ServeMetrics serves a gatherer on, in full
// and apart from /metrics: consensus serves embedded etcd's own registry on
// /metrics/etcd.
type MetricsPath struct {
	Path     string
	Gatherer prometheus.Gatherer
}

// ServeMetrics serves Prometheus metrics (/metrics, from gatherer; more,
// each on its own path) and health (/healthz, from h) over plain HTTP on
// lis until ctx ends. Every service runs it for --listen-metrics, meant for
// loopback.
func ServeMetrics(ctx context.Context, lis net.Listener, gatherer prometheus.Gatherer, h *health.Server, more ...MetricsPath) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	for _, m := range more {
		mux.Handle(m.Path, promhttp.HandlerFor(m.Gatherer, promhttp.HandlerOpts{}))
	}
	mux.Handle("/healthz", Healthz(h))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		// ctx is done: the requests in flight get 5s of their own.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			_ = hs.Close() // the 5s passed: cut the connections left
		}
	}()
	if err := hs.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve metrics on %s: %w", lis.Addr(), err)
	}
	<-stopped
	return nil
}

// Listen listens on a service's gRPC address and, when metrics is set, on
// its metrics address (ListenMetrics); on an error nothing stays open.
func Listen(api, metrics string) (lis, mlis net.Listener, err error) {
	lis, err = net.Listen("tcp", api)
	if err != nil {
		return nil, nil, fmt.Errorf("listen %s: %w", api, err)
	}
	if mlis, err = ListenMetrics(metrics); err != nil {
		lis.Close()
		return nil, nil, err
	}
	return lis, mlis, nil
}

// ListenMetrics listens on addr for ServeMetrics; an empty addr (the flag
// not given) is no listener and no error.
func ListenMetrics(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen metrics %s: %w", addr, err)
	}
	return lis, nil
}
