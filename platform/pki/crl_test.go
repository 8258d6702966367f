package pki

import (
	"crypto/x509"
	"math/big"
	"testing"
	"time"
)

func TestCRL(t *testing.T) {
	ca := newTestCA(t, testCluster)
	// Same cluster name, so the same issuer name: only the signature tells
	// the two CAs apart, as after "curia-pki init --force".
	other := newTestCA(t, testCluster)
	revoked := issue(t, ca, Principal{Kind: KindNode, Name: testNodeID})
	kept := issue(t, ca, Principal{Kind: KindCurator})
	entries := []x509.RevocationListEntry{{SerialNumber: revoked.Cert.SerialNumber, RevocationTime: time.Now()}}

	crlPEM, err := ca.CRL(entries, big.NewInt(7), time.Hour)
	if err != nil {
		t.Fatalf("CRL: %v", err)
	}
	foreignPEM, err := other.CRL(entries, big.NewInt(7), time.Hour)
	if err != nil {
		t.Fatalf("CRL: %v", err)
	}

	crl, err := VerifyCRL(crlPEM, ca.Cert)
	if err != nil {
		t.Fatalf("VerifyCRL(own CA): %v", err)
	}
	if crl.Number.Cmp(big.NewInt(7)) != 0 {
		t.Errorf("Number = %v, want 7", crl.Number)
	}
	if !crl.NextUpdate.After(time.Now()) || crl.ThisUpdate.After(time.Now()) {
		t.Errorf("ThisUpdate %v, NextUpdate %v: want now within", crl.ThisUpdate, crl.NextUpdate)
	}
	if !Revoked(crl, revoked.Cert) || Revoked(crl, kept.Cert) {
		t.Errorf("Revoked: revoked=%v kept=%v, want true, false", Revoked(crl, revoked.Cert), Revoked(crl, kept.Cert))
	}

	for name, tc := range map[string]struct {
		pem []byte
		ca  *x509.Certificate
	}{
		"signed by another CA":  {pem: foreignPEM, ca: ca.Cert},
		"checked against other": {pem: crlPEM, ca: other.Cert},
		"other cluster's CA":    {pem: crlPEM, ca: newTestCA(t, "other").Cert},
		"not a CRL":             {pem: ca.CertPEM, ca: ca.Cert},
		"garbage":               {pem: []byte("-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n"), ca: ca.Cert},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := VerifyCRL(tc.pem, tc.ca); err == nil {
				t.Fatal("VerifyCRL succeeded, want error")
			}
		})
	}

	// ParseCRL reads without judging the signer.
	if _, err := ParseCRL(foreignPEM); err != nil {
		t.Errorf("ParseCRL: %v", err)
	}
}

func TestCRLRefuses(t *testing.T) {
	ca := newTestCA(t, testCluster)
	for name, tc := range map[string]struct {
		number   *big.Int
		validity time.Duration
	}{
		"nil number":      {validity: time.Hour},
		"negative number": {number: big.NewInt(-1), validity: time.Hour},
		"zero validity":   {number: big.NewInt(1)},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ca.CRL(nil, tc.number, tc.validity); err == nil {
				t.Fatal("CRL succeeded, want error")
			}
		})
	}
}
