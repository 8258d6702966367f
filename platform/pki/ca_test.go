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
