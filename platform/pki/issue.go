package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"net/url"
	"slices"
	"time"
)

// IssueRequest describes one certificate to issue.
type IssueRequest struct {
	Cluster   string
	Principal Principal
	// DNSNames and IPs are extra SANs for certificates that serve.
	DNSNames []string
	IPs      []net.IP
	// PublicKey is the key to certify. When nil, Issue generates an ECDSA
	// P-256 key and returns it in Issued.KeyPEM.
	PublicKey crypto.PublicKey
	Validity  time.Duration
}

// Issued is an issued certificate.
type Issued struct {
	Cert    *x509.Certificate
	CertPEM []byte
	// KeyPEM is the generated private key (PKCS#8); nil when the request
	// brought its own PublicKey.
	KeyPEM []byte
}

// Issue issues a leaf certificate for req.Principal. The certificate's only
// identity is its URI SAN; the CommonName is the principal's kind for etcd's
// CN-based checks. A validity reaching past the CA's own expiry is cut to it,
// since the chain stops verifying then anyway.
func (ca *CA) Issue(req IssueRequest) (*Issued, error) {
	if err := ca.check(); err != nil {
		return nil, err
	}
	if err := ValidateCluster(req.Cluster); err != nil {
		return nil, err
	}
	if err := req.Principal.Validate(); err != nil {
		return nil, err
	}
	if req.Validity <= 0 {
		return nil, fmt.Errorf("issue %s: validity %v must be positive", req.Principal, req.Validity)
	}
	for _, name := range req.DNSNames {
		if name == "" {
			return nil, fmt.Errorf("issue %s: empty DNS name", req.Principal)
		}
	}
	for _, ip := range req.IPs {
		if len(ip) != net.IPv4len && len(ip) != net.IPv6len {
			return nil, fmt.Errorf("issue %s: invalid IP address %v", req.Principal, ip)
		}
	}
	now := time.Now()
	notAfter := now.Add(req.Validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	if !notAfter.After(now) {
		return nil, fmt.Errorf("issue %s: CA expired at %v", req.Principal, ca.Cert.NotAfter)
	}

	pub := req.PublicKey
	var keyPEM []byte
	if pub == nil {
		key, err := newLeafKey()
		if err != nil {
			return nil, fmt.Errorf("issue %s: generate key: %w", req.Principal, err)
		}
		if keyPEM, err = MarshalPrivateKeyPEM(key); err != nil {
			return nil, fmt.Errorf("issue %s: %w", req.Principal, err)
		}
		pub = key.Public()
	}
	if publicKeysEqual(pub, ca.Cert.PublicKey) {
		return nil, fmt.Errorf("issue %s: refusing to certify the CA's own key", req.Principal)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	skid, err := subjectKeyID(pub)
	if err != nil {
		return nil, fmt.Errorf("issue %s: %w", req.Principal, err)
	}
	usage := x509.KeyUsageDigitalSignature
	if _, ok := pub.(*rsa.PublicKey); ok {
		// Only RSA keys encrypt (TLS 1.2 RSA key exchange); on any other key
		// the bit is meaningless and strict verifiers reject it.
		usage |= x509.KeyUsageKeyEncipherment
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: string(req.Principal.Kind)},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     notAfter,
		KeyUsage:     usage,
		// Both, always: etcd peers and curia services dial with the same
		// certificate they serve with.
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{req.Principal.URI(req.Cluster)},
		DNSNames:              slices.Clone(req.DNSNames),
		IPAddresses:           slices.Clone(req.IPs),
		SubjectKeyId:          skid,
		AuthorityKeyId:        ca.Cert.SubjectKeyId,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("issue %s: %w", req.Principal, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("issue %s: parse certificate: %w", req.Principal, err)
	}
	// Belt and braces: what we hand out must map back to what was asked for.
	got, err := PrincipalFromCert(cert, req.Cluster)
	if err != nil {
		return nil, fmt.Errorf("issue %s: certificate maps back to no principal: %w", req.Principal, err)
	}
	if got != req.Principal {
		return nil, fmt.Errorf("issue %s: certificate maps back to %q", req.Principal, got)
	}
	return &Issued{Cert: cert, CertPEM: EncodeCertPEM(der), KeyPEM: keyPEM}, nil
}
