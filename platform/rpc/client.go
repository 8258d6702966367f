package rpc

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"curia.dev/platform/pki"
)

// ClientConfig configures Dial.
type ClientConfig struct {
	Credentials *Credentials // required
	// ServerKinds, if set, lists the principal kinds the server may have;
	// a server of another kind fails the handshake.
	ServerKinds []pki.Kind
	// AllowSelfSignedServer also accepts a server that presents a single
	// self-signed ed25519 certificate, valid now, instead of one of the CA:
	// a process that has no certificate yet (an idle consensus process,
	// to its own node's agent). Nothing about such a server is verified;
	// send it nothing secret.
	AllowSelfSignedServer bool
	// Logger, if set, gets one line per finished call (Debug when OK).
	Logger *slog.Logger
}

// Dial creates a client connection to target (any grpc.NewClient target,
// e.g. "curator:7000" or "dns:///curator:7000"). It connects lazily.
func Dial(target string, cfg ClientConfig) (*grpc.ClientConn, error) {
	if cfg.Credentials == nil {
		return nil, errors.New("rpc client: no credentials")
	}
	return dial(target, clientTLSConfig(cfg), cfg)
}

// clientTLSConfig is ClientTLSConfig with cfg's options.
func clientTLSConfig(cfg ClientConfig) *tls.Config {
	tc := ClientTLSConfig(cfg.Credentials, cfg.ServerKinds)
	if cfg.AllowSelfSignedServer {
		verify := tc.VerifyConnection
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			err := verify(cs)
			if _, serr := selfSigned(cs.PeerCertificates); err != nil && serr == nil {
				return nil
			}
			return err
		}
	}
	return tc
}

// DialAny connects to one of several replicas of a service (host:port
// each): the connection uses the first that answers and moves to another
// when it fails. A single address is dialled as is (a DNS name that
// resolves to every replica, as in compose, works too).
func DialAny(addrs []string, cfg ClientConfig) (*grpc.ClientConn, error) {
	if cfg.Credentials == nil {
		return nil, errors.New("rpc client: no credentials")
	}
	switch len(addrs) {
	case 0:
		return nil, errors.New("rpc client: no address")
	case 1:
		return Dial(addrs[0], cfg)
	}
	cc, _, err := DialReplicas(addrs, cfg)
	return cc, err
}

// DialReplicas is DialAny for replicas whose addresses change while the
// connection is in use (a compose replica recreated on another published
// port): update gives the connection the addresses to use from then on.
func DialReplicas(addrs []string, cfg ClientConfig) (cc *grpc.ClientConn, update func([]string), err error) {
	if cfg.Credentials == nil {
		return nil, nil, errors.New("rpc client: no credentials")
	}
	if len(addrs) == 0 {
		return nil, nil, errors.New("rpc client: no address")
	}
	r := manual.NewBuilderWithScheme("curia-replicas")
	state := func(addrs []string) resolver.State {
		var s resolver.State
		for _, a := range addrs {
			s.Addresses = append(s.Addresses, resolver.Address{Addr: a})
		}
		return s
	}
	r.InitialState(state(addrs))
	cc, err = dial(r.Scheme()+":///"+strings.Join(addrs, ","), clientTLSConfig(cfg), cfg, grpc.WithResolvers(r))
	if err != nil {
		return nil, nil, err
	}
	return cc, func(addrs []string) { r.UpdateState(state(addrs)) }, nil
}

// KeepAliveTime and KeepAliveTimeout are how often a client pings a
// connection that went quiet (curia's and etcd's clients alike) and how
// long it waits for the answer. 10 s is grpc-go's floor: it raises any
// shorter interval to 10 s (with a warning), so a server that stopped
// answering (a frozen VM, SIGSTOP) is found about 12 s after its last word.
// Callers that must not wait that long bound their own calls and ask
// another replica (the design notes list where). curia's servers, and etcd
// (GRPCKeepAliveMinTime), accept a ping every second.
const (
	KeepAliveTime    = 10 * time.Second
	KeepAliveTimeout = 2 * time.Second
)

// Reconnect is how a client tries again to reach a server it could not
// connect to: after 0.1 s, then 1.6 times longer each time, at most every
// 2 s (±20 %). gRPC's default (1 s, up to 2 minutes) is made for servers
// across the internet; curia's are on the same network and come back
// within seconds (a restart, a failover), and a client that waits out a
// long backoff meanwhile is a node that rejoins late. At make run's cold
// start every agent dials curators that are not serving yet: the default
// kept them away for about a second after the curators served. A refused
// connection costs the server nothing, so 10,000 agents each trying every
// 2 s during an outage is no load; a handshake is attempted only once one
// connects.
var Reconnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
	MinConnectTimeout: 20 * time.Second, // gRPC's default: a handshake with a frozen server gives up after it
}

// dial is Dial with the TLS configuration made; cfg.Credentials and
// cfg.ServerKinds are not used.
func dial(target string, tlsConfig *tls.Config, cfg ClientConfig, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                KeepAliveTime,
			Timeout:             KeepAliveTimeout,
			PermitWithoutStream: true,
		}),
		grpc.WithConnectParams(Reconnect),
	}
	if methods := declaredWithoutSideEffects(); len(methods) > 0 {
		sc, err := retryServiceConfig(methods)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithDefaultServiceConfig(sc))
	}
	if cfg.Logger != nil {
		logger := logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
			cfg.Logger.Log(ctx, slog.Level(lvl), msg, fields...)
		})
		logOpts := []logging.Option{
			logging.WithLogOnEvents(logging.FinishCall),
			logging.WithLevels(clientCodeToLevel),
			logging.WithDurationField(func(d time.Duration) logging.Fields { return logging.Fields{"duration", d} }),
		}
		opts = append(opts,
			grpc.WithChainUnaryInterceptor(logging.UnaryClientInterceptor(logger, logOpts...)),
			grpc.WithChainStreamInterceptor(logging.StreamClientInterceptor(logger, logOpts...)),
		)
	}
	conn, err := grpc.NewClient(target, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", target, err)
	}
	return conn, nil
}

func clientCodeToLevel(code codes.Code) logging.Level {
	if code == codes.OK || code == codes.Canceled {
		return logging.LevelDebug
	}
	return logging.LevelInfo
}

// declaredWithoutSideEffects are the full names of the methods, in the
// registered files of curia's proto packages, that their proto declares
// safe to repeat (option idempotency_level = NO_SIDE_EFFECTS: reads). Every
// client retries them on UNAVAILABLE, transparently (up to 4 attempts,
// backoff 0.1s to 1s): a replica that is stopping, a curator that lost
// leadership a moment ago. Nothing else is retried: a write retried after
// its first attempt took effect would answer for a different world (a
// second DeleteNode says NotFound).
var declaredWithoutSideEffects = sync.OnceValue(func() []string {
	var out []string
	eachCuriaFile(func(f protoreflect.FileDescriptor) {
		for i := range f.Services().Len() {
			svc := f.Services().Get(i)
			for j := range svc.Methods().Len() {
				m := svc.Methods().Get(j)
				opts, _ := m.Options().(*descriptorpb.MethodOptions)
				if opts.GetIdempotencyLevel() == descriptorpb.MethodOptions_NO_SIDE_EFFECTS {
					out = append(out, "/"+string(svc.FullName())+"/"+string(m.Name()))
				}
			}
		}
	})
	slices.Sort(out)
	return out
})

// retryServiceConfig renders the gRPC service config that retries the given
// methods on UNAVAILABLE. See
// https://github.com/grpc/grpc/blob/master/doc/service_config.md.
func retryServiceConfig(methods []string) (string, error) {
	type name struct {
		Service string `json:"service"`
		Method  string `json:"method"`
	}
	type retryPolicy struct {
		MaxAttempts          int      `json:"maxAttempts"`
		InitialBackoff       string   `json:"initialBackoff"`
		MaxBackoff           string   `json:"maxBackoff"`
		BackoffMultiplier    float64  `json:"backoffMultiplier"`
		RetryableStatusCodes []string `json:"retryableStatusCodes"`
	}
	type methodConfig struct {
		Name        []name      `json:"name"`
		RetryPolicy retryPolicy `json:"retryPolicy"`
	}
	mc := methodConfig{RetryPolicy: retryPolicy{
		MaxAttempts:          4,
		InitialBackoff:       "0.1s",
		MaxBackoff:           "1s",
		BackoffMultiplier:    2,
		RetryableStatusCodes: []string{"UNAVAILABLE"},
	}}
	for _, m := range methods {
		if !fullMethodRE.MatchString(m) {
			return "", fmt.Errorf("idempotent method %q is not a full method name (/package.Service/Method)", m)
		}
		svc, method, _ := strings.Cut(strings.TrimPrefix(m, "/"), "/")
		mc.Name = append(mc.Name, name{Service: svc, Method: method})
	}
	b, err := json.Marshal(map[string]any{"methodConfig": []methodConfig{mc}})
	if err != nil {
		return "", fmt.Errorf("render retry service config: %w", err)
	}
	return string(b), nil
}
