package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"
)

const testCluster = "test.curia"

// testNodeID is a well-formed node id for principals that need one.
const testNodeID = "node-0123456789abcdef0123456789abcdef"

func newTestCA(t *testing.T, cluster string) *CA {
	t.Helper()
	ca, err := NewCA(cluster, 24*time.Hour)
	if err != nil {
		t.Fatalf("NewCA(%q): %v", cluster, err)
	}
	return ca
}

func issue(t *testing.T, ca *CA, p Principal) *Issued {
	t.Helper()
	iss, err := ca.Issue(IssueRequest{
		Cluster:   testCluster,
		Principal: p,
		DNSNames:  []string{"localhost"},
		IPs:       []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		Validity:  time.Hour,
	})
	if err != nil {
		t.Fatalf("Issue(%s): %v", p, err)
	}
	return iss
}

// allPrincipals has one principal of every kind.
var allPrincipals = map[string]Principal{
	"admin":      {Kind: KindAdmin, Name: "alice"},
	"curator":    {Kind: KindCurator},
	"reconciler": {Kind: KindReconciler},
	"node":       {Kind: KindNode, Name: testNodeID},
	"consensus":  {Kind: KindConsensus, Name: testNodeID},
}

// rawLeaf signs an arbitrary leaf with the CA, bypassing Issue's checks, to
// build certificates Issue would never produce.
func rawLeaf(t *testing.T, ca *CA, uris ...string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(42),
		Subject:      pkix.Name{CommonName: "raw"},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
