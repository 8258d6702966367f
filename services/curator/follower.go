package curator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
)

// Followers forward every leader-only call to the leader, unary and
// streaming alike, so that an operator can point grpcurl at any replica. The
// leader authorizes the original caller: the follower passes its principal
// along (rpc.ForwardedContext), and the leader trusts that only from a
// curator. A forwarded call is never forwarded again: if the leader changed
// on the way, the caller gets Unavailable and retries.

// localMethods are answered by every replica itself.
var localMethods = map[string]bool{
	"/curia.curator.v1.Curator/GetCurrentLeader": true,
	"/curia.curator.v1.Curator/Watch":            true, // every replica has its own watch hub (internal/nodewatch)
	"/curia.curator.v1.Curator/WatchCRL":         true, // every replica follows the CRL in etcd (internal/certs)
	"/curia.curator.v1.Curator/GetMembership":    true, // every replica reaches the consensus services
	// Every replica's watch hub answers GetNodes at etcd's current
	// revision (leader_nodes.go): reads scale with the replicas.
	"/curia.curator.v1.Management/GetNodes":  true,
	"/curia.curator.v1.Management/ListNodes": true, // GetNodes a page at a time
	// Every replica watches the configuration's key (internal/clusterconfig).
	"/curia.curator.v1.Management/WatchClusterConfig": true,
}

func forwarded(method string) bool {
	return strings.HasPrefix(method, "/curia.curator.v1.") && !localMethods[method]
}

// leaderConn decides where a call goes: nil when this replica leads (serve
// it here), else a connection to the leader.
func (l *leadership) leaderConn(ctx context.Context) (*grpc.ClientConn, error) {
	if _, _, ok := l.Ours(); ok {
		return nil, nil
	}
	if _, ok := rpc.ForwarderFromContext(ctx); ok {
		return nil, fmt.Errorf("%w: this replica received a forwarded call but does not lead (leadership moved); retry", errNotLeader)
	}
	cur, _ := l.leader()
	if cur.Address == "" || cur.Name == l.self.Name {
		// An election takes about a session TTL at most; the callers
		// (agents enrolling at a cold start above all) ask again soon
		// rather than on their doubling backoff.
		return nil, rpcerr.RetryAfter(errNoLeader, shortRetry)
	}
	return l.conn(cur.Address)
}

func (l *leadership) forwardUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !forwarded(info.FullMethod) {
		return handler(ctx, req)
	}
	cc, err := l.leaderConn(ctx)
	if err != nil {
		return nil, err
	}
	if cc == nil {
		return handler(ctx, req)
	}
	_, out, err := messageTypes(info.FullMethod)
	if err != nil {
		return nil, err
	}
	resp := out.New().Interface()
	if err := cc.Invoke(l.outgoing(ctx), info.FullMethod, req, resp); err != nil {
		return nil, err
	}
	return resp, nil
}

func (l *leadership) forwardStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !forwarded(info.FullMethod) {
		return handler(srv, ss)
	}
	cc, err := l.leaderConn(ss.Context())
	if err != nil {
		return err
	}
	if cc == nil {
		return handler(srv, ss)
	}
	in, out, err := messageTypes(info.FullMethod)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(l.outgoing(ss.Context()))
	defer cancel()
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: info.IsServerStream, ClientStreams: info.IsClientStream}, info.FullMethod)
	if err != nil {
		return err
	}
	// Caller → leader.
	upErr := make(chan error, 1)
	go func() {
		for {
			m := in.New().Interface()
			if err := ss.RecvMsg(m); err != nil {
				if errors.Is(err, io.EOF) {
					upErr <- cs.CloseSend()
					return
				}
				upErr <- err
				cancel()
				return
			}
			if err := cs.SendMsg(m); err != nil {
				upErr <- nil // the leader's answer (below) says why
				return
			}
		}
	}()
	// Leader → caller, headers first.
	if md, err := cs.Header(); err == nil && len(md) > 0 {
		if err := ss.SetHeader(md); err != nil {
			return err
		}
	}
	for {
		m := out.New().Interface()
		if err := cs.RecvMsg(m); err != nil {
			// The caller's side failed first (this replica's validation
			// refused a request as it was received, then cancelled the
			// leader's stream): that is the answer, not the cancellation.
			select {
			case uerr := <-upErr:
				if uerr != nil {
					return uerr
				}
			default:
			}
			ss.SetTrailer(cs.Trailer())
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := ss.SendMsg(m); err != nil {
			return err
		}
	}
}

// outgoing carries the caller's principal to the leader, and drops the
// caller's incoming metadata (it is not ours to pass on).
func (l *leadership) outgoing(ctx context.Context) context.Context {
	ctx = metadata.NewOutgoingContext(ctx, metadata.MD{})
	if p, ok := rpc.PrincipalFromContext(ctx); ok {
		ctx = rpc.ForwardedContext(ctx, p)
	}
	return ctx
}

// messageTypes finds a method's request and response types in the
// generated code's registry.
func messageTypes(fullMethod string) (in, out protoreflect.MessageType, err error) {
	name := strings.ReplaceAll(strings.TrimPrefix(fullMethod, "/"), "/", ".")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
	if err != nil {
		return nil, nil, fmt.Errorf("method %s: %w", fullMethod, err)
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return nil, nil, fmt.Errorf("%s is not a method", fullMethod)
	}
	if in, err = protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName()); err != nil {
		return nil, nil, err
	}
	if out, err = protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName()); err != nil {
		return nil, nil, err
	}
	return in, out, nil
}

var _ proto.Message // keep the import honest for readers of messageTypes
