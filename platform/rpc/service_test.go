package rpc

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpcerr"
	"curia.dev/platform/rpcerr/rpcerrtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

var wantCode = rpcerrtest.WantCode

// A hand-written test service, "curia.test.v1.Echo", registered through a
// grpc.ServiceDesc so that no generated code is needed. Requests decode into
// echoRequest, a dynamic message curia.test.v1.EchoRequest, wire-compatible
// with StringValue, whose one field carries a protovalidate rule as a
// generated message's would:
//
//	string value = 1 [(buf.validate.field).cel = {id: "echo.value", message: "value is required", expression: "this != ''"}];

const echoService = "curia.test.v1.Echo"

func echoMethod(name string) string { return "/" + echoService + "/" + name }

var echoRequestDesc = func() protoreflect.MessageDescriptor {
	opts := &descriptorpb.FieldOptions{}
	proto.SetExtension(opts, validate.E_Field, validate.FieldRules_builder{
		Cel: []*validate.Rule{validate.Rule_builder{
			Id:         proto.String("echo.value"),
			Message:    proto.String("value is required"),
			Expression: proto.String("this != ''"),
		}.Build()},
	}.Build())
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name:    proto.String("curia/test/v1/echo.proto"),
		Package: proto.String("curia.test.v1"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("EchoRequest"),
			Field: []*descriptorpb.FieldDescriptorProto{{
				Name:     proto.String("value"),
				JsonName: proto.String("value"),
				Number:   proto.Int32(1),
				Label:    descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
				Type:     descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(),
				Options:  opts,
			}},
		}},
		// The methods as a generated service's file declares them (the
		// ServiceDesc below serves them): Flaky is a read, safe to repeat.
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: proto.String("Echo"),
			Method: []*descriptorpb.MethodDescriptorProto{
				{Name: proto.String("Echo"), InputType: proto.String(".curia.test.v1.EchoRequest"), OutputType: proto.String(".curia.test.v1.EchoRequest")},
				{
					Name: proto.String("Flaky"), InputType: proto.String(".curia.test.v1.EchoRequest"), OutputType: proto.String(".curia.test.v1.EchoRequest"),
					Options: &descriptorpb.MethodOptions{IdempotencyLevel: descriptorpb.MethodOptions_NO_SIDE_EFFECTS.Enum()},
				},
				{Name: proto.String("FlakyUnsafe"), InputType: proto.String(".curia.test.v1.EchoRequest"), OutputType: proto.String(".curia.test.v1.EchoRequest")},
			},
		}},
	}, protoregistry.GlobalFiles)
	if err != nil {
		panic(err)
	}
	// Registered, as generated code registers its files: the validator
	// compiles the rules of registered curia messages.
	if err := protoregistry.GlobalFiles.RegisterFile(fd); err != nil {
		panic(err)
	}
	return fd.Messages().Get(0)
}()

type echoRequest struct{ *dynamicpb.Message }

func newEchoRequest() *echoRequest { return &echoRequest{dynamicpb.NewMessage(echoRequestDesc)} }

func (r *echoRequest) GetValue() string {
	return r.Get(echoRequestDesc.Fields().Get(0)).String()
}

// echo answers "<principal>:<value>", followed by " via <forwarder>" for a
// forwarded call, and panics on "panic".
func echo(ctx context.Context, req *echoRequest) (*wrapperspb.StringValue, error) {
	if req.GetValue() == "panic" {
		panic("test panic")
	}
	who, ok := PrincipalFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no principal in context")
	}
	reply := who.String() + ":" + req.GetValue()
	if fwd, ok := ForwarderFromContext(ctx); ok {
		reply += " via " + fwd.String()
	}
	return wrapperspb.String(reply), nil
}

// flaky fails the first two calls to each method with UNAVAILABLE; a
// request for "own-state" fails every call with errOwnState.
type flaky struct {
	mu    sync.Mutex
	calls map[string]int
}

func (f *flaky) handle(method string) func(context.Context, *echoRequest) (*wrapperspb.StringValue, error) {
	return func(ctx context.Context, req *echoRequest) (*wrapperspb.StringValue, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.calls[method]++
		if req.GetValue() == "own-state" {
			return nil, fmt.Errorf("%w: flaky", errOwnState)
		}
		if f.calls[method] <= 2 {
			return nil, status.Error(codes.Unavailable, "try again")
		}
		return wrapperspb.String(req.GetValue()), nil
	}
}

// stuck is a call that ends only when the server cuts it off.
func (f *flaky) stuck(ctx context.Context, _ *echoRequest) (*wrapperspb.StringValue, error) {
	f.mu.Lock()
	f.calls["Stuck"]++
	f.mu.Unlock()
	<-ctx.Done()
	return nil, ctx.Err()
}

// errOwnState is an UNAVAILABLE of the server's own state.
var errOwnState = rpcerr.Unavailable.SubOwnState("this replica cannot answer")

func (f *flaky) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func unaryMethod(name string, h func(context.Context, *echoRequest) (*wrapperspb.StringValue, error)) grpc.MethodDesc {
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			req := newEchoRequest()
			if err := dec(req); err != nil {
				return nil, err
			}
			call := func(ctx context.Context, req any) (any, error) { return h(ctx, req.(*echoRequest)) }
			if ic == nil {
				return call(ctx, req)
			}
			return ic(ctx, req, &grpc.UnaryServerInfo{FullMethod: echoMethod(name)}, call)
		},
	}
}

// watch answers once, like echo, then holds the stream open until it ends.
func watch(_ any, stream grpc.ServerStream) error {
	req := newEchoRequest()
	if err := stream.RecvMsg(req); err != nil {
		return err
	}
	resp, err := echo(stream.Context(), req)
	if err != nil {
		return err
	}
	if err := stream.SendMsg(resp); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func echoServiceDesc(f *flaky) *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: echoService,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			unaryMethod("Echo", echo),
			unaryMethod("Register", echo),
			unaryMethod("Unlisted", echo),
			unaryMethod("Flaky", f.handle("Flaky")),
			unaryMethod("FlakyUnsafe", f.handle("FlakyUnsafe")),
			unaryMethod("Stuck", f.stuck),
		},
		Streams: []grpc.StreamDesc{
			{StreamName: "Watch", Handler: watch, ServerStreams: true},
			{StreamName: "Shared", Handler: shared, ServerStreams: true},
		},
	}
}

// nodeActsOnItself is a per-request check: a node may only name itself.
func nodeActsOnItself(_ context.Context, p pki.Principal, req any) error {
	if p.Kind == pki.KindNode && req.(*echoRequest).GetValue() != p.Name {
		return errors.New("a node may only act on itself")
	}
	return nil
}

func testPolicy() Policy {
	echoRule := Rule{Allow: []pki.Kind{pki.KindAdmin, pki.KindNode}, Check: nodeActsOnItself}
	adminOnly := Rule{Allow: []pki.Kind{pki.KindAdmin}}
	return Policy{
		echoMethod("Register"):    {Allow: []pki.Kind{pki.KindEnrolling}},
		echoMethod("Echo"):        echoRule,
		echoMethod("Watch"):       echoRule,
		echoMethod("Flaky"):       adminOnly,
		echoMethod("FlakyUnsafe"): adminOnly,
		echoMethod("Stuck"):       adminOnly,
		echoMethod("Shared"):      adminOnly,
	}
}

// syncBuffer is a log sink that tests may read while the server writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type testEnv struct {
	ca     *testCA
	srv    *Server
	addr   string
	logs   *syncBuffer
	flaky  *flaky
	cancel context.CancelFunc
	served chan error
}

// startServer serves the echo service as a curator on 127.0.0.1 until the
// test ends. configure may adjust the config before NewServer.
func startServer(t *testing.T, configure func(*ServerConfig)) *testEnv {
	t.Helper()
	env := &testEnv{ca: newTestCA(t), logs: &syncBuffer{}, flaky: &flaky{calls: map[string]int{}}}
	cfg := ServerConfig{
		Credentials: env.ca.creds(t, curator),
		Policy:      testPolicy(),
		Logger:      slog.New(slog.NewJSONHandler(env.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if configure != nil {
		configure(&cfg)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	srv.GRPC().RegisterService(echoServiceDesc(env.flaky), nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	env.srv, env.addr = srv, lis.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	env.cancel, env.served = cancel, make(chan error, 1)
	go func() { env.served <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		if err := env.stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return env
}

// stop cancels Serve and waits for it; later calls return nil.
func (e *testEnv) stop() error {
	e.cancel()
	err, ok := <-e.served
	if ok {
		close(e.served)
	}
	return err
}

// dial connects as p, expecting a curator server.
func (e *testEnv) dial(t *testing.T, p pki.Principal) *grpc.ClientConn {
	t.Helper()
	return e.dialConfig(t, ClientConfig{Credentials: e.ca.creds(t, p), ServerKinds: []pki.Kind{pki.KindCurator}})
}

func (e *testEnv) dialConfig(t *testing.T, cfg ClientConfig) *grpc.ClientConn {
	t.Helper()
	conn, err := Dial(e.addr, cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// dialTLS connects with a hand-made TLS config, for clients that Dial would
// not build (no certificate, foreign CA, no identity).
func (e *testEnv) dialTLS(t *testing.T, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// rawClientTLS trusts the test CA and presents the first of certs, if any,
// whatever the server asks for: from Certificates, Go's client would present
// none of an issuer the server does not name.
func (e *testEnv) rawClientTLS(certs ...tls.Certificate) *tls.Config {
	creds := &Credentials{Cluster: testCluster, CAPool: poolOf(e.ca)}
	cfg := ClientTLSConfig(creds, nil)
	cfg.Certificates = nil
	if len(certs) > 0 {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &certs[0], nil }
	}
	return cfg
}

// dialEnrolling connects as an enrolling node with key, expecting a curator
// server.
func (e *testEnv) dialEnrolling(t *testing.T, key ed25519.PrivateKey) *grpc.ClientConn {
	t.Helper()
	conn, err := DialEnrolling(e.addr, e.ca.pem, key, []pki.Kind{pki.KindCurator})
	if err != nil {
		t.Fatalf("DialEnrolling: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func poolOf(ca *testCA) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

func callEcho(ctx context.Context, conn *grpc.ClientConn, method, value string) (string, error) {
	var out wrapperspb.StringValue
	if err := conn.Invoke(ctx, method, wrapperspb.String(value), &out); err != nil {
		return "", err
	}
	return out.GetValue(), nil
}
