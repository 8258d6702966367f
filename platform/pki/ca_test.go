package pki

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"
)

func TestNewCA(t *testing.T) {
	ca := newTestCA(t, testCluster)
	c := ca.Cert
	if !c.IsCA || !c.BasicConstraintsValid || c.MaxPathLen != 0 || !c.MaxPathLenZero {
		t.Errorf("basic constraints: IsCA=%v valid=%v maxPathLen=%d zero=%v", c.IsCA, c.BasicConstraintsValid, c.MaxPathLen, c.MaxPathLenZero)
	}
	if want := x509.KeyUsageCertSign | x509.KeyUsageCRLSign; c.KeyUsage != want {
		t.Errorf("KeyUsage = %v, want %v", c.KeyUsage, want)
	}
	if want := "curia " + testCluster + " CA"; c.Subject.CommonName != want {
		t.Errorf("CN = %q, want %q", c.Subject.CommonName, want)
	}
	if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve.Params().Name != "P-256" {
		t.Errorf("public key %T, want ECDSA P-256", c.PublicKey)
	}
	if len(c.SubjectKeyId) == 0 {
		t.Error("no SubjectKeyId")
	}
	if err := c.CheckSignatureFrom(c); err != nil {
		t.Errorf("not self-signed: %v", err)
	}
	if c.NotBefore.After(time.Now()) {
		t.Errorf("NotBefore %v is in the future", c.NotBefore)
	}
}

func TestNewCARefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		cluster  string
		validity time.Duration
	}{
		"bad cluster":   {cluster: "Not A Cluster", validity: time.Hour},
		"empty cluster": {cluster: "", validity: time.Hour},
		"zero validity": {cluster: testCluster},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := NewCA(tc.cluster, tc.validity); err == nil {
				t.Fatal("NewCA succeeded, want error")
			}
		})
	}
}

func TestLoadCA(t *testing.T) {
	ca := newTestCA(t, testCluster)
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := pem.Decode(keyPEM); b == nil || b.Type != "PRIVATE KEY" {
		t.Fatalf("KeyPEM is not a PKCS#8 PEM block: %q", keyPEM)
	}
	other := newTestCA(t, testCluster)
	otherKeyPEM, err := other.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	sec1, err := x509.MarshalECPrivateKey(ca.Key.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	sec1PEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1})
	leaf := issue(t, ca, Principal{Kind: KindCurator})

	for name, tc := range map[string]struct {
		certPEM, keyPEM []byte
		wantErr         string // empty: success
	}{
		"round trip":          {certPEM: ca.CertPEM, keyPEM: keyPEM},
		"SEC 1 key":           {certPEM: ca.CertPEM, keyPEM: sec1PEM},
		"key of another CA":   {certPEM: ca.CertPEM, keyPEM: otherKeyPEM, wantErr: "does not match"},
		"leaf as CA":          {certPEM: leaf.CertPEM, keyPEM: leaf.KeyPEM, wantErr: "not a CA"},
		"garbage certificate": {certPEM: []byte("nope"), keyPEM: keyPEM, wantErr: "CERTIFICATE"},
		"garbage key":         {certPEM: ca.CertPEM, keyPEM: []byte("nope"), wantErr: "PRIVATE KEY"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := LoadCA(tc.certPEM, tc.keyPEM)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("LoadCA error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("LoadCA: %v", err)
			}
			if !got.Cert.Equal(ca.Cert) {
				t.Error("loaded certificate differs")
			}
			// The loaded CA must be able to issue.
			issue(t, got, Principal{Kind: KindReconciler})
		})
	}
}

// TestLoadCABundle: during a CA rotation --ca is a bundle of two CAs; the
// CA that issues is the one of the key, and a CRL of either verifies.
func TestLoadCABundle(t *testing.T) {
	old, err := NewCA(testCluster, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	next, err := NewCA(testCluster, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bundle := append(append([]byte{}, old.CertPEM...), next.CertPEM...)
	key, err := next.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	ca, err := LoadCA(bundle, key)
	if err != nil {
		t.Fatal(err)
	}
	if !ca.Cert.Equal(next.Cert) {
		t.Fatal("LoadCA took the bundle's other CA")
	}
	certs, err := ParseCertsPEM(bundle)
	if err != nil || len(certs) != 2 || !SharesCert(certs, []*x509.Certificate{old.Cert}) || SharesCert(certs[1:], []*x509.Certificate{old.Cert}) {
		t.Fatalf("ParseCertsPEM: %d certificates, %v", len(certs), err)
	}
	for _, signer := range []*CA{old, next} {
		crl, err := signer.InitialCRL()
		if err != nil {
			t.Fatal(err)
		}
		if _, issuer, err := VerifyCRLOf(crl, certs); err != nil || !issuer.Equal(signer.Cert) {
			t.Fatalf("a CRL of one of the bundle's CAs: issuer %v, %v", issuer, err)
		}
	}
	stranger, err := NewCA(testCluster, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	crl, err := stranger.InitialCRL()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := VerifyCRLOf(crl, certs); err == nil {
		t.Fatal("a CRL of a CA outside the bundle verified")
	}
}
