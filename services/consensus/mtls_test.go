package consensus_test

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	ct "curia.dev/services/consensus/consensustest"
)

// dialRaw dials the API with a hand-made TLS config (no policy help from
// rpc.Dial) to see what the server accepts.
func dialRaw(t *testing.T, addr string, cfg *tls.Config) consensusv1.ConsensusClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return consensusv1.NewConsensusClient(cc)
}

// TestMutualTLS: the API and etcd's ports admit only the right identities.
func TestMutualTLS(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	n := c.NewNode()
	c.Bootstrap(n)
	admin := c.PKI.Creds(t, pki.Principal{Kind: pki.KindAdmin, Name: "test"})
	base := func() *tls.Config {
		return &tls.Config{RootCAs: admin.CAPool, ServerName: "localhost", MinVersion: tls.VersionTLS13}
	}

	t.Run("no client certificate", func(t *testing.T) {
		_, err := dialRaw(t, n.API, base()).Status(ctx, &consensusv1.StatusRequest{})
		wantCode(t, err, codes.Unavailable, "")
	})
	t.Run("certificate of another CA", func(t *testing.T) {
		other := ct.NewPKI(t).Creds(t, pki.Principal{Kind: pki.KindAdmin, Name: "test"})
		cfg := base()
		cfg.Certificates = []tls.Certificate{*other.Certificate()}
		_, err := dialRaw(t, n.API, cfg).Status(ctx, &consensusv1.StatusRequest{})
		wantCode(t, err, codes.Unavailable, "")
	})
	t.Run("certificate without identity", func(t *testing.T) {
		cfg := base()
		cfg.Certificates = []tls.Certificate{c.PKI.HandMade(t, &x509.Certificate{
			SerialNumber: big.NewInt(42), Subject: pkix.Name{CommonName: "consensus"},
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})}
		_, err := dialRaw(t, n.API, cfg).Status(ctx, &consensusv1.StatusRequest{})
		wantCode(t, err, codes.Unauthenticated, "")
	})
	t.Run("a valid certificate works", func(t *testing.T) {
		cfg := base()
		cfg.Certificates = []tls.Certificate{*admin.Certificate()}
		if _, err := dialRaw(t, n.API, cfg).Status(ctx, &consensusv1.StatusRequest{}); err != nil {
			t.Fatal(err)
		}
	})

	other := ct.NewNodeID(t)
	denied := map[string]struct {
		as   pki.Principal
		call func(consensusv1.ConsensusClient) error
	}{
		"another node starts this node's member": {pki.Principal{Kind: pki.KindNode, Name: other}, func(cl consensusv1.ConsensusClient) error {
			_, err := cl.Start(ctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Bootstrap{Bootstrap: &consensusv1.Bootstrap{}}})
			return err
		}},
		"another node reads this node's status": {pki.Principal{Kind: pki.KindNode, Name: other}, func(cl consensusv1.ConsensusClient) error {
			_, err := cl.Status(ctx, &consensusv1.StatusRequest{})
			return err
		}},
		"the curator makes the node leave": {pki.Principal{Kind: pki.KindCurator}, func(cl consensusv1.ConsensusClient) error {
			_, err := cl.Leave(ctx, &consensusv1.LeaveRequest{})
			return err
		}},
		"a node lists members": {pki.Principal{Kind: pki.KindNode, Name: n.ID}, func(cl consensusv1.ConsensusClient) error {
			_, err := cl.ListMembers(ctx, &consensusv1.ListMembersRequest{})
			return err
		}},
		"an admin adds a member directly": {pki.Principal{Kind: pki.KindAdmin, Name: "test"}, func(cl consensusv1.ConsensusClient) error {
			_, err := cl.AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: other, PeerUrl: "https://127.0.0.1:1"})
			return err
		}},
		"a consensus peer removes a member": {pki.Principal{Kind: pki.KindConsensus, Name: other}, func(cl consensusv1.ConsensusClient) error {
			_, err := cl.RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: other}})
			return err
		}},
	}
	for name, tc := range denied {
		t.Run(name, func(t *testing.T) {
			wantCode(t, tc.call(n.Consensus(tc.as)), codes.PermissionDenied, "")
		})
	}
	if got := len(n.Members().Members); got != 1 {
		t.Fatalf("denied calls changed membership: %d members", got)
	}

	// etcd's ports admit members (and the curator, on the client port)
	// only: nothing a worker holds — its node certificate, its consensus
	// process's certificate — gets in.
	for port, allowed := range map[string][]pki.Kind{n.ClientURL + "/version": {pki.KindCurator, pki.KindMember}, n.PeerURL + "/members": {pki.KindMember}} {
		t.Run("etcd "+port, func(t *testing.T) {
			for _, p := range []pki.Principal{{Kind: pki.KindCurator}, {Kind: pki.KindMember, Name: other}, {Kind: pki.KindConsensus, Name: other}, {Kind: pki.KindNode, Name: other}, {Kind: pki.KindAdmin, Name: "test"}, {Kind: pki.KindReconciler}} {
				err := httpsGet(t, c, p, port)
				if want := slices.Contains(allowed, p.Kind); (err == nil) != want {
					t.Errorf("%s: admitted=%v, want %v (%v)", p, err == nil, want, err)
				}
			}
		})
	}
	if _, err := c.Etcd(n.ClientURL).Get(ctx, "/x"); err != nil {
		t.Fatalf("curator refused by etcd: %v", err)
	}
}

// httpsGet fetches url as principal p.
func httpsGet(t *testing.T, c *ct.Cluster, p pki.Principal, url string) error {
	return ct.Get(url, rpc.ClientTLSConfig(c.PKI.Creds(t, p), []pki.Kind{pki.KindMember}))
}
