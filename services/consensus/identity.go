package consensus

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"curia.dev/platform/crl"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// identity is this process's key and the two certificates of it that the
// node's agent gets from the curator (DESIGN §2):
//
//	consensus/<node-id>  the API's identity (every node has one, workers too); etcd refuses it
//	member/<node-id>     the etcd member's: etcd's ports and this process's etcd client;
//	                     only while the node holds ConsensusMember
//
// Until it has a consensus certificate, the API serves with a self-signed
// certificate of the key, which only the node's own agent accepts (to
// install the certificates). Files, in the data directory unless flags name
// the deployment's (the bootstrap node's):
//
//	identity.key    the ed25519 key (0600), made on the first start (--key)
//	consensus.crt   the consensus certificate (--cert on the first start)
//	member.crt      the member certificate (--member-cert on the first start); Leave removes it
type identity struct {
	cluster string
	nodeID  string
	dir     string
	keyPath string
	key     ed25519.PrivateKey
	keyPEM  []byte
	crl     *crl.Watcher

	// api is the API's credentials: self-signed until a consensus
	// certificate is installed, then renewed in place.
	api *rpc.Credentials

	mu sync.Mutex
	// member is the member certificate's credentials (nil without one).
	member *rpc.Credentials
}

func (id *identity) apiCertPath() string    { return filepath.Join(id.dir, "consensus.crt") }
func (id *identity) memberCertPath() string { return filepath.Join(id.dir, "member.crt") }

// loadIdentity loads (or makes) the key and the certificates on disk,
// taking the deployment's certificates (cfg.TLS.Cert, cfg.MemberCert) when
// the data directory has none yet.
func loadIdentity(cfg Config, revocations *crl.Watcher, log *slog.Logger) (*identity, error) {
	caPEM, err := os.ReadFile(cfg.TLS.CA)
	if err != nil {
		return nil, fmt.Errorf("read --ca: %w", err)
	}
	id := &identity{cluster: cfg.Cluster, nodeID: cfg.nodeID, dir: cfg.DataDir, keyPath: cfg.TLS.Key, crl: revocations}
	if id.keyPath == "" {
		id.keyPath = filepath.Join(cfg.DataDir, "identity.key")
		if _, err := os.Stat(id.keyPath); errors.Is(err, os.ErrNotExist) {
			key, err := pki.NewNodeKey()
			if err != nil {
				return nil, err
			}
			b, err := pki.MarshalEd25519PEM(key)
			if err != nil {
				return nil, err
			}
			if err := pki.WriteFileAtomic(id.keyPath, b, pki.KeyFileMode); err != nil {
				return nil, fmt.Errorf("store the consensus key: %w", err)
			}
		}
	}
	if id.keyPEM, err = os.ReadFile(id.keyPath); err != nil {
		return nil, fmt.Errorf("read the consensus key: %w", err)
	}
	if id.key, err = pki.ParseEd25519PEM(id.keyPEM); err != nil {
		return nil, fmt.Errorf("the consensus key %s: %w", id.keyPath, err)
	}
	if id.api, err = rpc.NewSelfSignedCredentials(cfg.Cluster, caPEM, id.key, id.principal(pki.KindConsensus)); err != nil {
		return nil, err
	}
	for _, c := range []struct {
		kind         pki.Kind
		path, seeded string
	}{{pki.KindConsensus, id.apiCertPath(), cfg.TLS.Cert}, {pki.KindMember, id.memberCertPath(), cfg.MemberCert}} {
		certPEM, err := os.ReadFile(c.path)
		if errors.Is(err, os.ErrNotExist) && c.seeded != "" {
			certPEM, err = os.ReadFile(c.seeded)
		}
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := id.load(c.kind, certPEM, log); err != nil {
			return nil, fmt.Errorf("%s certificate: %w", c.kind, err)
		}
	}
	return id, nil
}

// load takes a certificate from disk at start. One the CRL revokes, or
// that expired, does not stop the process, which would then restart in a
// loop (a deleted node's, after a reboot): the API serves with its
// self-signed certificate until the agent installs a fresh one, and a
// revoked member certificate is kept only so that etcd is not restarted
// with it (runMember). A certificate of another key stops it: the data
// directory is not this process's.
func (id *identity) load(kind pki.Kind, certPEM []byte, log *slog.Logger) error {
	cert, err := pki.ParseCertPEM(certPEM)
	if err != nil {
		return fmt.Errorf("%w: %v", errBadRequest, err)
	}
	revoked, expired := id.crl.IsRevoked(cert), time.Now().After(cert.NotAfter)
	switch {
	case !revoked && !expired:
		return id.set(kind, certPEM)
	case kind == pki.KindMember && revoked:
		if err := id.use(kind, certPEM, true); err != nil {
			return err
		}
		log.Warn("the member certificate on disk is revoked: etcd will not restart with it", "serial", cert.SerialNumber.Text(16))
	default:
		log.Warn("a certificate on disk is revoked or expired and not used; the node's agent installs a fresh one", "kind", string(kind), "serial", cert.SerialNumber.Text(16), "revoked", revoked, "expired", expired)
	}
	return nil
}

func (id *identity) principal(k pki.Kind) pki.Principal {
	return pki.Principal{Kind: k, Name: id.nodeID}
}

// set checks a certificate of this process's key for kind (consensus or
// member), stores it and uses it from now on: SetCredentials, and load for
// a certificate on disk that is neither revoked nor expired.
func (id *identity) set(kind pki.Kind, certPEM []byte) error { return id.use(kind, certPEM, false) }

// use is set; with revokedOK a revoked member certificate passes (load
// keeps one so that etcd is not restarted with it).
func (id *identity) use(kind pki.Kind, certPEM []byte, revokedOK bool) error {
	cert, err := pki.ParseCertPEM(certPEM)
	if err != nil {
		return fmt.Errorf("%w: %v", errBadRequest, err)
	}
	if pub, ok := cert.PublicKey.(ed25519.PublicKey); !ok || !pub.Equal(id.key.Public()) {
		return fmt.Errorf("%w: the %s certificate %x is not of this process's key", errBadRequest, kind, cert.SerialNumber)
	}
	if id.crl.IsRevoked(cert) && !revokedOK {
		return fmt.Errorf("%w: the %s certificate %x is revoked", errBadRequest, kind, cert.SerialNumber)
	}
	path := id.apiCertPath()
	if kind == pki.KindMember {
		path = id.memberCertPath()
	}
	if kind == pki.KindConsensus {
		if err := id.api.Renew(certPEM, id.keyPEM); err != nil {
			return fmt.Errorf("%w: the consensus certificate: %v", errBadRequest, err)
		}
	} else {
		creds, err := rpc.NewCredentials(id.cluster, id.api.CAPEM, certPEM, id.keyPEM)
		if err != nil {
			return fmt.Errorf("%w: the member certificate: %v", errBadRequest, err)
		}
		if creds.Principal != id.principal(pki.KindMember) {
			return fmt.Errorf("%w: the member certificate is for %s, this is %s", errBadRequest, creds.Principal, id.principal(pki.KindMember))
		}
		id.mu.Lock()
		id.member = creds
		id.mu.Unlock()
	}
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, certPEM) {
		return nil
	}
	return pki.WriteFileAtomic(path, certPEM, pki.CertFileMode)
}

// memberCreds are the member certificate's credentials, or an error that
// says how to get one.
func (id *identity) memberCreds() (*rpc.Credentials, error) {
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.member == nil {
		return nil, fmt.Errorf("%w: this node has no member certificate: its agent installs the one that comes with the ConsensusMember role (SetCredentials)", errRefused)
	}
	if now := time.Now(); now.After(id.member.Leaf().NotAfter) {
		return nil, fmt.Errorf("%w: the member certificate expired at %v: the node's agent renews it (Curator/IssueCertificates)", errRefused, id.member.Leaf().NotAfter)
	}
	return id.member, nil
}

// memberRevoked reports whether the member certificate is on the CRL.
func (id *identity) memberRevoked() bool {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.member != nil && id.crl.IsRevoked(id.member.Leaf())
}

// dropMember forgets the member certificate (Leave: the member is gone, its
// certificate revoked with the role).
func (id *identity) dropMember() error {
	id.mu.Lock()
	id.member = nil
	id.mu.Unlock()
	if err := os.Remove(id.memberCertPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// pems are the installed certificates (PEM; nil when none), for Status.
func (id *identity) pems() (api, member []byte) {
	if !id.api.SelfSigned() {
		api = pki.EncodeCertPEM(id.api.Certificate().Certificate[0])
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.member != nil {
		member = pki.EncodeCertPEM(id.member.Certificate().Certificate[0])
	}
	return api, member
}

// notAfter is when the certificate of kind expires (zero without one).
func (id *identity) notAfter(kind pki.Kind) time.Time {
	if kind == pki.KindConsensus {
		return id.api.Leaf().NotAfter
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.member == nil {
		return time.Time{}
	}
	return id.member.Leaf().NotAfter
}

// coversHost reports whether the member certificate names host (the peer
// URL's), so that peers can bind it to this member's address.
func coversHost(creds *rpc.Credentials, host string) error {
	if err := creds.Leaf().VerifyHostname(host); err != nil {
		var he x509.HostnameError
		if errors.As(err, &he) {
			return fmt.Errorf("%w: the member certificate does not name this member's peer host %s (it names %v %v): the curator issues it for the node's reported consensus URLs", errRefused, host, creds.Leaf().DNSNames, creds.Leaf().IPAddresses)
		}
		return err
	}
	return nil
}
