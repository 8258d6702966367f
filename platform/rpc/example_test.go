package rpc_test

import (
	"context"
	"log/slog"
	"net"

	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/run"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
)

// How a service wires its server: policy next to the service, the server
// and its readiness as parts of one run.Group.
func ExampleNewServer() {
	var (
		ctx    = context.Background()
		logger = slog.Default()
		files  = rpc.TLSFiles{CA: "ca.pem", Cert: "consensus.pem", Key: "consensus-key.pem"}
	)
	creds, err := rpc.LoadCredentials("prod.example", files)
	if err != nil {
		logger.Error("load credentials", "err", err)
		return
	}
	srv, err := rpc.NewServer(rpc.ServerConfig{
		Credentials: creds,
		Policy: rpc.Policy{
			"/curia.consensus.v1.Consensus/Status": {Allow: []pki.Kind{pki.KindAdmin, pki.KindReconciler}},
		},
		Logger: logger.With("component", "grpc"),
	})
	if err != nil {
		logger.Error("build gRPC server", "err", err)
		return
	}
	// consensusv1.RegisterConsensusServer(srv.GRPC(), impl)
	lis, err := net.Listen("tcp", ":7001")
	if err != nil {
		logger.Error("listen", "err", err)
		return
	}

	var g run.Group
	g.Add("grpc", func(ctx context.Context) error {
		g.Ready("grpc")
		return srv.Serve(ctx, lis)
	})
	g.Add("health", func(ctx context.Context) error {
		g.Ready("health")
		if err := g.WaitReady(ctx); err != nil {
			return nil // stopped before ready
		}
		srv.Health().SetServingStatus("", healthgrpc.HealthCheckResponse_SERVING)
		<-ctx.Done()
		return nil
	})
	if err := g.Run(ctx); err != nil {
		logger.Error("consensus stopped", "err", err)
	}
}
