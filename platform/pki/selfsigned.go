package pki

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"time"
)

// SelfSignedCert makes the client certificate of a node that has no
// certificate of the CA yet: self-signed by its ed25519 identity key, good
// for client auth, with the node id as CommonName and no URI SAN, since it
// is no identity of the CA. A server that admits enrolling nodes maps it to
// Principal{Kind: KindEnrolling, Name: NodeID(pub)}; the TLS handshake proves
// that the node holds the key (as in Metropolis).
func SelfSignedCert(key ed25519.PrivateKey, validity time.Duration) (tls.Certificate, error) {
	if len(key) != ed25519.PrivateKeySize {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: ed25519 private key has %d bytes, want %d", len(key), ed25519.PrivateKeySize)
	}
	if validity <= 0 {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: validity %v must be positive", validity)
	}
	pub := key.Public().(ed25519.PublicKey)
	serial, err := randomSerial()
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: NodeID(pub)},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// Server too: a process without a certificate of the CA serves
		// with it (an idle consensus process, to its node's agent).
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, // and not a CA
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: parse: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}
