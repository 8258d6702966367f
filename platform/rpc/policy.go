package rpc

import (
	"context"
	"crypto/x509"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"curia.dev/platform/pki"
)

// Rule says who may call one method.
type Rule struct {
	// Allow lists the principal kinds that may call the method.
	Allow []pki.Kind
	// Check, if set, is a further per-request check, e.g. "a node may only
	// act on itself". It runs after the kind check, with the principal in
	// ctx, on the unary request or on every message a stream receives. A
	// plain error becomes codes.PermissionDenied; a gRPC status error is
	// returned as is.
	Check func(ctx context.Context, p pki.Principal, req any) error
}

// Policy maps full method names ("/curia.consensus.v1.Consensus/Status") to
// rules. It denies by default: a method without a rule cannot be called,
// except for the health and reflection services, which every principal with
// a certificate of the CA may use. Enrolling nodes (pki.KindEnrolling) may
// call only methods whose rule allows them.
type Policy map[string]Rule

// alwaysAllowed are the service prefixes open to every principal with a
// certificate of the CA: operators and probes need them on every server
// (DESIGN §8).
var alwaysAllowed = []string{
	"/grpc.health.v1.Health/",
	"/grpc.reflection.v1.ServerReflection/",
	"/grpc.reflection.v1alpha.ServerReflection/",
}

func isAlwaysAllowed(method string) bool {
	return slices.ContainsFunc(alwaysAllowed, func(prefix string) bool {
		return strings.HasPrefix(method, prefix)
	})
}

var fullMethodRE = regexp.MustCompile(`^/[A-Za-z_][A-Za-z0-9_.]*/[A-Za-z_][A-Za-z0-9_]*$`)

// Validate checks that every key is a full method name and that every rule
// allows some kind: a rule that allows nobody is a typo, not a policy.
func (p Policy) Validate() error {
	for method, rule := range p {
		if !fullMethodRE.MatchString(method) {
			return fmt.Errorf("policy: %q is not a full method name (/package.Service/Method)", method)
		}
		if len(rule.Allow) == 0 {
			return fmt.Errorf("policy: rule for %s allows no principal kind", method)
		}
	}
	return nil
}

// Authorize decides whether who may call method with req. It returns nil or
// a gRPC status error (PermissionDenied, or whatever a Check returned). The
// server's interceptor calls it for every call; it is exported for other
// transports (Connect) that serve the same methods.
func (p Policy) Authorize(ctx context.Context, method string, who pki.Principal, req any) error {
	rule, err := p.rule(method, who)
	if err != nil {
		return err
	}
	return rule.check(ctx, method, who, req)
}

// rule checks the principal's kind and returns the rule for further checks.
func (p Policy) rule(method string, who pki.Principal) (Rule, error) {
	rule, ok := p[method]
	if who.Kind == pki.KindEnrolling {
		// Anyone can be one, so nothing is open to them by default.
		if !slices.Contains(rule.Allow, pki.KindEnrolling) {
			return Rule{}, status.Errorf(codes.PermissionDenied, "enrolling node %s may only call methods open to enrolling nodes, not %s", who.Name, method)
		}
		return rule, nil
	}
	if isAlwaysAllowed(method) {
		return Rule{}, nil
	}
	if !ok {
		return Rule{}, status.Errorf(codes.PermissionDenied, "method %s is not in the authorization policy", method)
	}
	if !slices.Contains(rule.Allow, who.Kind) {
		return Rule{}, status.Errorf(codes.PermissionDenied, "principal %s may not call %s", who, method)
	}
	return rule, nil
}

func (r Rule) check(ctx context.Context, method string, who pki.Principal, req any) error {
	if r.Check == nil {
		return nil
	}
	err := r.Check(ctx, who, req)
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Errorf(codes.PermissionDenied, "principal %s may not call %s: %v", who, method, err)
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p, as the server's interceptor does.
// Handlers' unit tests and other transports use it.
func WithPrincipal(ctx context.Context, p pki.Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFromContext returns the authenticated caller of the current call.
func PrincipalFromContext(ctx context.Context) (pki.Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(pki.Principal)
	return p, ok
}

// Caller is the authenticated caller of the current call, the zero
// Principal outside one: for handlers behind the server's interceptor,
// which refuses every call without one.
func Caller(ctx context.Context) pki.Principal {
	p, _ := PrincipalFromContext(ctx)
	return p
}

// ForwardedPrincipalHeader is the request metadata in which a forwarder (a
// curator follower calling the leader) names the original caller, in the
// String form of pki.Principal. Servers honour it only from the kinds in
// ServerConfig.TrustForwardedFrom and refuse it from anyone else.
const ForwardedPrincipalHeader = "curia-forwarded-principal"

// ForwardedContext returns ctx for an outgoing call made on behalf of p: the
// server authorizes p instead of the forwarder, if it trusts the forwarder.
func ForwardedContext(ctx context.Context, p pki.Principal) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(ForwardedPrincipalHeader, p.String())
	return metadata.NewOutgoingContext(ctx, md)
}

type forwarderKey struct{}

// WithForwarder returns ctx carrying the forwarder of the current call, as
// the server's interceptor does for a forwarded call.
func WithForwarder(ctx context.Context, p pki.Principal) context.Context {
	return context.WithValue(ctx, forwarderKey{}, p)
}

// ForwarderFromContext returns the direct peer of a forwarded call (whose
// original caller PrincipalFromContext returns); false if the call was not
// forwarded.
func ForwarderFromContext(ctx context.Context) (pki.Principal, bool) {
	p, ok := ctx.Value(forwarderKey{}).(pki.Principal)
	return p, ok
}

// authorizer is interceptor 4: authentication (certificate → principal, and
// a trusted forwarder's header → the original caller) and authorization
// (policy).
type authorizer struct {
	cluster string
	policy  Policy
	// enrolling is set when the server admits enrolling nodes: Go's TLS
	// stack then verified nothing itself (enrollingServerTLSConfig), so it
	// maps the client's certificates to a principal with the handshake's
	// own check.
	enrolling func([]*x509.Certificate) (pki.Principal, error)
	// trustForwardedFrom are the kinds whose ForwardedPrincipalHeader is
	// honoured.
	trustForwardedFrom []pki.Kind
	// isRevoked is asked on every call too, not only at the handshake: a
	// connection opened before a revocation must not outlive it.
	isRevoked func(*x509.Certificate) bool
}

// peerPrincipal maps the client's certificate to a principal.
func (a *authorizer) peerPrincipal(ctx context.Context) (pki.Principal, error) {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return pki.Principal{}, status.Error(codes.Unauthenticated, "no peer information")
	}
	info, _ := pr.AuthInfo.(credentials.TLSInfo)
	var who pki.Principal
	var err error
	switch {
	case len(info.State.VerifiedChains) > 0:
		leaf := info.State.VerifiedChains[0][0]
		if a.isRevoked != nil && a.isRevoked(leaf) {
			return pki.Principal{}, status.Errorf(codes.Unauthenticated, "client certificate %s is revoked", leaf.SerialNumber.Text(16))
		}
		// A connection outlives the certificate it began with no more
		// than a revocation: the client reconnects with its renewed one.
		if time.Now().After(leaf.NotAfter) {
			return pki.Principal{}, status.Errorf(codes.Unauthenticated, "client certificate %s expired at %v: reconnect with a renewed one", leaf.SerialNumber.Text(16), leaf.NotAfter)
		}
		who, err = pki.PrincipalFromCert(leaf, a.cluster)
	case a.enrolling != nil && len(info.State.PeerCertificates) > 0:
		who, err = a.enrolling(info.State.PeerCertificates)
	default:
		return pki.Principal{}, status.Error(codes.Unauthenticated, "no verified client certificate")
	}
	if err != nil {
		return pki.Principal{}, status.Errorf(codes.Unauthenticated, "client certificate: %v", err)
	}
	return who, nil
}

// authenticate returns the principal the policy applies to, in ctx too: the
// client's own or, if a trusted forwarder sent ForwardedPrincipalHeader, the
// one it names.
func (a *authorizer) authenticate(ctx context.Context) (context.Context, pki.Principal, error) {
	direct, err := a.peerPrincipal(ctx)
	if err != nil {
		return nil, pki.Principal{}, err
	}
	// The logging interceptor (3) runs outside this one; AddFields updates
	// the fields it will log when the call finishes.
	forwarded := metadata.ValueFromIncomingContext(ctx, ForwardedPrincipalHeader)
	if len(forwarded) == 0 { // the usual case
		logging.AddFields(ctx, logging.Fields{"principal", direct.String()})
		return WithPrincipal(ctx, direct), direct, nil
	}
	logging.AddFields(ctx, logging.Fields{"forwarded_by", direct.String()})
	if !slices.Contains(a.trustForwardedFrom, direct.Kind) {
		return nil, pki.Principal{}, status.Errorf(codes.PermissionDenied, "principal %s may not forward calls", direct)
	}
	if len(forwarded) != 1 {
		return nil, pki.Principal{}, status.Errorf(codes.Unauthenticated, "%d forwarded principals, want one", len(forwarded))
	}
	who, err := pki.ParseForwarded(forwarded[0])
	if err != nil {
		return nil, pki.Principal{}, status.Errorf(codes.Unauthenticated, "forwarded principal: %v", err)
	}
	logging.AddFields(ctx, logging.Fields{"principal", who.String()})
	return WithForwarder(WithPrincipal(ctx, who), direct), who, nil
}

func (a *authorizer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, who, err := a.authenticate(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.policy.Authorize(ctx, info.FullMethod, who, req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a *authorizer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, who, err := a.authenticate(ss.Context())
	if err != nil {
		return err
	}
	rule, err := a.policy.rule(info.FullMethod, who)
	if err != nil {
		return err
	}
	return handler(srv, &authorizedStream{ServerStream: ss, ctx: ctx, method: info.FullMethod, who: who, rule: rule})
}

// authorizedStream carries the principal and applies the rule's Check to
// every received message: a stream's requests are not known when it opens.
type authorizedStream struct {
	grpc.ServerStream
	ctx    context.Context
	method string
	who    pki.Principal
	rule   Rule
}

func (s *authorizedStream) Context() context.Context { return s.ctx }

func (s *authorizedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.rule.check(s.ctx, s.method, s.who, m)
}
