package pki

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"testing"
)

func TestEd25519PEM(t *testing.T) {
	key, err := NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	data, err := MarshalEd25519PEM(key)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(data, []byte("-----BEGIN PRIVATE KEY-----")) {
		t.Errorf("not PKCS#8 PEM: %q", data)
	}
	got, err := ParseEd25519PEM(data)
	if err != nil {
		t.Fatalf("ParseEd25519PEM: %v", err)
	}
	if !got.Equal(key) {
		t.Error("round trip changed the key")
	}
	if id := NodeID(got.Public().(ed25519.PublicKey)); !nodeIDRE.MatchString(id) {
		t.Errorf("NodeID = %q, not a node id", id)
	}

	ca := newTestCA(t, testCluster)
	ecPEM, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseEd25519PEM(ecPEM); err == nil {
		t.Error("ParseEd25519PEM accepted an ECDSA key")
	}
	if _, err := MarshalEd25519PEM(key[:10]); err == nil {
		t.Error("MarshalEd25519PEM accepted a truncated key")
	}
}

func TestCertPool(t *testing.T) {
	a, b := newTestCA(t, testCluster), newTestCA(t, "other")
	pool, err := CertPool(append(append([]byte(nil), a.CertPEM...), b.CertPEM...))
	if err != nil {
		t.Fatalf("CertPool: %v", err)
	}
	for _, ca := range []*CA{a, b} {
		if _, err := ca.Cert.Verify(x509.VerifyOptions{Roots: pool}); err != nil {
			t.Errorf("CA %q not in pool: %v", ca.Cert.Subject, err)
		}
	}
	for name, data := range map[string][]byte{
		"empty":       nil,
		"no PEM":      []byte("hello"),
		"only a key":  must(a.KeyPEM()),
		"broken cert": []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := CertPool(data); err == nil {
				t.Fatal("CertPool succeeded, want error")
			}
		})
	}

	c, err := ParseCertPEM(a.CertPEM)
	if err != nil || !c.Equal(a.Cert) {
		t.Errorf("ParseCertPEM = %v, want the CA", err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
