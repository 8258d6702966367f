package rpc

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"curia.dev/platform/pki"
	"curia.dev/platform/rpcerr"
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
)

// DefaultGracePeriod bounds how long Serve waits for calls in flight when
// stopping. Watches never finish on their own, so without a bound a
// graceful stop would wait forever.
const DefaultGracePeriod = 5 * time.Second

// ServerConfig configures NewServer.
type ServerConfig struct {
	Credentials *Credentials // required
	Policy      Policy       // who may call what; methods not listed are denied
	Logger      *slog.Logger // nil discards
	// Registry receives the server's metrics. It must not be the default
	// registry: embedded etcd registers grpc_server_* there. Nil creates a
	// private one (NewRegistry).
	Registry *prometheus.Registry
	// Health is the health server to register; nil creates one. A service
	// whose server starts late (the node agent's, after enrolment) passes
	// its own, so that /healthz answers from the start.
	Health *health.Server
	// IsRevoked, if set, is asked about every client certificate during the
	// handshake (the CRL check); a revoked certificate fails the handshake.
	IsRevoked func(*x509.Certificate) bool
	// AllowEnrolling admits, besides certificates of the CA, nodes that
	// present a self-signed certificate of their ed25519 key
	// (DialEnrolling). They are pki.KindEnrolling principals and may call
	// only the methods whose rule allows that kind.
	AllowEnrolling bool
	// TrustForwardedFrom lists the kinds (e.g. curator, for followers
	// forwarding to the leader) whose ForwardedPrincipalHeader is honoured:
	// the policy then applies to the principal it names. Anyone else sending
	// the header is refused.
	TrustForwardedFrom []pki.Kind
	// GracePeriod bounds the graceful stop in Serve; zero means
	// DefaultGracePeriod.
	GracePeriod time.Duration
	// Extra interceptors, run after validation, just before the handler.
	UnaryInterceptors  []grpc.UnaryServerInterceptor
	StreamInterceptors []grpc.StreamServerInterceptor
}

// Server is a gRPC server with curia's TLS, interceptors, health and
// reflection. Register services on GRPC() before calling Serve.
type Server struct {
	grpc        *grpc.Server
	health      *health.Server
	registry    *prometheus.Registry
	metrics     *grpcprom.ServerMetrics
	policy      Policy
	logger      *slog.Logger
	gracePeriod time.Duration
	checkOnce   sync.Once

	// stopping ends when Serve begins to stop: every stream ends then
	// (endStreamsOnStop).
	stopping    context.Context
	stopStreams context.CancelFunc
}

// NewServer builds a server. Its health status starts NOT_SERVING: the
// service sets it to SERVING once its parts are ready (Readiness).
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Credentials == nil {
		return nil, errors.New("rpc server: no credentials")
	}
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
	if slices.Contains(cfg.TrustForwardedFrom, pki.KindEnrolling) {
		return nil, errors.New("rpc server: enrolling nodes may not forward calls: anyone can be one")
	}
	// The request rules compile now, not on the first call: a rule that
	// does not compile stops the process at start.
	if _, err := validator(); err != nil {
		return nil, fmt.Errorf("rpc server: request rules: %w", err)
	}
	s := &Server{
		health:      cfg.Health,
		registry:    cfg.Registry,
		policy:      cfg.Policy,
		logger:      cfg.Logger,
		gracePeriod: cfg.GracePeriod,
	}
	s.stopping, s.stopStreams = context.WithCancel(context.Background())
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	if s.gracePeriod <= 0 {
		s.gracePeriod = DefaultGracePeriod
	}
	if s.health == nil {
		s.health = health.NewServer()
	}
	if s.registry == nil {
		s.registry = NewRegistry()
	}
	s.metrics = grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	// Panics skip the metrics interceptor (recovery sits outside it), so
	// they get a counter of their own.
	panics := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "grpc_req_panics_recovered_total",
		Help: "Total number of gRPC requests recovered from internal panic.",
	})
	for _, c := range []prometheus.Collector{s.metrics, panics} {
		if err := s.registry.Register(c); err != nil {
			return nil, fmt.Errorf("register gRPC server metrics: %w", err)
		}
	}

	onPanic := func(ctx context.Context, p any) error {
		panics.Inc()
		method, _ := grpc.Method(ctx)
		id := rpcerr.CorrelationID()
		s.logger.ErrorContext(ctx, "handler panicked", "grpc.method", method, "correlation_id", id, "panic", p, "stack", string(debug.Stack()))
		return rpcerr.Internal(id)
	}
	logger := logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		s.logger.Log(ctx, slog.Level(lvl), msg, fields...)
	})
	logOpts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithLevels(codeToLevel),
		logging.WithDurationField(func(d time.Duration) logging.Fields { return logging.Fields{"duration", d} }),
	}
	tlsConfig := ServerTLSConfig(cfg.Credentials, cfg.IsRevoked)
	authz := &authorizer{cluster: cfg.Credentials.Cluster, policy: cfg.Policy, trustForwardedFrom: slices.Clone(cfg.TrustForwardedFrom), isRevoked: cfg.IsRevoked}
	if cfg.AllowEnrolling {
		v := newClientVerifier(cfg.Credentials, cfg.IsRevoked)
		tlsConfig = enrollingServerTLSConfig(v)
		authz.enrolling = v.principal
	}

	// The interceptor order, outermost first. Each layer sees what the
	// layers inside it do, so the order is a decision:
	unary := []grpc.UnaryServerInterceptor{
		// 1. Recovery: outermost, so that a panic anywhere, in another
		//    interceptor too, becomes codes.Internal instead of killing
		//    the process.
		recovery.UnaryServerInterceptor(recovery.WithRecoveryHandlerContext(onPanic)),
		// 2. Metrics: every call is counted, including those that authn,
		//    authz or validation reject.
		s.metrics.UnaryServerInterceptor(),
		// 3. Logging: one line per finished call, rejected ones included;
		//    authn (4) adds the principal (and forwarder) to it.
		logging.UnaryServerInterceptor(logger, logOpts...),
		// 3b. Errors: a handler's error becomes a status here, with the
		//     one code table, reasons and retry delays of rpcerr; an
		//     error nothing explains is logged with a correlation id and
		//     the client gets only the id. Logging and metrics see the
		//     code the client gets.
		errorsUnary(s.logger),
		// 4. Authn/authz: certificate → principal (an enrolling node's
		//    from its self-signed key); a trusted forwarder's header →
		//    the original caller, whom the policy then judges. Nothing
		//    below runs for a caller the policy does not allow.
		authz.unary,
		// 5. Validation: every request against the rules declared next
		//    to its message in proto/ (validate.go) → InvalidArgument
		//    naming the field and the rule. After authz, so that
		//    strangers learn nothing about what a valid request looks
		//    like.
		validateUnary,
	}
	stream := []grpc.StreamServerInterceptor{
		recovery.StreamServerInterceptor(recovery.WithRecoveryHandlerContext(onPanic)),
		s.metrics.StreamServerInterceptor(),
		logging.StreamServerInterceptor(logger, logOpts...),
		errorsStream(s.logger),
		s.endStreamsOnStop,
		authz.stream,
		validateStream, // every message the client sends
	}

	s.grpc = grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsConfig)),
		// Protobuf, and an *Encoded as it is (encoded.go).
		grpc.ForceServerCodecV2(newEncodedCodec()),
		grpc.ChainUnaryInterceptor(append(unary, cfg.UnaryInterceptors...)...),
		grpc.ChainStreamInterceptor(append(stream, cfg.StreamInterceptors...)...),
		// Clients ping a quiet connection every KeepAliveTime (10 s);
		// more than one a second is abuse.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             time.Second,
			PermitWithoutStream: true,
		}),
		// Find clients that vanished (a node powered off mid-watch) within
		// about 20s instead of waiting for TCP to notice.
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:    15 * time.Second,
			Timeout: 5 * time.Second,
		}),
	)
	s.health.SetServingStatus("", healthgrpc.HealthCheckResponse_NOT_SERVING)
	healthgrpc.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc) // v1 and v1alpha
	return s, nil
}

func errorsUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			return nil, rpcerr.ToStatus(ctx, log, info.FullMethod, err)
		}
		return resp, nil
	}
}

func errorsStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return rpcerr.ToStatus(ss.Context(), log, info.FullMethod, handler(srv, ss))
	}
}

// codeToLevel logs successful calls at Debug, client-side failures at Info
// and failures that point at the server itself at Warn.
func codeToLevel(code codes.Code) logging.Level {
	switch code {
	case codes.OK:
		return logging.LevelDebug
	case codes.Unknown, codes.Internal, codes.DataLoss, codes.Unimplemented:
		return logging.LevelWarn
	default:
		return logging.LevelInfo
	}
}

// GRPC returns the underlying server, for registering services.
func (s *Server) GRPC() *grpc.Server { return s.grpc }

// Health returns the health server; its overall status ("") starts
// NOT_SERVING.
func (s *Server) Health() *health.Server { return s.health }

// Registry returns the registry holding the server's metrics.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// MetricsHandler serves the server's registry in the Prometheus format.
func (s *Server) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{})
}

// Serve serves on lis until ctx is cancelled, then stops: health turns
// NOT_SERVING, calls in flight get the grace period to finish, and whatever is
// left (typically watch streams) is cut off. It returns nil after such a
// stop, so it can be used as a run.Runnable.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	s.checkOnce.Do(func() {
		s.metrics.InitializeMetrics(s.grpc)
		s.warnUnlisted()
	})
	served := make(chan error, 1)
	go func() { served <- s.grpc.Serve(lis) }()
	select {
	case err := <-served:
		if err != nil {
			return fmt.Errorf("serve gRPC on %s: %w", lis.Addr(), err)
		}
		return nil
	case <-ctx.Done():
	}

	s.health.Shutdown()
	s.stopStreams()
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	timer := time.NewTimer(s.gracePeriod)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		s.logger.Warn("graceful stop timed out; closing remaining connections", "grace_period", s.gracePeriod)
		s.grpc.Stop()
		<-stopped
	}
	if err := <-served; err != nil {
		return fmt.Errorf("serve gRPC on %s: %w", lis.Addr(), err)
	}
	return nil
}

// errStopping ends a stream when its server stops. This server's own
// state: the client's channel does not retry it here, and a caller that
// rotates over replicas moves on to the next one at once.
var errStopping = rpcerr.Unavailable.SubOwnState("the server is stopping; streams end, reconnect (to another replica if there is one)")

// endStreamsOnStop ends a stream as soon as its server begins to stop:
// the handler's context is cancelled and the client gets Unavailable
// (errStopping). Streams (watches, heartbeats) never end on their own, so
// without it every stop of a server with clients waited out the whole
// grace period, which is meant for unary calls in flight; and the clients
// learnt only at its end that they should go elsewhere.
func (s *Server) endStreamsOnStop(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cancel := context.WithCancelCause(ss.Context())
	defer cancel(nil)
	defer context.AfterFunc(s.stopping, func() { cancel(errStopping) })()
	err := handler(srv, &stoppableStream{ServerStream: ss, ctx: ctx})
	if context.Cause(ctx) == errStopping { //nolint:errorlint // the sentinel itself, never wrapped
		// Whatever the handler made of its cancelled context (nil, or
		// Canceled): a clean end would tell a watcher that nothing more
		// comes.
		return errStopping
	}
	return err
}

// stoppableStream is a stream whose context also ends when its server
// stops.
type stoppableStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stoppableStream) Context() context.Context { return s.ctx }

// warnUnlisted logs registered methods that the policy does not list: they
// are denied to everyone, which is safe but rarely meant.
func (s *Server) warnUnlisted() {
	for svc, info := range s.grpc.GetServiceInfo() {
		for _, m := range info.Methods {
			method := "/" + svc + "/" + m.Name
			if _, ok := s.policy[method]; !ok && !isAlwaysAllowed(method) {
				s.logger.Warn("method not in authorization policy; every call will be denied", "grpc.method", method)
			}
		}
	}
}
