package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestIssueEveryKind(t *testing.T) {
	ca := newTestCA(t, testCluster)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for name, p := range allPrincipals {
		t.Run(name, func(t *testing.T) {
			iss := issue(t, ca, p)
			c := iss.Cert

			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageAny, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
				if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
					t.Errorf("Verify(usage %v): %v", usage, err)
				}
			}
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots, DNSName: "localhost"}); err != nil {
				t.Errorf("Verify(localhost): %v", err)
			}

			got, err := PrincipalFromCert(c, testCluster)
			if err != nil || got != p {
				t.Errorf("PrincipalFromCert = %v, %v; want %v", got, err, p)
			}
			if len(c.URIs) != 1 || c.URIs[0].String() != p.URI(testCluster).String() {
				t.Errorf("URIs = %v, want exactly [%v]", c.URIs, p.URI(testCluster))
			}
			if c.Subject.CommonName != string(p.Kind) {
				t.Errorf("CN = %q, want %q", c.Subject.CommonName, p.Kind)
			}
			if !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
				t.Errorf("ExtKeyUsage = %v, want server and client auth", c.ExtKeyUsage)
			}
			if c.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
				t.Errorf("KeyUsage = %v, want digitalSignature", c.KeyUsage)
			}
			if c.IsCA {
				t.Error("leaf is a CA")
			}
			if len(c.SubjectKeyId) == 0 || !bytes.Equal(c.AuthorityKeyId, ca.Cert.SubjectKeyId) {
				t.Errorf("SKID %x, AKID %x; want SKID set and AKID %x", c.SubjectKeyId, c.AuthorityKeyId, ca.Cert.SubjectKeyId)
			}
			if c.SerialNumber.Sign() <= 0 || c.SerialNumber.BitLen() < 64 {
				t.Errorf("serial %v: want a positive random 128-bit number", c.SerialNumber)
			}
			if d := time.Since(c.NotBefore); d < 30*time.Second || d > 2*time.Minute {
				t.Errorf("NotBefore %v is %v ago, want about a minute", c.NotBefore, d)
			}

			key, err := ParsePrivateKeyPEM(iss.KeyPEM)
			if err != nil {
				t.Fatalf("generated key: %v", err)
			}
			if _, ok := key.(*ecdsa.PrivateKey); !ok || !publicKeysEqual(key.Public(), c.PublicKey) {
				t.Errorf("generated key %T does not match the certificate", key)
			}
			// Every certificate is a different key and serial.
			again := issue(t, ca, p)
			if again.Cert.SerialNumber.Cmp(c.SerialNumber) == 0 || bytes.Equal(again.KeyPEM, iss.KeyPEM) {
				t.Error("two issues share a serial or a key")
			}
		})
	}
}

func TestIssueWithPublicKey(t *testing.T) {
	ca := newTestCA(t, testCluster)
	nodeKey, err := NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	pub := nodeKey.Public().(ed25519.PublicKey)
	p := Principal{Kind: KindNode, Name: NodeID(pub)}
	iss, err := ca.Issue(IssueRequest{Cluster: testCluster, Principal: p, PublicKey: pub, Validity: time.Hour})
	if err != nil {
		t.Fatalf("Issue: %v", err)
	}
	if iss.KeyPEM != nil {
		t.Error("KeyPEM set although the request brought its key")
	}
	if !pub.Equal(iss.Cert.PublicKey) {
		t.Error("certificate does not certify the given key")
	}
	if iss.Cert.KeyUsage&x509.KeyUsageKeyEncipherment != 0 {
		t.Error("keyEncipherment on an ed25519 key")
	}
}

func TestIssueClampsToCA(t *testing.T) {
	ca := newTestCA(t, testCluster)
	iss, err := ca.Issue(IssueRequest{Cluster: testCluster, Principal: Principal{Kind: KindCurator}, Validity: 1000 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if iss.Cert.NotAfter.After(ca.Cert.NotAfter) {
		t.Errorf("leaf NotAfter %v outlives the CA's %v", iss.Cert.NotAfter, ca.Cert.NotAfter)
	}
}

func TestIssueRefuses(t *testing.T) {
	ca := newTestCA(t, testCluster)
	other := newTestCA(t, testCluster)
	good := IssueRequest{Cluster: testCluster, Principal: Principal{Kind: KindCurator}, Validity: time.Hour}
	for name, tc := range map[string]struct {
		ca  *CA
		req func(r *IssueRequest)
	}{
		"bad cluster":         {req: func(r *IssueRequest) { r.Cluster = "Bad_Cluster" }},
		"empty cluster":       {req: func(r *IssueRequest) { r.Cluster = "" }},
		"unknown kind":        {req: func(r *IssueRequest) { r.Principal = Principal{Kind: "root"} }},
		"admin without name":  {req: func(r *IssueRequest) { r.Principal = Principal{Kind: KindAdmin} }},
		"curator with name":   {req: func(r *IssueRequest) { r.Principal = Principal{Kind: KindCurator, Name: "x"} }},
		"node with bad id":    {req: func(r *IssueRequest) { r.Principal = Principal{Kind: KindNode, Name: "node-xyz"} }},
		"zero validity":       {req: func(r *IssueRequest) { r.Validity = 0 }},
		"empty DNS name":      {req: func(r *IssueRequest) { r.DNSNames = []string{""} }},
		"broken IP":           {req: func(r *IssueRequest) { r.IPs = []net.IP{{1, 2, 3}} }},
		"the CA's own key":    {req: func(r *IssueRequest) { r.PublicKey = ca.Key.Public() }},
		"CA with foreign key": {ca: &CA{Cert: ca.Cert, CertPEM: ca.CertPEM, Key: other.Key}},
		"empty CA":            {ca: &CA{}},
	} {
		t.Run(name, func(t *testing.T) {
			req := good
			if tc.req != nil {
				tc.req(&req)
			}
			issuer := ca
			if tc.ca != nil {
				issuer = tc.ca
			}
			if iss, err := issuer.Issue(req); err == nil {
				t.Fatalf("Issue succeeded with URI %v, want error", iss.Cert.URIs)
			}
		})
	}
}

// PrincipalFromCert is the other half of Issue: certificates that are not
// exactly what Issue makes for this cluster carry no identity.
func TestPrincipalFromCertRefuses(t *testing.T) {
	ca := newTestCA(t, testCluster)
	for name, tc := range map[string]struct {
		cert    *x509.Certificate
		cluster string
	}{
		"wrong cluster":    {cert: issue(t, ca, Principal{Kind: KindCurator}).Cert, cluster: "other"},
		"no URI":           {cert: rawLeaf(t, ca)},
		"only a https URI": {cert: rawLeaf(t, ca, "https://test.curia/curator")},
		"two URIs":         {cert: rawLeaf(t, ca, "spiffe://test.curia/curator", "spiffe://test.curia/reconciler")},
		"same URI twice":   {cert: rawLeaf(t, ca, "spiffe://test.curia/curator", "spiffe://test.curia/curator")},
		"trailing slash":   {cert: rawLeaf(t, ca, "spiffe://test.curia/curator/")},
		"user info":        {cert: rawLeaf(t, ca, "spiffe://admin@test.curia/curator")},
		"query":            {cert: rawLeaf(t, ca, "spiffe://test.curia/curator?x=1")},
		"unknown kind":     {cert: rawLeaf(t, ca, "spiffe://test.curia/root")},
	} {
		t.Run(name, func(t *testing.T) {
			cluster := tc.cluster
			if cluster == "" {
				cluster = testCluster
			}
			p, err := PrincipalFromCert(tc.cert, cluster)
			if err == nil {
				t.Fatalf("PrincipalFromCert = %v, want error", p)
			}
			if !errors.Is(err, ErrNoIdentity) {
				t.Errorf("error %v does not wrap ErrNoIdentity", err)
			}
		})
	}
	// A spiffe URI next to an unrelated one is still exactly one identity.
	c := rawLeaf(t, ca, "https://example.com/", "spiffe://test.curia/admin/bob")
	if p, err := PrincipalFromCert(c, testCluster); err != nil || p != (Principal{Kind: KindAdmin, Name: "bob"}) {
		t.Errorf("PrincipalFromCert = %v, %v; want admin/bob", p, err)
	}
}

func TestSubjectKeyIDStable(t *testing.T) {
	ca := newTestCA(t, testCluster)
	a, err := subjectKeyID(ca.Key.Public())
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 20 || !bytes.Equal(a, ca.Cert.SubjectKeyId) {
		t.Errorf("subjectKeyID = %x, want 20 bytes equal to the CA's %x", a, ca.Cert.SubjectKeyId)
	}
	if strings.Count(string(ca.CertPEM), "BEGIN CERTIFICATE") != 1 {
		t.Error("CertPEM does not hold exactly one certificate")
	}
}
