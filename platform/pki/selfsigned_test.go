package pki

import (
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"slices"
	"testing"
	"time"
)

func TestSelfSignedCert(t *testing.T) {
	key, err := NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	c, err := SelfSignedCert(key, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Certificate) != 1 || c.Leaf == nil {
		t.Fatalf("got %d certificates, leaf %v; want one, parsed", len(c.Certificate), c.Leaf)
	}
	leaf := c.Leaf
	if err := leaf.CheckSignature(leaf.SignatureAlgorithm, leaf.RawTBSCertificate, leaf.Signature); err != nil {
		t.Errorf("not self-signed: %v", err)
	}
	pub, ok := leaf.PublicKey.(ed25519.PublicKey)
	if !ok || !pub.Equal(key.Public()) {
		t.Errorf("public key %T is not the node's", leaf.PublicKey)
	}
	if want := NodeID(key.Public().(ed25519.PublicKey)); leaf.Subject.CommonName != want {
		t.Errorf("CommonName %q, want the node id %q", leaf.Subject.CommonName, want)
	}
	// Client and server: an idle consensus process serves with it.
	if leaf.IsCA || !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}) {
		t.Errorf("IsCA %v, ExtKeyUsage %v; want a client and server certificate, not a CA", leaf.IsCA, leaf.ExtKeyUsage)
	}
	if now := time.Now(); now.Before(leaf.NotBefore) || leaf.NotAfter.Before(now.Add(59*time.Minute)) || leaf.NotAfter.After(now.Add(time.Hour)) {
		t.Errorf("valid %v to %v, want from now for an hour", leaf.NotBefore, leaf.NotAfter)
	}
	if p, err := PrincipalFromCert(leaf, testCluster); !errors.Is(err, ErrNoIdentity) {
		t.Errorf("PrincipalFromCert = %v, %v; want ErrNoIdentity", p, err)
	}

	if _, err := SelfSignedCert(key[:10], time.Hour); err == nil {
		t.Error("accepted a truncated key")
	}
	if _, err := SelfSignedCert(key, 0); err == nil {
		t.Error("accepted a zero validity")
	}
}
