package curator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/gen/curia/curator/v1/curatorv1connect"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// The admin API is also served over the Connect protocol (DESIGN §8), so
// that curl with JSON works:
//
//	curl --cacert ca.crt --cert admin.crt --key admin.key -H 'Content-Type: application/json' \
//	     -d '{}' https://HOST:PORT/curia.curator.v1.Management/GetClusterInfo
//
// It reuses the gRPC implementation whole: every Connect call becomes a gRPC
// call to the leader (this replica or another) that names the caller as the
// forwarded principal, so authorization, forwarding and the handlers are
// the gRPC path's own. The listener has the same mutual TLS.

// serveConnect serves Connect on lis until ctx ends.
func (s *Service) serveConnect(ctx context.Context, lis net.Listener) error {
	self, err := rpc.Dial(s.cfg.Advertise, rpc.ClientConfig{Credentials: s.creds, ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		return err
	}
	defer self.Close()
	path, handler := curatorv1connect.NewManagementHandler(&connectManagement{s: s, self: self})
	mux := http.NewServeMux()
	mux.Handle(path, s.authenticateHTTP(handler))
	tlsConfig := rpc.ServerTLSConfig(s.creds, s.crl.IsRevoked)
	tlsConfig.NextProtos = []string{"h2", "http/1.1"}
	hs := &http.Server{Handler: mux, TLSConfig: tlsConfig, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		// ctx is done: the requests in flight get 5s of their own.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			hs.Close() // the 5s passed: cut the connections left
		}
	}()
	s.log.Info("admin API over Connect", "listen", lis.Addr().String())
	if err := hs.ServeTLS(lis, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// authenticateHTTP maps the verified client certificate to its principal,
// as the gRPC server does; the call's authorization happens on the gRPC
// path.
func (s *Service) authenticateHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, "a client certificate of the cluster CA is required", http.StatusUnauthorized)
			return
		}
		leaf := r.TLS.VerifiedChains[0][0]
		p, err := pki.PrincipalFromCert(leaf, s.cfg.Cluster)
		if err == nil && s.crl.IsRevoked(leaf) {
			err = fmt.Errorf("certificate %s is revoked", leaf.SerialNumber.Text(16))
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(rpc.WithPrincipal(r.Context(), p)))
	})
}

// connectManagement adapts Connect calls to gRPC calls to the leader.
type connectManagement struct {
	s    *Service
	self *grpc.ClientConn
}

// client is the Management API of the leader, with the caller named.
func (c *connectManagement) client(ctx context.Context) (curatorv1.ManagementClient, context.Context, error) {
	p, _ := rpc.PrincipalFromContext(ctx)
	cc, err := c.s.lead.leaderConn(ctx)
	if err != nil {
		return nil, nil, connectError(toStatus(err))
	}
	if cc == nil {
		cc = c.self
	}
	return curatorv1.NewManagementClient(cc), rpc.ForwardedContext(ctx, p), nil
}

// connectError carries a gRPC status over to Connect (the codes are the
// same).
func connectError(err error) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	return connect.NewError(connect.Code(st.Code()), errors.New(st.Message()))
}

func unary[Req, Resp any](c *connectManagement, ctx context.Context, req *connect.Request[Req],
	call func(curatorv1.ManagementClient, context.Context, *Req, ...grpc.CallOption) (*Resp, error)) (*connect.Response[Resp], error) {
	cl, cctx, err := c.client(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := call(cl, cctx, req.Msg)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(resp), nil
}

func (c *connectManagement) ApproveNode(ctx context.Context, req *connect.Request[curatorv1.ApproveNodeRequest]) (*connect.Response[curatorv1.ApproveNodeResponse], error) {
	return unary(c, ctx, req, curatorv1.ManagementClient.ApproveNode)
}

func (c *connectManagement) UpdateNodeRoles(ctx context.Context, req *connect.Request[curatorv1.UpdateNodeRolesRequest]) (*connect.Response[curatorv1.UpdateNodeRolesResponse], error) {
	return unary(c, ctx, req, curatorv1.ManagementClient.UpdateNodeRoles)
}

func (c *connectManagement) DeleteNode(ctx context.Context, req *connect.Request[curatorv1.DeleteNodeRequest]) (*connect.Response[curatorv1.DeleteNodeResponse], error) {
	return unary(c, ctx, req, curatorv1.ManagementClient.DeleteNode)
}

func (c *connectManagement) GetClusterInfo(ctx context.Context, req *connect.Request[curatorv1.GetClusterInfoRequest]) (*connect.Response[curatorv1.GetClusterInfoResponse], error) {
	return unary(c, ctx, req, curatorv1.ManagementClient.GetClusterInfo)
}

func (c *connectManagement) GetConsensusStatus(ctx context.Context, req *connect.Request[curatorv1.GetConsensusStatusRequest]) (*connect.Response[curatorv1.GetConsensusStatusResponse], error) {
	return unary(c, ctx, req, curatorv1.ManagementClient.GetConsensusStatus)
}

func (c *connectManagement) GetRegisterTicket(ctx context.Context, req *connect.Request[curatorv1.GetRegisterTicketRequest]) (*connect.Response[curatorv1.GetRegisterTicketResponse], error) {
	return unary(c, ctx, req, curatorv1.ManagementClient.GetRegisterTicket)
}

// receiver is a gRPC server stream's client side.
type receiver[T any] interface{ Recv() (*T, error) }

func serverStream[Req, Resp any, S receiver[Resp]](c *connectManagement, ctx context.Context, req *connect.Request[Req], out *connect.ServerStream[Resp],
	open func(curatorv1.ManagementClient, context.Context, *Req, ...grpc.CallOption) (S, error)) error {
	cl, cctx, err := c.client(ctx)
	if err != nil {
		return err
	}
	in, err := open(cl, cctx, req.Msg)
	if err != nil {
		return connectError(err)
	}
	for {
		m, err := in.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return connectError(err)
		}
		if err := out.Send(m); err != nil {
			return err
		}
	}
}

func (c *connectManagement) GetNodes(ctx context.Context, req *connect.Request[curatorv1.GetNodesRequest], out *connect.ServerStream[curatorv1.GetNodesResponse]) error {
	return serverStream(c, ctx, req, out, curatorv1.ManagementClient.GetNodes)
}

func (c *connectManagement) WatchAuditLog(ctx context.Context, req *connect.Request[curatorv1.WatchAuditLogRequest], out *connect.ServerStream[curatorv1.WatchAuditLogResponse]) error {
	return serverStream(c, ctx, req, out, curatorv1.ManagementClient.WatchAuditLog)
}
