package rpc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"curia.dev/platform/leaktest"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// testContext bounds each call so that a broken test fails instead of hanging.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestServerAuthorization(t *testing.T) {
	env := startServer(t, nil)
	tests := map[string]struct {
		conn     func(t *testing.T) *grpc.ClientConn
		method   string
		value    string
		wantCode codes.Code
		wantMsg  string // part of the status message, or of the reply if OK
	}{
		"allowed kind": {
			conn:   func(t *testing.T) *grpc.ClientConn { return env.dial(t, admin) },
			method: echoMethod("Echo"), value: "hello",
			wantCode: codes.OK, wantMsg: "admin/alice:hello",
		},
		"node acting on itself": {
			conn:   func(t *testing.T) *grpc.ClientConn { return env.dial(t, node1) },
			method: echoMethod("Echo"), value: node1.Name,
			wantCode: codes.OK, wantMsg: node1.String() + ":" + node1.Name,
		},
		"node acting on another node": {
			conn:   func(t *testing.T) *grpc.ClientConn { return env.dial(t, node1) },
			method: echoMethod("Echo"), value: node2.Name,
			wantCode: codes.PermissionDenied, wantMsg: "a node may only act on itself",
		},
		"kind not allowed": {
			conn:   func(t *testing.T) *grpc.ClientConn { return env.dial(t, reconciler) },
			method: echoMethod("Echo"), value: "hello",
			wantCode: codes.PermissionDenied, wantMsg: "principal reconciler may not call /curia.test.v1.Echo/Echo",
		},
		"method not in policy": {
			conn:   func(t *testing.T) *grpc.ClientConn { return env.dial(t, admin) },
			method: echoMethod("Unlisted"), value: "hello",
			wantCode: codes.PermissionDenied, wantMsg: "method /curia.test.v1.Echo/Unlisted is not in the authorization policy",
		},
		"certificate without spiffe URI": {
			conn: func(t *testing.T) *grpc.ClientConn {
				return env.dialTLS(t, env.rawClientTLS(env.ca.keyPair(t)))
			},
			method: echoMethod("Echo"), value: "hello",
			wantCode: codes.Unauthenticated, wantMsg: "no spiffe:// URI SAN",
		},
		"certificate of another cluster": {
			conn: func(t *testing.T) *grpc.ClientConn {
				return env.dialTLS(t, env.rawClientTLS(env.ca.keyPair(t, "spiffe://other.cluster/admin/mallory")))
			},
			method: echoMethod("Echo"), value: "hello",
			wantCode: codes.Unauthenticated, wantMsg: `belongs to cluster "other.cluster"`,
		},
		"invalid request": {
			conn:   func(t *testing.T) *grpc.ClientConn { return env.dial(t, admin) },
			method: echoMethod("Echo"), value: "",
			wantCode: codes.InvalidArgument, wantMsg: "value is required",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := callEcho(testContext(t), tc.conn(t), tc.method, tc.value)
			wantCode(t, err, tc.wantCode, tc.wantMsg)
			if tc.wantCode == codes.OK && got != tc.wantMsg {
				t.Fatalf("reply %q, want %q", got, tc.wantMsg)
			}
		})
	}
}

func TestServerRefusesHandshake(t *testing.T) {
	var revoked sync.Map // serial number (string) → struct{}
	env := startServer(t, func(cfg *ServerConfig) {
		cfg.IsRevoked = func(c *x509.Certificate) bool {
			_, ok := revoked.Load(c.SerialNumber.String())
			return ok
		}
	})
	otherCA := newTestCA(t)
	adminURI := admin.URI(testCluster).String()
	certPEM, keyPEM, serial := env.ca.issue(t, adminURI)
	revoked.Store(serial.String(), struct{}{})
	revokedCert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	tls12 := env.rawClientTLS(env.ca.keyPair(t, adminURI))
	tls12.MinVersion, tls12.MaxVersion = tls.VersionTLS12, tls.VersionTLS12

	tests := map[string]struct {
		cfg      *tls.Config
		wantCode codes.Code
	}{
		"control: same kind of certificate, not revoked": {env.rawClientTLS(env.ca.keyPair(t, adminURI)), codes.OK},
		"no client certificate":                          {env.rawClientTLS(), codes.Unavailable},
		"certificate of another CA":                      {env.rawClientTLS(otherCA.keyPair(t, adminURI)), codes.Unavailable},
		"revoked certificate":                            {env.rawClientTLS(revokedCert), codes.Unavailable},
		"TLS 1.2 (below the minimum)":                    {tls12, codes.Unavailable},
		"self-signed ed25519 (AllowEnrolling is false)":  {env.rawClientTLS(signed(t, newNodeKey(t), nil, time.Now().Add(time.Hour))), codes.Unavailable},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := callEcho(testContext(t), env.dialTLS(t, tc.cfg), echoMethod("Echo"), "hello")
			wantCode(t, err, tc.wantCode, "")
			t.Logf("result: %v", err)
		})
	}
	// Only the control reached the interceptors.
	if n := strings.Count(env.logs.String(), "finished call"); n != 1 {
		t.Fatalf("%d calls logged, want 1 (the control):\n%s", n, env.logs)
	}
}

func TestServerRecoversFromPanic(t *testing.T) {
	env := startServer(t, nil)
	conn := env.dial(t, admin)
	ctx := testContext(t)

	_, err := callEcho(ctx, conn, echoMethod("Echo"), "panic")
	wantCode(t, err, codes.Internal, "")
	if got, err := callEcho(ctx, conn, echoMethod("Echo"), "still there"); err != nil || got != "admin/alice:still there" {
		t.Fatalf("call after panic = %q, %v", got, err)
	}

	logs := env.logs.String()
	if !strings.Contains(logs, `"msg":"handler panicked"`) || !strings.Contains(logs, "test panic") || !strings.Contains(logs, "rpc.echo") {
		t.Fatalf("panic not logged with its stack:\n%s", logs)
	}
	if got := counterValue(t, env.srv.Registry(), "grpc_req_panics_recovered_total", nil); got != 1 {
		t.Fatalf("panics counter = %v, want 1", got)
	}
}

func TestServerStream(t *testing.T) {
	env := startServer(t, nil)
	tests := map[string]struct {
		as       pki.Principal
		value    string
		wantCode codes.Code
		wantMsg  string
	}{
		"allowed":              {as: node1, value: node1.Name, wantCode: codes.OK, wantMsg: node1.String() + ":" + node1.Name},
		"check on the request": {as: node1, value: node2.Name, wantCode: codes.PermissionDenied, wantMsg: "a node may only act on itself"},
		"kind not allowed":     {as: reconciler, value: "x", wantCode: codes.PermissionDenied, wantMsg: "principal reconciler may not call"},
		"invalid request":      {as: admin, value: "", wantCode: codes.InvalidArgument, wantMsg: "value is required"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(testContext(t))
			defer cancel()
			got, err := openWatch(ctx, env.dial(t, tc.as), tc.value)
			wantCode(t, err, tc.wantCode, tc.wantMsg)
			if tc.wantCode == codes.OK && got != tc.wantMsg {
				t.Fatalf("reply %q, want %q", got, tc.wantMsg)
			}
		})
	}
}

// openWatch opens a Watch stream and returns its first reply.
func openWatch(ctx context.Context, conn *grpc.ClientConn, value string) (string, error) {
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, echoMethod("Watch"))
	if err != nil {
		return "", err
	}
	if err := cs.SendMsg(wrapperspb.String(value)); err != nil {
		return "", err
	}
	if err := cs.CloseSend(); err != nil {
		return "", err
	}
	var out wrapperspb.StringValue
	if err := cs.RecvMsg(&out); err != nil {
		return "", err
	}
	return out.GetValue(), nil
}

func TestServeEndsStreamsWhenStopping(t *testing.T) {
	// A grace period far longer than the test: a stop that waited for the
	// watch would time out (and say so) only after it.
	env := startServer(t, func(cfg *ServerConfig) { cfg.GracePeriod = time.Minute })
	conn := env.dial(t, admin)
	ctx := testContext(t)
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, echoMethod("Watch"))
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(wrapperspb.String("hold")); err != nil {
		t.Fatal(err)
	}
	var out wrapperspb.StringValue
	if err := cs.RecvMsg(&out); err != nil {
		t.Fatalf("first reply: %v", err)
	}

	// The watch never ends by itself (its handler returns nil once its
	// context ends): the stop ends it, and the client learns why.
	if err := env.stop(); err != nil {
		t.Fatalf("Serve = %v, want nil", err)
	}
	err = cs.RecvMsg(&out)
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "the server is stopping") {
		t.Fatalf("stream after stop: %v, want Unavailable: the server is stopping", err)
	}
	if strings.Contains(env.logs.String(), "graceful stop timed out") {
		t.Fatalf("the stop waited out its grace period for the watch:\n%s", env.logs)
	}
}

func TestServeCutsCallsAfterGracePeriod(t *testing.T) {
	env := startServer(t, func(cfg *ServerConfig) { cfg.GracePeriod = 50 * time.Millisecond })
	conn := env.dial(t, admin)
	ctx := testContext(t)
	called := make(chan error, 1)
	go func() {
		called <- conn.Invoke(ctx, echoMethod("Stuck"), wrapperspb.String("hold"), &wrapperspb.StringValue{})
	}()
	proctest.Eventually(t, 10*time.Second, func() error {
		select {
		case err := <-called:
			t.Fatalf("the call ended before the stop: %v", err)
		default:
		}
		if env.flaky.count("Stuck") == 0 {
			return errors.New("the call is not in its handler yet")
		}
		return nil
	})

	// The call never ends by itself: Serve gives up waiting for it.
	if err := env.stop(); err != nil {
		t.Fatalf("Serve = %v, want nil", err)
	}
	if err := <-called; err == nil {
		t.Fatal("the stuck call succeeded")
	}
	if !strings.Contains(env.logs.String(), "graceful stop timed out") {
		t.Fatalf("forced stop not logged:\n%s", env.logs)
	}
}

func TestHealthAndReflection(t *testing.T) {
	env := startServer(t, nil)
	// A reconciler may call nothing in the policy, yet health and
	// reflection are open to it.
	conn := env.dial(t, reconciler)
	ctx := testContext(t)

	hc := healthgrpc.NewHealthClient(conn)
	check := func() healthgrpc.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := hc.Check(ctx, &healthgrpc.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("health check: %v", err)
		}
		return resp.GetStatus()
	}
	if got := check(); got != healthgrpc.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("initial health = %v, want NOT_SERVING", got)
	}
	env.srv.Health().SetServingStatus("", healthgrpc.HealthCheckResponse_SERVING)
	if got := check(); got != healthgrpc.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, want SERVING", got)
	}

	// v1
	stream, err := reflectionv1.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionv1.ServerReflectionRequest{
		MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("reflection v1: %v", err)
	}
	var services []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	for _, want := range []string{echoService, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !strings.Contains(strings.Join(services, " "), want) {
			t.Fatalf("reflection lists %v, want %s", services, want)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}

	// v1alpha, which older grpcurl versions use
	alpha, err := reflectionv1alpha.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := alpha.Send(&reflectionv1alpha.ServerReflectionRequest{ //nolint:staticcheck // SA1019: v1alpha on purpose, older grpcurl versions use it
		MessageRequest: &reflectionv1alpha.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := alpha.Recv(); err != nil {
		t.Fatalf("reflection v1alpha: %v", err)
	}
	if err := alpha.CloseSend(); err != nil {
		t.Fatal(err)
	}

	// Only authenticated principals, though.
	anon := env.dialTLS(t, env.rawClientTLS(env.ca.keyPair(t)))
	_, err = healthgrpc.NewHealthClient(anon).Check(ctx, &healthgrpc.HealthCheckRequest{})
	wantCode(t, err, codes.Unauthenticated, "")
}

func TestServerMetricsAndLogs(t *testing.T) {
	env := startServer(t, nil)
	ctx := testContext(t)
	if _, err := callEcho(ctx, env.dial(t, admin), echoMethod("Echo"), "hello"); err != nil {
		t.Fatal(err)
	}
	_, err := callEcho(ctx, env.dial(t, reconciler), echoMethod("Echo"), "hello")
	wantCode(t, err, codes.PermissionDenied, "")

	reg := env.srv.Registry()
	for code, want := range map[string]float64{"OK": 1, "PermissionDenied": 1, "Internal": 0} {
		labels := map[string]string{"grpc_service": echoService, "grpc_method": "Echo", "grpc_code": code}
		if got := counterValue(t, reg, "grpc_server_handled_total", labels); got != want {
			t.Errorf("grpc_server_handled_total{%v} = %v, want %v", code, got, want)
		}
	}
	// Never the default registry: etcd registers grpc_server_* there.
	if mfs, _ := prometheus.DefaultGatherer.Gather(); hasMetric(mfs, "grpc_server_handled_total") {
		t.Error("gRPC metrics leaked into the default registry")
	}
	rec := httptest.NewRecorder()
	env.srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if body := rec.Body.String(); !strings.Contains(body, "grpc_server_handled_total") || !strings.Contains(body, "go_goroutines") {
		t.Errorf("metrics handler output lacks gRPC or Go metrics")
	}

	// One JSON line per finished call: OK at DEBUG, denied at INFO, both
	// with method, principal, code and duration.
	want := map[string]string{"OK": "DEBUG", "PermissionDenied": "INFO"}
	for line := range strings.Lines(env.logs.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] != "finished call" || rec["grpc.method"] != "Echo" {
			continue
		}
		code, _ := rec["grpc.code"].(string)
		if level, ok := want[code]; ok && rec["level"] == level && rec["principal"] != nil && rec["duration"] != nil {
			delete(want, code)
		}
	}
	if len(want) > 0 {
		t.Fatalf("no proper log line for %v in:\n%s", want, env.logs)
	}
}

func TestNewServerRejectsBadConfig(t *testing.T) {
	ca := newTestCA(t)
	creds := ca.creds(t, curator)
	reg := prometheus.NewRegistry()
	if _, err := NewServer(ServerConfig{Credentials: creds, Registry: reg}); err != nil {
		t.Fatalf("first server on registry: %v", err)
	}
	tests := map[string]ServerConfig{
		"no credentials":     {Policy: Policy{}},
		"bad method name":    {Credentials: creds, Policy: Policy{"Echo": {Allow: []pki.Kind{pki.KindAdmin}}}},
		"rule allows nobody": {Credentials: creds, Policy: Policy{echoMethod("Echo"): {}}},
		"registry in use":    {Credentials: creds, Registry: reg},
		"enrolling forwards": {Credentials: creds, TrustForwardedFrom: []pki.Kind{pki.KindCurator, pki.KindEnrolling}},
	}
	for name, cfg := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := NewServer(cfg); err == nil {
				t.Fatal("NewServer accepted a bad config")
			}
		})
	}
}

func counterValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s%v", name, labels)
	return 0
}

func hasMetric(mfs []*dto.MetricFamily, name string) bool {
	for _, mf := range mfs {
		if mf.GetName() == name {
			return true
		}
	}
	return false
}
