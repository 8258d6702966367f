package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// clockSkew backdates NotBefore (and a CRL's ThisUpdate) so that a peer whose
// clock is a little behind ours accepts a certificate issued a moment ago.
const clockSkew = time.Minute

// CA is the cluster certificate authority.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	Key     crypto.Signer
}

// NewCA creates a self-signed cluster CA with an ECDSA P-256 key.
func NewCA(cluster string, validity time.Duration) (*CA, error) {
	if err := ValidateCluster(cluster); err != nil {
		return nil, err
	}
	if validity <= 0 {
		return nil, fmt.Errorf("CA validity %v: must be positive", validity)
	}
	key, err := newLeafKey()
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	skid, err := subjectKeyID(key.Public())
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "curia " + cluster + " CA"},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		// Leaves only: an intermediate would be a second, unaudited issuer.
		MaxPathLen:     0,
		MaxPathLenZero: true,
		SubjectKeyId:   skid,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	return &CA{Cert: cert, CertPEM: EncodeCertPEM(der), Key: key}, nil
}

// LoadCA loads a CA from its certificate and private key (PKCS#8, or SEC 1 for
// EC keys). certPEM may be a trust bundle (during a CA rotation): the CA is
// the certificate of the key. It refuses a certificate that is not a CA or a
// key that belongs to none.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	certs, err := ParseCertsPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	key, err := ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	cert := certs[0]
	for _, c := range certs {
		if publicKeysEqual(c.PublicKey, key.Public()) {
			cert = c
		}
	}
	ca := &CA{Cert: cert, CertPEM: EncodeCertPEM(cert.Raw), Key: key}
	if err := ca.check(); err != nil {
		return nil, err
	}
	return ca, nil
}

// check verifies that the CA can sign: both loaded halves belong together and
// the certificate may issue certificates and CRLs.
func (ca *CA) check() error {
	if ca == nil || ca.Cert == nil || ca.Key == nil {
		return errors.New("CA: certificate or key missing")
	}
	if !ca.Cert.BasicConstraintsValid || !ca.Cert.IsCA {
		return errors.New("CA certificate is not a CA (basic constraints)")
	}
	if ca.Cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return errors.New("CA certificate lacks the certSign key usage")
	}
	if !publicKeysEqual(ca.Key.Public(), ca.Cert.PublicKey) {
		return errors.New("CA key does not match the CA certificate")
	}
	return nil
}

// KeyPEM returns the CA's private key as PKCS#8 PEM.
func (ca *CA) KeyPEM() ([]byte, error) {
	return MarshalPrivateKeyPEM(ca.Key)
}

// randomSerial returns a random serial in [1, 2^128]: unique without keeping
// state, which RFC 5280 wants and CRLs rely on.
func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generate serial: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

// subjectKeyID derives a key identifier from a public key with method 1 of
// RFC 7093: the leftmost 160 bits of the SHA-256 of the subjectPublicKey bits.
func subjectKeyID(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("marshal public key: %w", err)
	}
	var spki struct {
		Algorithm pkix.AlgorithmIdentifier
		PublicKey asn1.BitString
	}
	if _, err := asn1.Unmarshal(der, &spki); err != nil {
		return nil, fmt.Errorf("parse public key: %w", err)
	}
	h := sha256.Sum256(spki.PublicKey.Bytes)
	return h[:20], nil
}
