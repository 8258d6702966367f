package roleserve_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	roleservev1 "curia.dev/gen/curia/roleserve/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
	ct "curia.dev/services/consensus/consensustest"
	cut "curia.dev/services/curator/curatortest"
)

// TestSecurityMatrix calls every kind of server — curator, consensus (a
// member's and an idle one), reconciler, node agent, etcd's client and peer
// ports — as every kind of
// identity, and checks who gets in. gRPC servers are asked twice: health
// (open to every valid identity of the CA) and one call of their own API,
// whose rule the row names; etcd's ports admit what etcd admits. The
// per-method rules of each API have tests of their own (TestAuthorization
// Matrix, TestMutualTLS); this one checks that every server authenticates
// alike: a revoked, expired, foreign or self-signed certificate gets into
// none, and nothing a node holds reaches etcd but a member certificate.
func TestSecurityMatrix(t *testing.T) {
	c := cut.New(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	voter := c.Voters[0]
	a, idle, rs := enrolBare(t, c)
	r := startReconcilerFor(t, c)

	// A deleted node's certificate: revoked.
	gone := c.NewAgent()
	gone.Enrol(ctx)
	if _, err := c.Management().DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: gone.ID, SafetyBypassNotDecommissioned: true}); err != nil {
		t.Fatal(err)
	}
	self := c.PKI.Issue(t, pki.Principal{Kind: pki.KindNode, Name: a.ID}, time.Hour)
	member := c.PKI.Issue(t, pki.Principal{Kind: pki.KindMember, Name: voter.ID}, time.Hour)
	foreign := ct.NewPKI(t).Creds(t, cut.Admin)
	enrollingKey, _ := ct.NewNodeKey(t)
	enrolling, err := pki.SelfSignedCert(enrollingKey, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	identities := []struct {
		name string
		cert tls.Certificate
	}{
		{"admin", *c.PKI.Creds(t, cut.Admin).Certificate()},
		{"curator", *c.PKI.Creds(t, pki.Principal{Kind: pki.KindCurator}).Certificate()},
		{"reconciler", *c.PKI.Creds(t, pki.Principal{Kind: pki.KindReconciler}).Certificate()},
		{"node", *self.Certificate()},
		{"consensus", *c.PKI.Creds(t, pki.Principal{Kind: pki.KindConsensus, Name: voter.ID}).Certificate()},
		{"member", *member.Certificate()},
		{"enrolling", enrolling},
		{"revoked", *gone.Creds.Certificate()},
		{"foreign CA", *foreign.Certificate()},
		{"expired", expiredCert(t, c.PKI, cut.Admin)},
		{"none", tls.Certificate{}},
	}
	valid := []string{"admin", "curator", "reconciler", "node", "consensus", "member"}

	type server struct {
		name, addr string
		call       func(context.Context, *grpc.ClientConn) error
		allowed    []string
	}
	servers := []server{
		{"curator", c.Curators[0].Addr, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := curatorv1.NewManagementClient(cc).GetClusterInfo(ctx, &curatorv1.GetClusterInfoRequest{})
			return err
		}, []string{"admin"}},
		{"consensus", voter.API, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := consensusv1.NewConsensusClient(cc).ListMembers(ctx, &consensusv1.ListMembersRequest{})
			return err
		}, []string{"admin", "curator", "reconciler", "consensus"}},
		// A worker's consensus process, idle: it follows the CRL from the
		// curators. "node" is its own node's agent.
		{"idle consensus", idle.API, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := consensusv1.NewConsensusClient(cc).Status(ctx, &consensusv1.StatusRequest{})
			return err
		}, []string{"admin", "curator", "reconciler", "consensus", "node"}},
		{"reconciler", r.addr, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := reconcilerv1.NewReconcilerClient(cc).GetStatus(ctx, &reconcilerv1.GetStatusRequest{})
			return err
		}, []string{"admin"}},
		{"roleserve", rs.listen, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := roleservev1.NewRoleServerClient(cc).GetStatus(ctx, &roleservev1.GetStatusRequest{})
			return err
		}, []string{"admin"}},
	}
	pool, err := pki.CertPool(c.PKI.CA.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	tlsAs := func(cert tls.Certificate) *tls.Config {
		cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, InsecureSkipVerify: true} //nolint:gosec // the server's identity is not under test
		if cert.Certificate != nil {
			cfg.Certificates = []tls.Certificate{cert}
		}
		return cfg
	}
	// Refused: by authentication or authorization, or at the handshake
	// (TLS 1.3 reports a refused client certificate after it, as a broken
	// connection: Unavailable).
	refused := func(err error) bool {
		switch status.Code(err) {
		case codes.Unauthenticated, codes.PermissionDenied, codes.Unavailable:
			return true
		}
		return false
	}
	// The CRL reaches every server within 2s of the deletion.
	deleted := time.Now()
	proctest.Eventually(t, 2*time.Second, func() error {
		for _, s := range servers {
			cc, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsAs(*gone.Creds.Certificate()))))
			if err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			_, err = healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{})
			cancel()
			cc.Close()
			if err == nil {
				return errors.New(s.name + " still admits the deleted node's certificate")
			}
		}
		return nil
	})
	t.Logf("every curia server refuses the deleted node's certificate %v after DeleteNode answered", time.Since(deleted).Round(time.Millisecond))

	for _, s := range servers {
		for _, id := range identities {
			t.Run(s.name+"/"+id.name, func(t *testing.T) {
				cc, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsAs(id.cert))))
				if err != nil {
					t.Fatal(err)
				}
				defer cc.Close()
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				_, err = healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{})
				if want := slices.Contains(valid, id.name); (err == nil) != want {
					t.Errorf("health: admitted=%v, want %v (%v)", err == nil, want, err)
				}
				err = s.call(cctx, cc)
				if want := slices.Contains(s.allowed, id.name); want == refused(err) {
					t.Errorf("%s API: refused=%v, want allowed=%v (%v)", s.name, refused(err), want, err)
				}
			})
		}
	}
	for _, port := range []struct {
		url     string
		allowed []string
	}{{voter.ClientURL + "/version", []string{"curator", "member"}}, {voter.PeerURL + "/members", []string{"member"}}} {
		for _, id := range identities {
			t.Run("etcd "+port.url+"/"+id.name, func(t *testing.T) {
				err := ct.Get(port.url, tlsAs(id.cert))
				if want := slices.Contains(port.allowed, id.name); (err == nil) != want {
					t.Errorf("admitted=%v, want %v (%v)", err == nil, want, err)
				}
			})
		}
	}
}

// expiredCert is a certificate of the cluster CA for p that expired an hour
// ago.
func expiredCert(t *testing.T, k *ct.PKI, p pki.Principal) tls.Certificate {
	t.Helper()
	return k.HandMade(t, &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: string(p.Kind)},
		NotBefore:    time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		URIs:        []*url.URL{p.URI(k.Cluster)},
	})
}

// startReconcilerFor starts a reconciler replica on c.
func startReconcilerFor(t *testing.T, c *cut.Cluster) *reconcilerProc {
	t.Helper()
	files := c.PKI.Files(t, pki.Principal{Kind: pki.KindReconciler})
	r := &reconcilerProc{addr: proctest.FreeAddr(t)}
	r.Proc = proctest.New(t, "reconciler", proctest.Build(t, "curia.dev/services/reconciler/cmd/reconciler"),
		"--cluster", c.PKI.Cluster, "--name", "reconciler-0",
		"--ca", files.CA, "--cert", files.Cert, "--key", files.Key,
		"--listen", r.addr, "--curator", c.Curators[0].Addr, "--consensus", c.Voters[0].API,
		"--log-level", "debug")
	r.Start()
	proctest.Eventually(t, 30*time.Second, func() error {
		cc, err := rpc.Dial(r.addr, rpc.ClientConfig{Credentials: c.PKI.Creds(t, cut.Admin)})
		if err != nil {
			return err
		}
		defer cc.Close()
		_, err = reconcilerv1.NewReconcilerClient(cc).GetStatus(context.Background(), &reconcilerv1.GetStatusRequest{})
		return err
	})
	return r
}

type reconcilerProc struct {
	addr string
	*proctest.Proc
}
