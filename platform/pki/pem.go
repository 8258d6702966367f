package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// PEM block types.
const (
	pemCertificate  = "CERTIFICATE"
	pemPrivateKey   = "PRIVATE KEY" // PKCS#8
	pemECPrivateKey = "EC PRIVATE KEY"
	pemCRL          = "X509 CRL"
)

// findPEM returns the first block of the given type, skipping others (an
// openssl-written key may be preceded by an "EC PARAMETERS" block).
func findPEM(data []byte, types ...string) (*pem.Block, error) {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, fmt.Errorf("no %q PEM block found", types[0])
		}
		for _, t := range types {
			if b.Type == t {
				return b, nil
			}
		}
	}
}

// ParseCertPEM parses the first certificate of a PEM file.
func ParseCertPEM(data []byte) (*x509.Certificate, error) {
	b, err := findPEM(data, pemCertificate)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse certificate: %w", err)
	}
	return cert, nil
}

// ParseCertsPEM parses every certificate of a PEM file (a trust bundle:
// during a CA rotation, the old CA and the new one); at least one.
func ParseCertsPEM(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != pemCertificate {
			continue
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate %d: %w", len(out)+1, err)
		}
		out = append(out, cert)
	}
	if len(out) == 0 {
		return nil, errors.New("no CERTIFICATE block in PEM data")
	}
	return out, nil
}

// SharesCert reports whether two bundles have a certificate in common.
func SharesCert(a, b []*x509.Certificate) bool {
	for _, x := range a {
		for _, y := range b {
			if x.Equal(y) {
				return true
			}
		}
	}
	return false
}

// CertPool builds a pool from every certificate in a PEM file. Unlike
// x509.CertPool.AppendCertsFromPEM it fails on an empty or broken file rather
// than yielding a pool that silently trusts nothing.
func CertPool(caPEM []byte) (*x509.CertPool, error) {
	certs, err := ParseCertsPEM(caPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificates: %w", err)
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// EncodeCertPEM encodes a DER certificate as PEM.
func EncodeCertPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: der})
}

// MarshalPrivateKeyPEM encodes a private key as PKCS#8 ("PRIVATE KEY").
func MarshalPrivateKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), nil
}

// ParsePrivateKeyPEM parses a PKCS#8 ("PRIVATE KEY") or SEC 1 ("EC PRIVATE
// KEY", as openssl ecparam writes it) private key.
func ParsePrivateKeyPEM(data []byte) (crypto.Signer, error) {
	b, err := findPEM(data, pemPrivateKey, pemECPrivateKey)
	if err != nil {
		return nil, err
	}
	var key any
	if b.Type == pemECPrivateKey {
		key, err = x509.ParseECPrivateKey(b.Bytes)
	} else {
		key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("parse private key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key of type %T cannot sign", key)
	}
	return signer, nil
}

// NewNodeKey generates a node's identity key; NodeID derives its id.
func NewNodeKey() (ed25519.PrivateKey, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate node key: %w", err)
	}
	return key, nil
}

// MarshalEd25519PEM encodes an ed25519 private key as PKCS#8 ("PRIVATE KEY").
func MarshalEd25519PEM(key ed25519.PrivateKey) ([]byte, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("ed25519 private key has %d bytes, want %d", len(key), ed25519.PrivateKeySize)
	}
	return MarshalPrivateKeyPEM(key)
}

// ParseEd25519PEM parses a PKCS#8 ed25519 private key.
func ParseEd25519PEM(data []byte) (ed25519.PrivateKey, error) {
	key, err := ParsePrivateKeyPEM(data)
	if err != nil {
		return nil, err
	}
	ed, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("private key is %T, not ed25519", key)
	}
	return ed, nil
}

// publicKeysEqual compares two public keys of any supported type.
func publicKeysEqual(a, b crypto.PublicKey) bool {
	ak, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ak.Equal(b)
}

// newLeafKey is the key type every generated certificate uses: ECDSA P-256 is
// what every TLS stack we meet (etcd, grpcurl, curl, browsers) accepts.
func newLeafKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}
