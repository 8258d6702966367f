package rpc

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"

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
type Credentials struct {
	Cluster     string
	CAPool      *x509.CertPool
	CAPEM       []byte
	Certificate tls.Certificate
	// Principal is this process's own identity, read from Certificate.
	Principal pki.Principal
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
	if err := pki.ValidateCluster(cluster); err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("CA: no PEM certificate found")
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load certificate and key: %w", err)
	}
	leaf := cert.Leaf // filled in by X509KeyPair
	intermediates := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("parse intermediate certificate: %w", err)
		}
		intermediates.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:         pool,
		Intermediates: intermediates,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return nil, fmt.Errorf("certificate does not verify against the cluster CA: %w", err)
	}
	p, err := pki.PrincipalFromCert(leaf, cluster)
	if err != nil {
		return nil, fmt.Errorf("certificate identity: %w", err)
	}
	return &Credentials{
		Cluster:     cluster,
		CAPool:      pool,
		CAPEM:       caPEM,
		Certificate: cert,
		Principal:   p,
	}, nil
}
