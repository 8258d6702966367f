package rpc

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"

	"curia.dev/platform/pki"
)

// ServerTLSConfig is the TLS configuration of every curia server: TLS 1.3,
// and a client certificate from the cluster CA is required. isRevoked, if not
// nil, is asked about each client certificate; a revoked one fails the
// handshake.
//
// The handshake accepts any certificate of the CA, even one without a usable
// identity: the authorization interceptor then rejects it with
// codes.Unauthenticated and a reason, which is easier to act on than a
// handshake failure.
//
// A server that also admits enrolling nodes (ServerConfig.AllowEnrolling)
// uses enrollingServerTLSConfig instead.
func ServerTLSConfig(creds *Credentials, isRevoked func(*x509.Certificate) bool) *tls.Config {
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: creds.serverCertificate,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      creds.CAPool,
	}
	if isRevoked != nil {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 {
				return errors.New("no verified client certificate")
			}
			return checkRevoked(cs.VerifiedChains[0][0], isRevoked)
		}
	}
	return cfg
}

func checkRevoked(leaf *x509.Certificate, isRevoked func(*x509.Certificate) bool) error {
	if isRevoked != nil && isRevoked(leaf) {
		return fmt.Errorf("client certificate %x (%v) is revoked", leaf.SerialNumber, leaf.URIs)
	}
	return nil
}

// ClientTLSConfig is the TLS configuration of every curia client: TLS 1.3,
// our certificate, and SPIFFE-style verification of the server: its chain must
// lead to the cluster CA and its certificate must carry a principal of the
// cluster, of one of serverKinds if any are given.
//
// The server's hostname is not checked. Servers are reached as compose
// service names, 127.0.0.x addresses of the process cluster, or whatever a
// load balancer hands out, none of which an operator should have to list in
// certificates; what a client needs to know is which principal it talks to,
// and the URI SAN says exactly that. Go's verifier always checks the name, so
// it is switched off and VerifyConnection does the full verification instead.
func ClientTLSConfig(creds *Credentials, serverKinds []pki.Kind) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: creds.clientCertificate,
		// Not insecure: VerifyConnection verifies the chain and identity.
		InsecureSkipVerify: true, //nolint:gosec // see above
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyServer(cs.PeerCertificates, creds.CAPool, creds.Cluster, serverKinds)
		},
	}
}

// serverCertificate and clientCertificate present the current certificate
// (Credentials.Renew) at every handshake.
func (c *Credentials) serverCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.Certificate(), nil
}

func (c *Credentials) clientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return c.Certificate(), nil
}

// verifyServer verifies a server's chain against the cluster CA and its
// principal: of the cluster and, if serverKinds are given, of one of them.
func verifyServer(certs []*x509.Certificate, caPool *x509.CertPool, cluster string, serverKinds []pki.Kind) error {
	if err := verifyChain(certs, caPool, x509.ExtKeyUsageServerAuth); err != nil {
		return fmt.Errorf("server certificate: %w", err)
	}
	p, err := pki.PrincipalFromCert(certs[0], cluster)
	if err != nil {
		return fmt.Errorf("server certificate: %w", err)
	}
	if len(serverKinds) > 0 && !slices.Contains(serverKinds, p.Kind) {
		return fmt.Errorf("server is %s, want one of %v", p, serverKinds)
	}
	return nil
}

// verifyChain verifies a presented chain against the cluster CA as Go's TLS
// stack does.
func verifyChain(certs []*x509.Certificate, caPool *x509.CertPool, usage x509.ExtKeyUsage) error {
	_, err := verifiedChains(certs, caPool, usage, time.Time{})
	return err
}

// verifiedChains is verifyChain at a time (zero: now), returning the
// chains verified.
func verifiedChains(certs []*x509.Certificate, caPool *x509.CertPool, usage x509.ExtKeyUsage, at time.Time) ([][]*x509.Certificate, error) {
	if len(certs) == 0 {
		return nil, errors.New("no certificate presented")
	}
	intermediates := x509.NewCertPool()
	for _, c := range certs[1:] {
		intermediates.AddCert(c)
	}
	return certs[0].Verify(x509.VerifyOptions{
		Roots:         caPool,
		Intermediates: intermediates,
		KeyUsages:     []x509.ExtKeyUsage{usage},
		CurrentTime:   at,
	})
}
