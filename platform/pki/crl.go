package pki

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// CRL signs a certificate revocation list valid for the given duration and
// returns it as PEM ("X509 CRL"). number must grow with every CRL the CA
// publishes, so that a server can refuse to step back to an older list.
func (ca *CA) CRL(revoked []x509.RevocationListEntry, number *big.Int, validity time.Duration) ([]byte, error) {
	if err := ca.check(); err != nil {
		return nil, err
	}
	if number == nil || number.Sign() < 0 {
		return nil, errors.New("CRL number must be non-negative")
	}
	if validity <= 0 {
		return nil, fmt.Errorf("CRL validity %v: must be positive", validity)
	}
	now := time.Now()
	tmpl := &x509.RevocationList{
		RevokedCertificateEntries: revoked,
		Number:                    number,
		ThisUpdate:                now.Add(-clockSkew),
		NextUpdate:                now.Add(validity),
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.Cert, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("create CRL: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemCRL, Bytes: der}), nil
}

// InitialCRL is the CA's first revocation list: empty, number 0, valid as
// long as the CA. Every later list has a larger number.
func (ca *CA) InitialCRL() ([]byte, error) {
	return ca.CRL(nil, big.NewInt(0), time.Until(ca.Cert.NotAfter))
}

// EncodeCRLPEM encodes a DER CRL as PEM.
func EncodeCRLPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: pemCRL, Bytes: der})
}

// ParseCRL parses a PEM CRL without checking who signed it; use VerifyCRL for
// anything that enforces revocation.
func ParseCRL(data []byte) (*x509.RevocationList, error) {
	b, err := findPEM(data, pemCRL)
	if err != nil {
		return nil, err
	}
	crl, err := x509.ParseRevocationList(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse CRL: %w", err)
	}
	return crl, nil
}

// VerifyCRL parses a PEM CRL and checks that ca issued and signed it. It does
// not judge freshness (NextUpdate): whether a stale list fails open or closed
// is the enforcing server's policy.
func VerifyCRL(crlPEM []byte, ca *x509.Certificate) (*x509.RevocationList, error) {
	crl, err := ParseCRL(crlPEM)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(crl.RawIssuer, ca.RawSubject) {
		return nil, fmt.Errorf("CRL issued by %q, not by CA %q", crl.Issuer, ca.Subject)
	}
	if err := crl.CheckSignatureFrom(ca); err != nil {
		return nil, fmt.Errorf("CRL signature: %w", err)
	}
	return crl, nil
}

// VerifyCRLOf is VerifyCRL against a trust bundle: it returns the list and
// the CA of cas that signed it.
func VerifyCRLOf(crlPEM []byte, cas []*x509.Certificate) (*x509.RevocationList, *x509.Certificate, error) {
	var errs []error
	for _, ca := range cas {
		crl, err := VerifyCRL(crlPEM, ca)
		if err == nil {
			return crl, ca, nil
		}
		errs = append(errs, err)
	}
	return nil, nil, errors.Join(errs...)
}

// Revoked reports whether crl lists cert. The caller has verified the CRL with
// VerifyCRL against cert's issuer: serials are unique only per issuer.
func Revoked(crl *x509.RevocationList, cert *x509.Certificate) bool {
	for _, e := range crl.RevokedCertificateEntries {
		if e.SerialNumber != nil && e.SerialNumber.Cmp(cert.SerialNumber) == 0 {
			return true
		}
	}
	return false
}
