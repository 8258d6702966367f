package curator_test

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	ct "curia.dev/services/consensus/consensustest"
	cut "curia.dev/services/curator/curatortest"
)

// TestAuthorizationMatrix calls every curator RPC as every kind of caller
// and checks who gets past authentication and authorization (DESIGN §2).
// "Allowed" means the call was not refused for who made it; it may still
// fail on its content.
func TestAuthorizationMatrix(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	cur := c.Running()

	self := c.NewAgent()
	self.Enrol(ctx)
	revoked := c.NewAgent()
	revoked.Enrol(ctx)
	if _, err := c.Management().DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: revoked.ID, SafetyBypassNotDecommissioned: true}); err != nil {
		t.Fatal(err)
	}
	_, otherID := newKey(t)
	selfPub := self.Key.Public().(ed25519.PublicKey)
	ticket, err := c.Management().GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{})
	if err != nil {
		t.Fatal(err)
	}

	type caller struct {
		name string
		conn *grpc.ClientConn
	}
	dial := func(cfg *tls.Config) *grpc.ClientConn {
		cc, err := grpc.NewClient(cur.Addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	nodeConn := func(creds *rpc.Credentials) *grpc.ClientConn {
		cc, err := rpc.Dial(cur.Addr, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	enrolling, err := rpc.DialEnrolling(cur.Addr, c.PKI.CA.CertPEM, self.Key, []pki.Kind{pki.KindCurator})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { enrolling.Close() })
	anyCA := c.PKI.Creds(t, cut.Admin)
	foreign := func() *tls.Config {
		other := ct.NewPKI(t).Creds(t, cut.Admin)
		return &tls.Config{RootCAs: anyCA.CAPool, ServerName: "localhost", Certificates: []tls.Certificate{*other.Certificate()}, MinVersion: tls.VersionTLS13}
	}
	callers := []caller{
		{"admin", c.Conn(cur, cut.Admin)},
		{"node itself", nodeConn(self.Creds)},
		{"another node", c.Conn(cur, pki.Principal{Kind: pki.KindNode, Name: otherID})},
		{"curator", c.Conn(cur, pki.Principal{Kind: pki.KindCurator})},
		{"reconciler", c.Conn(cur, pki.Principal{Kind: pki.KindReconciler})},
		{"enrolling node", enrolling},
		{"no certificate", dial(&tls.Config{RootCAs: anyCA.CAPool, ServerName: "localhost", MinVersion: tls.VersionTLS13})},
		{"another CA", dial(foreign())},
		{"revoked", nodeConn(revoked.Creds)},
	}

	tlsRefused := map[string]bool{"no certificate": true, "another CA": true, "revoked": true}

	// Requests name the "node itself" wherever they name a node, so that
	// another node acting on it is refused.
	node := &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_NodeId{NodeId: self.ID}}
	methods := []struct {
		method  string
		req     proto.Message
		stream  bool
		allowed []string
	}{
		{"/curia.curator.v1.Curator/BootstrapCluster", &curatorv1.BootstrapClusterRequest{PublicKey: selfPub}, false, []string{"admin", "node itself"}},
		{"/curia.curator.v1.Curator/RegisterNode", &curatorv1.RegisterNodeRequest{PublicKey: selfPub, RegisterTicket: ticket.Ticket}, false, []string{"enrolling node"}},
		{"/curia.curator.v1.Curator/Watch", node, true, []string{"admin", "node itself", "curator", "reconciler", "enrolling node"}},
		{"/curia.curator.v1.Curator/UpdateNodeStatus", &curatorv1.UpdateNodeStatusRequest{NodeId: self.ID}, false, []string{"node itself"}},
		{"/curia.curator.v1.Curator/Heartbeat", &curatorv1.HeartbeatRequest{}, true, []string{"node itself", "another node"}},
		{"/curia.curator.v1.Curator/GetCurrentLeader", &curatorv1.GetCurrentLeaderRequest{}, true, []string{"admin", "node itself", "another node", "curator", "reconciler"}},
		{"/curia.curator.v1.Curator/WatchCRL", &curatorv1.WatchCRLRequest{}, true, []string{"admin", "node itself", "another node", "curator", "reconciler", "enrolling node"}},
		{"/curia.curator.v1.Management/GetNodes", &curatorv1.GetNodesRequest{}, true, []string{"admin"}},
		{"/curia.curator.v1.Management/ListNodes", &curatorv1.ListNodesRequest{}, false, []string{"admin"}},
		{"/curia.curator.v1.Management/ApproveNode", &curatorv1.ApproveNodeRequest{NodeId: self.ID}, false, []string{"admin"}},
		{"/curia.curator.v1.Management/UpdateNodeRoles", &curatorv1.UpdateNodeRolesRequest{NodeId: self.ID}, false, []string{"admin"}},
		{"/curia.curator.v1.Management/DeleteNode", &curatorv1.DeleteNodeRequest{NodeId: self.ID}, false, []string{"admin"}},
		// Without a reason: the admin's call fails on its contract, and changes nothing.
		{"/curia.curator.v1.Management/StartNodeMaintenance", &curatorv1.StartNodeMaintenanceRequest{NodeId: self.ID}, false, []string{"admin"}},
		{"/curia.curator.v1.Management/EndNodeMaintenance", &curatorv1.EndNodeMaintenanceRequest{NodeId: self.ID}, false, []string{"admin"}},
		{"/curia.curator.v1.Management/DecommissionNode", &curatorv1.DecommissionNodeRequest{NodeId: self.ID}, false, []string{"admin"}},
		{"/curia.curator.v1.Management/GetClusterInfo", &curatorv1.GetClusterInfoRequest{}, false, []string{"admin"}},
		{"/curia.curator.v1.Management/GetConsensusStatus", &curatorv1.GetConsensusStatusRequest{}, false, []string{"admin"}},
		{"/curia.curator.v1.Management/GetRegisterTicket", &curatorv1.GetRegisterTicketRequest{}, false, []string{"admin"}},
		{"/curia.curator.v1.Management/WatchAuditLog", &curatorv1.WatchAuditLogRequest{NoFollow: true}, true, []string{"admin"}},
		{"/curia.curator.v1.Management/GetClusterConfig", &curatorv1.GetClusterConfigRequest{}, false, []string{"admin", "reconciler"}},
		{"/curia.curator.v1.Management/WatchClusterConfig", &curatorv1.WatchClusterConfigRequest{}, true, []string{"admin", "reconciler"}},
		// Without a mask: the admin's call fails on its contract, and writes nothing.
		{"/curia.curator.v1.Management/UpdateClusterConfig", &curatorv1.UpdateClusterConfigRequest{}, false, []string{"admin"}},
		// Snapshots are off here: the allowed get FailedPrecondition.
		{"/curia.curator.v1.Management/TakeSnapshot", &curatorv1.TakeSnapshotRequest{}, false, []string{"admin", "reconciler"}},
		{"/curia.curator.v1.Management/ListSnapshots", &curatorv1.ListSnapshotsRequest{}, false, []string{"admin"}},
		{"/curia.curator.v1.Management/GetSnapshot", &curatorv1.GetSnapshotRequest{Name: "snapshot-20260101T000000Z-rev1"}, true, []string{"admin"}},
		{"/curia.curator.v1.Leases/Acquire", &curatorv1.AcquireRequest{}, false, []string{"reconciler"}},
		{"/curia.curator.v1.Leases/KeepAlive", &curatorv1.KeepAliveRequest{}, false, []string{"reconciler"}},
		{"/curia.curator.v1.Leases/Release", &curatorv1.ReleaseRequest{}, false, []string{"reconciler"}},
		{"/curia.curator.v1.Reconciliation/ReconcileNodeRoles", &curatorv1.ReconcileNodeRolesRequest{NodeId: self.ID}, false, []string{"reconciler"}},
		{"/curia.curator.v1.Curator/IssueCertificates", &curatorv1.IssueCertificatesRequest{}, false, []string{"node itself", "another node"}},
		{"/curia.curator.v1.Curator/GetMembership", &curatorv1.GetMembershipRequest{}, false, nil}, // consensus processes only
		// Last: committing again revokes the certificate the rows above
		// use as "node itself".
		{"/curia.curator.v1.Curator/CommitNode", &curatorv1.CommitNodeRequest{}, false, []string{"enrolling node"}},
	}
	// Every method of every curator service is in the table.
	listed := map[string]bool{}
	for _, m := range methods {
		listed[m.method] = true
	}
	for _, sd := range []grpc.ServiceDesc{curatorv1.Curator_ServiceDesc, curatorv1.Management_ServiceDesc, curatorv1.Leases_ServiceDesc, curatorv1.Reconciliation_ServiceDesc} {
		var names []string
		for _, m := range sd.Methods {
			names = append(names, m.MethodName)
		}
		for _, m := range sd.Streams {
			names = append(names, m.StreamName)
		}
		for _, n := range names {
			if full := "/" + sd.ServiceName + "/" + n; !listed[full] {
				t.Errorf("%s is not in the matrix: add it", full)
			}
		}
	}
	for _, m := range methods {
		for _, who := range callers {
			name := m.method[strings.LastIndex(m.method, "/")+1:] + "/" + who.name
			t.Run(name, func(t *testing.T) {
				err := call(ctx, who.conn, m.method, m.req, m.stream)
				refused := status.Code(err) == codes.PermissionDenied || status.Code(err) == codes.Unauthenticated
				if tlsRefused[who.name] {
					// Refused at the handshake: TLS 1.3 reports a refused
					// client certificate after the handshake, as a broken
					// connection.
					refused = status.Code(err) == codes.Unavailable
				}
				want := false
				for _, a := range m.allowed {
					want = want || a == who.name
				}
				if refused == want {
					t.Fatalf("allowed=%v, but the call returned %v", want, err)
				}
			})
		}
	}
}

// call makes one call with a request of the method's type and returns how
// it ended (for streams: the first message or the end).
func call(ctx context.Context, cc *grpc.ClientConn, method string, req proto.Message, stream bool) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if !stream {
		return cc.Invoke(ctx, method, req, &emptypb.Empty{})
	}
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
	if err != nil {
		return err
	}
	if err := cs.SendMsg(req); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if strings.HasSuffix(method, "/Heartbeat") {
		// bidi: keep the stream open so the server answers
	} else if err := cs.CloseSend(); err != nil {
		return err
	}
	err = cs.RecvMsg(&emptypb.Empty{})
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
