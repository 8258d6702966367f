package rpc

import (
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"curia.dev/platform/pki"
)

// TLSFiles names the PEM files of a process's TLS material.
type TLSFiles struct {
	CA   string // cluster CA certificate
	Cert string // own certificate (leaf first, then any intermediates)
	Key  string // own private key
}

// AddFlags registers -<prefix>-ca, -<prefix>-cert and -<prefix>-key (-ca,
// -cert and -key for an empty prefix).
func (f *TLSFiles) AddFlags(fs *flag.FlagSet, prefix string) {
	if prefix != "" {
		prefix += "-"
	}
	fs.StringVar(&f.CA, prefix+"ca", f.CA, "path of the cluster CA certificate (PEM)")
	fs.StringVar(&f.Cert, prefix+"cert", f.Cert, "path of this process's certificate (PEM)")
	fs.StringVar(&f.Key, prefix+"key", f.Key, "path of this process's private key (PEM)")
}

// Credentials is the TLS material of a process, checked against the cluster.
// Its certificate may be renewed while it is in use (Renew): the TLS
// configurations built from it present the current one at every handshake.
type Credentials struct {
	Cluster string
	CAPool  *x509.CertPool
	CAPEM   []byte
	// Principal is this process's own identity, read from its certificate
	// (or, for SelfSigned credentials, the one it waits for). Renewing
	// never changes it.
	Principal pki.Principal
	cert      atomic.Pointer[tls.Certificate]
	// selfSigned, for NewSelfSignedCredentials, is presented again once
	// the installed certificate expired: the process is reachable to be
	// given a new one.
	selfSigned *tls.Certificate
}

// Certificate is the certificate handshakes present now.
func (c *Credentials) Certificate() *tls.Certificate {
	cert := c.cert.Load()
	if cert == nil {
		return &tls.Certificate{} // none: the handshake sends no certificate
	}
	if c.selfSigned != nil && time.Now().After(cert.Leaf.NotAfter) {
		return c.selfSigned
	}
	return cert
}

// Leaf is the parsed certificate handshakes present now.
func (c *Credentials) Leaf() *x509.Certificate { return c.cert.Load().Leaf }

// SelfSigned reports whether the credentials hold no certificate of the CA
// yet, only a self-signed one of their key (NewSelfSignedCredentials).
func (c *Credentials) SelfSigned() bool {
	_, err := c.verify(c.Certificate())
	return err != nil
}

// Renew replaces the certificate with certPEM (and its key keyPEM), which
// must pass NewCredentials' checks for the same cluster, CA and principal.
// New handshakes present it; open connections keep the one they began with.
func (c *Credentials) Renew(certPEM, keyPEM []byte) error {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("load certificate and key: %w", err)
	}
	p, err := c.verify(&cert)
	if err != nil {
		return err
	}
	if p != c.Principal {
		return fmt.Errorf("certificate is for %s, these credentials are %s's", p, c.Principal)
	}
	c.cert.Store(&cert)
	return nil
}

// verify checks that cert chains to the CA, is valid now and carries an
// identity of the cluster, and returns it.
func (c *Credentials) verify(cert *tls.Certificate) (pki.Principal, error) {
	leaf := cert.Leaf
	intermediates := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		ic, err := x509.ParseCertificate(der)
		if err != nil {
			return pki.Principal{}, fmt.Errorf("parse intermediate certificate: %w", err)
		}
		intermediates.AddCert(ic)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:         c.CAPool,
		Intermediates: intermediates,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return pki.Principal{}, fmt.Errorf("certificate does not verify against the cluster CA: %w", err)
	}
	p, err := pki.PrincipalFromCert(leaf, c.Cluster)
	if err != nil {
		return pki.Principal{}, fmt.Errorf("certificate identity: %w", err)
	}
	return p, nil
}

// LoadCredentials reads and checks the files named by files.
func LoadCredentials(cluster string, files TLSFiles) (*Credentials, error) {
	if files.CA == "" || files.Cert == "" || files.Key == "" {
		return nil, errors.New("TLS files: the CA, certificate and key paths are all required")
	}
	var pems [3][]byte
	for i, path := range []string{files.CA, files.Cert, files.Key} {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read TLS file: %w", err)
		}
		pems[i] = b
	}
	return NewCredentials(cluster, pems[0], pems[1], pems[2])
}

// NewCredentials parses PEM material and checks it before any connection
// needs it: the certificate must chain to the CA, be valid now, and carry an
// identity of cluster. A process started with the wrong files fails here, with
// a reason, rather than at its first handshake.
func NewCredentials(cluster string, caPEM, certPEM, keyPEM []byte) (*Credentials, error) {
	c, err := newCredentials(cluster, caPEM)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load certificate and key: %w", err)
	}
	if c.Principal, err = c.verify(&cert); err != nil {
		return nil, err
	}
	c.cert.Store(&cert)
	return c, nil
}

// NewSelfSignedCredentials are the credentials of a process that has no
// certificate of the CA yet: a self-signed certificate of key, until Renew
// installs one for p. Servers that admit enrolling nodes take it as
// pki.KindEnrolling; clients that allow it (ClientConfig.AllowSelfSigned)
// take it as an unverified server. Once a certificate installed by Renew
// expires, the self-signed one is presented again.
func NewSelfSignedCredentials(cluster string, caPEM []byte, key ed25519.PrivateKey, p pki.Principal) (*Credentials, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	c, err := newCredentials(cluster, caPEM)
	if err != nil {
		return nil, err
	}
	cert, err := pki.SelfSignedCert(key, enrollingCertValidity)
	if err != nil {
		return nil, err
	}
	c.Principal, c.selfSigned = p, &cert
	c.cert.Store(&cert)
	return c, nil
}

func newCredentials(cluster string, caPEM []byte) (*Credentials, error) {
	if err := pki.ValidateCluster(cluster); err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("CA: no PEM certificate found")
	}
	return &Credentials{Cluster: cluster, CAPool: pool, CAPEM: caPEM}, nil
}
