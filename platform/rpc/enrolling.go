package rpc

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"curia.dev/platform/pki"
	"google.golang.org/grpc"
)

// Enrolling nodes (ServerConfig.AllowEnrolling) have no certificate of the
// CA yet: they present a self-signed certificate of their ed25519 identity
// key (pki.SelfSignedCert) and are pki.KindEnrolling principals named by
// their node id. Anyone can make such a key, so the policy gives them only
// the methods that allow pki.KindEnrolling; not even health or reflection.

// enrollingCertValidity is the validity of DialEnrolling's certificate. It
// serves the connection's whole life, reconnections included, and a
// self-signed certificate proves nothing but possession of the key, which
// the handshake proves anyway: so it is long.
const enrollingCertValidity = 365 * 24 * time.Hour

// enrollingServerTLSConfig is ServerTLSConfig for a server that also admits
// enrolling nodes. Go's TLS stack can require a certificate of the CA or any
// certificate, nothing in between, so it requires any and VerifyConnection
// applies the verifier's principal. No client CAs are announced: a Go
// client offers no certificate of an issuer the server does not name.
func enrollingServerTLSConfig(v *clientVerifier) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: v.creds.serverCertificate,
		ClientAuth:     tls.RequireAnyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := v.principal(cs.PeerCertificates)
			if errors.Is(err, pki.ErrNoIdentity) {
				// A certificate of the CA without a usable identity: the
				// authorizer rejects it with the reason (see
				// ServerTLSConfig).
				return nil
			}
			return err
		},
	}
}

// clientVerifier tells a client's principal for one server, remembering
// the chains of the CA it verified. Every call of a connection presents
// the same certificates, and verifying their chain again costs a signature
// check of the CA's each time: about 7% of the curator's CPU in
// BenchmarkRoleUpdates. A remembered chain skips the signatures alone; the
// validity of every certificate in it and the leaf's revocation are
// checked on every call, as before.
type clientVerifier struct {
	creds     *Credentials
	isRevoked func(*x509.Certificate) bool
	now       func() time.Time // for what is remembered (a test's clock)

	mu       sync.Mutex
	verified map[[sha256.Size]byte]verifiedChain
}

// verifiedChain is a chain of the CA verified once: its principal and the
// time every certificate in it is valid.
type verifiedChain struct {
	who                 pki.Principal
	notBefore, notAfter time.Time
}

// maxVerifiedChains bounds clientVerifier's memory: past it, it forgets
// them all (each connection's next call verifies its chain again).
const maxVerifiedChains = 4096

func newClientVerifier(creds *Credentials, isRevoked func(*x509.Certificate) bool) *clientVerifier {
	return &clientVerifier{creds: creds, isRevoked: isRevoked, now: time.Now, verified: map[[sha256.Size]byte]verifiedChain{}}
}

// principal verifies a client's certificates on a server that admits
// enrolling nodes, at the handshake and again for every call (Go's TLS stack
// records no verified chain for RequireAnyClientCert). A chain of the cluster
// CA is verified as ServerTLSConfig does, revocation included, and its leaf's
// URI SAN is the principal (or an error wrapping pki.ErrNoIdentity).
// Anything else must be exactly one self-signed certificate of an ed25519
// key, valid now: an enrolling node.
func (v *clientVerifier) principal(certs []*x509.Certificate) (pki.Principal, error) {
	h := sha256.New()
	for _, c := range certs {
		h.Write(c.Raw)
	}
	var key [sha256.Size]byte
	h.Sum(key[:0])
	now := v.now()
	v.mu.Lock()
	vc, ok := v.verified[key]
	v.mu.Unlock()
	if ok && !now.Before(vc.notBefore) && !now.After(vc.notAfter) {
		if err := checkRevoked(certs[0], v.isRevoked); err != nil {
			return pki.Principal{}, err
		}
		return vc.who, nil
	}
	chains, chainErr := verifiedChains(certs, v.creds.CAPool, x509.ExtKeyUsageClientAuth, now)
	who, err := clientPrincipal(certs, v.creds, v.isRevoked, chainErr)
	if chainErr != nil || err != nil {
		return who, err
	}
	vc = verifiedChain{who: who, notBefore: certs[0].NotBefore, notAfter: certs[0].NotAfter}
	for _, c := range chains[0] {
		if c.NotBefore.After(vc.notBefore) {
			vc.notBefore = c.NotBefore
		}
		if c.NotAfter.Before(vc.notAfter) {
			vc.notAfter = c.NotAfter
		}
	}
	v.mu.Lock()
	if len(v.verified) >= maxVerifiedChains {
		clear(v.verified)
	}
	v.verified[key] = vc
	v.mu.Unlock()
	return who, nil
}

// clientPrincipal is principal's answer once the chain of the CA was
// verified (chainErr nil) or not.
func clientPrincipal(certs []*x509.Certificate, creds *Credentials, isRevoked func(*x509.Certificate) bool, chainErr error) (pki.Principal, error) {
	if chainErr == nil {
		if err := checkRevoked(certs[0], isRevoked); err != nil {
			return pki.Principal{}, err
		}
		return pki.PrincipalFromCert(certs[0], creds.Cluster)
	}
	if len(certs) == 0 {
		return pki.Principal{}, chainErr
	}
	if certs[0].CheckSignature(certs[0].SignatureAlgorithm, certs[0].RawTBSCertificate, certs[0].Signature) != nil {
		return pki.Principal{}, chainErr // neither the CA's nor self-signed
	}
	pub, err := selfSigned(certs)
	if err != nil {
		return pki.Principal{}, err
	}
	return pki.Principal{Kind: pki.KindEnrolling, Name: pki.NodeID(pub)}, nil
}

// selfSigned checks that certs are exactly one self-signed certificate of
// an ed25519 key, valid now, and returns the key.
func selfSigned(certs []*x509.Certificate) (ed25519.PublicKey, error) {
	if len(certs) != 1 {
		return nil, fmt.Errorf("%d certificates, want one self-signed certificate alone", len(certs))
	}
	leaf := certs[0]
	if err := leaf.CheckSignature(leaf.SignatureAlgorithm, leaf.RawTBSCertificate, leaf.Signature); err != nil {
		return nil, fmt.Errorf("not self-signed: %w", err)
	}
	pub, ok := leaf.PublicKey.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("self-signed certificate has a %v key, want ed25519", leaf.PublicKeyAlgorithm)
	}
	if now := time.Now(); now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("self-signed certificate is valid from %v to %v, not now", leaf.NotBefore, leaf.NotAfter)
	}
	return pub, nil
}

// DialEnrolling is Dial for a node without a certificate of the CA: it
// presents a self-signed certificate of key (pki.SelfSignedCert) and verifies
// the server as Dial does, against the cluster CA (caPEM) and, if given,
// serverKinds. Only servers with ServerConfig.AllowEnrolling accept it.
func DialEnrolling(target string, caPEM []byte, key ed25519.PrivateKey, serverKinds []pki.Kind) (*grpc.ClientConn, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("CA: no PEM certificate found")
	}
	cert, err := pki.SelfSignedCert(key, enrollingCertValidity)
	if err != nil {
		return nil, err
	}
	return dial(target, enrollingClientTLSConfig(cert, pool, serverKinds), ClientConfig{})
}

// enrollingClientTLSConfig is ClientTLSConfig for a node that knows the
// cluster CA but not necessarily the cluster's name: the server's trust
// domain is the one in its certificate, which must chain to the CA. One CA
// serves one cluster (DESIGN §2), so the CA vouches for the name; every other
// check is verifyServer's, as for any client.
func enrollingClientTLSConfig(cert tls.Certificate, caPool *x509.CertPool, serverKinds []pki.Kind) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		// Not insecure: VerifyConnection verifies the chain and identity.
		InsecureSkipVerify: true, //nolint:gosec // see ClientTLSConfig
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyServer(cs.PeerCertificates, caPool, trustDomain(cs.PeerCertificates), serverKinds)
		},
	}
}

// trustDomain is the host of the leaf's first spiffe:// URI SAN if it is a
// valid cluster name (no port, for one), else ""; pki.PrincipalFromCert
// checks the rest.
func trustDomain(certs []*x509.Certificate) string {
	if len(certs) == 0 {
		return ""
	}
	for _, u := range certs[0].URIs {
		if u.Scheme == "spiffe" && pki.ValidateCluster(u.Host) == nil {
			return u.Host
		}
	}
	return ""
}
