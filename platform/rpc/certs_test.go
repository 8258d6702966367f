package rpc

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"curia.dev/platform/pki"
)

// Test certificates are made here with crypto/x509 so that these tests do not
// depend on the pki package's issuing code.

const testCluster = "test.curia"

var (
	admin      = pki.Principal{Kind: pki.KindAdmin, Name: "alice"}
	curator    = pki.Principal{Kind: pki.KindCurator}
	reconciler = pki.Principal{Kind: pki.KindReconciler}
	node1      = pki.Principal{Kind: pki.KindNode, Name: "node-00112233445566778899aabbccddeeff"}
	node2      = pki.Principal{Kind: pki.KindNode, Name: "node-ffeeddccbbaa99887766554433221100"}
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(t),
		Subject:               pkix.Name{CommonName: "test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pemBlock("CERTIFICATE", der)}
}

// issue returns a leaf with the given URI SANs (none for an empty list),
// usable as client and server, valid for 127.0.0.1.
func (ca *testCA) issue(t *testing.T, uris ...string) (certPEM, keyPEM []byte, serial *big.Int) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(t),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
		kind, _, _ := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
		tmpl.Subject.CommonName = kind
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pemBlock("CERTIFICATE", der), pemBlock("PRIVATE KEY", keyDER), tmpl.SerialNumber
}

// creds issues a certificate for p and loads it as Credentials.
func (ca *testCA) creds(t *testing.T, p pki.Principal) *Credentials {
	t.Helper()
	certPEM, keyPEM, _ := ca.issue(t, p.URI(testCluster).String())
	c, err := NewCredentials(testCluster, ca.pem, certPEM, keyPEM)
	if err != nil {
		t.Fatalf("NewCredentials(%s): %v", p, err)
	}
	return c
}

// keyPair issues a certificate that NewCredentials may refuse (no or foreign
// identity), for clients that misbehave.
func (ca *testCA) keyPair(t *testing.T, uris ...string) tls.Certificate {
	t.Helper()
	certPEM, keyPEM, _ := ca.issue(t, uris...)
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// signed returns a client certificate of key, signed by issuer or, if issuer
// is nil, by key itself, valid from an hour ago until notAfter, without
// identity: the certificates of enrolling nodes and their impostors.
func signed(t *testing.T, key crypto.Signer, issuer *testCA, notAfter time.Time) tls.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(t),
		Subject:      pkix.Name{CommonName: "enrolling"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	parent, parentKey := tmpl, key
	if issuer != nil {
		parent, parentKey = issuer.cert, issuer.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

func newNodeKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func newECDSAKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// enrolling is the principal of a node presenting a certificate of key.
func enrolling(key ed25519.PrivateKey) pki.Principal {
	return pki.Principal{Kind: pki.KindEnrolling, Name: pki.NodeID(key.Public().(ed25519.PublicKey))}
}

func randomSerial(t *testing.T) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
