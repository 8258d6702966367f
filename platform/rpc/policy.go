package rpc

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"curia.dev/platform/pki"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
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
// except for the health and reflection services, which every authenticated
// principal may use.
type Policy map[string]Rule

// alwaysAllowed are the service prefixes open to every authenticated
// principal: operators and probes need them on every server (DESIGN §8).
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
	if isAlwaysAllowed(method) {
		return Rule{}, nil
	}
	rule, ok := p[method]
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

// authorizer is interceptor 4: authentication (certificate → principal) and
// authorization (policy).
type authorizer struct {
	cluster string
	policy  Policy
}

// authenticate maps the verified client certificate to a principal.
func (a *authorizer) authenticate(ctx context.Context) (context.Context, pki.Principal, error) {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return nil, pki.Principal{}, status.Error(codes.Unauthenticated, "no peer information")
	}
	info, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 {
		return nil, pki.Principal{}, status.Error(codes.Unauthenticated, "no verified client certificate")
	}
	who, err := pki.PrincipalFromCert(info.State.VerifiedChains[0][0], a.cluster)
	if err != nil {
		return nil, pki.Principal{}, status.Errorf(codes.Unauthenticated, "client certificate: %v", err)
	}
	// The logging interceptor (3) runs outside this one; AddFields updates
	// the fields it will log when the call finishes.
	logging.AddFields(ctx, logging.Fields{"principal", who.String()})
	return WithPrincipal(ctx, who), who, nil
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
