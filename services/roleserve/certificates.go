package roleserve

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"fmt"
	"time"

	"google.golang.org/grpc"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/backoff"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpcerr"
)

// The agent keeps the node's certificates fresh (DESIGN §2): its own node
// certificate, and its consensus process's, which that process cannot get
// itself: it holds no identity the curators know until the agent installs
// one. Every check (each --renew-check, and when the roles change):
//
//	role names a member certificate newer than the local one  → install it (SetCredentials)
//	consensus certificate missing, of another key, or 2/3 of its life gone,
//	node certificate 2/3 gone, member certificate (with the role) 2/3 gone,
//	or any of them not of the CA that signs the CRL (the curators' CA: a CA
//	rotation switched them to a new one)
//	                                → Curator/IssueCertificates with the consensus process's key,
//	                                  then use the node certificate and install the others
//
// A renewed certificate is used by every new connection at once (TLS
// certificate getters); the one it replaces stays valid until it expires.

// renewDue reports whether two thirds of c's life are gone, or c is not of
// issuer (the CA that signs the CRL; nil: not known yet).
func renewDue(c *x509.Certificate, now time.Time, issuer *x509.Certificate) bool {
	if issuer != nil && c.CheckSignatureFrom(issuer) != nil {
		return true
	}
	return now.After(c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3))
}

// certificates keeps the certificates fresh until ctx ends.
func (s *Service) certificates(ctx context.Context) error {
	if !waitFor(ctx, s.enrolled) {
		return nil
	}
	log := s.log.With("part", "certificates")
	bo := backoff.New(retryMin, s.cfg.RetryMax)
	var lastErr string
	for {
		wait := s.cfg.RenewCheck
		if err := s.keepCertificates(ctx); err != nil {
			if err.Error() != lastErr {
				log.Warn("certificates not renewed; retrying", "err", err)
				lastErr = err.Error()
			}
			wait = min(wait, bo.Next())
		} else {
			lastErr = ""
			bo = backoff.New(retryMin, s.cfg.RetryMax)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		case <-s.certKick:
		}
	}
}

// keepCertificates does one check.
func (s *Service) keepCertificates(ctx context.Context) error {
	now, issuer := time.Now(), s.crl.Issuer()
	s.connMu.Lock()
	creds := s.creds
	s.connMu.Unlock()
	need := renewDue(creds.Leaf(), now, issuer)
	var st *consensusv1.StatusResponse
	if s.cfg.Consensus != "" {
		var err error
		if st, err = s.localConsensusStatus(ctx); err != nil {
			return err
		}
		if err := s.installRoleMember(ctx, st); err != nil {
			return err
		}
		if st, err = s.localConsensusStatus(ctx); err != nil {
			return err
		}
		api, _ := pki.ParseCertPEM(st.GetCertificate())
		need = need || api == nil || !ofKey(api, st.GetPublicKey()) || renewDue(api, now, issuer)
		if s.roles().GetConsensusMember() != nil {
			member, _ := pki.ParseCertPEM(st.GetMemberCertificate())
			need = need || member == nil || renewDue(member, now, issuer)
		}
	}
	if !need {
		return nil
	}
	cur, err := s.curatorClient()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := cur.IssueCertificates(cctx, &curatorv1.IssueCertificatesRequest{ConsensusPublicKey: st.GetPublicKey()})
	if rpcerr.Is(err, rpcerr.Exhausted) {
		return nil // issued a moment ago; the next check installs what is due
	}
	if err != nil {
		return fmt.Errorf("issue certificates: %w", err)
	}
	if err := s.renewNodeCertificate(resp.GetNodeCertificate()); err != nil {
		return err
	}
	if st == nil || len(resp.GetConsensusCertificate()) == 0 {
		return nil
	}
	return s.install(ctx, &consensusv1.SetCredentialsRequest{Certificate: resp.GetConsensusCertificate(), MemberCertificate: resp.GetMemberCertificate()})
}

// renewNodeCertificate makes certPEM the agent's node certificate: stored,
// and presented by every new connection.
func (s *Service) renewNodeCertificate(certPEM []byte) error {
	keyPEM, err := pki.MarshalEd25519PEM(s.key)
	if err != nil {
		return err
	}
	c, err := checkNodeCreds(s.cfg.Cluster, s.caPEM, certPEM, keyPEM, s.id)
	if err != nil {
		return fmt.Errorf("the node certificate IssueCertificates issued: %w", err)
	}
	if err := s.files.storeNodeCreds(c); err != nil {
		return err
	}
	s.connMu.Lock()
	if err := s.creds.Renew(certPEM, keyPEM); err != nil {
		s.connMu.Unlock()
		return err
	}
	// Open connections keep the certificate they began with, which
	// servers refuse once it expires: the next call dials anew.
	old := []*grpc.ClientConn{s.curator, s.consensus}
	s.curator, s.consensus = nil, nil
	s.connMu.Unlock()
	for _, cc := range old {
		if cc != nil {
			cc.Close()
		}
	}
	s.log.Info("node certificate renewed", "serial", c.creds.Leaf().SerialNumber.Text(16), "expires", c.creds.Leaf().NotAfter)
	return nil
}

// installRoleMember installs the member certificate the ConsensusMember role
// carries when the local consensus (status st) should use it instead of its
// own (roleMemberDue): the certificate issued with the role, before the
// member starts.
func (s *Service) installRoleMember(ctx context.Context, st *consensusv1.StatusResponse) error {
	roleCert := s.roles().GetConsensusMember().GetMemberCertificate()
	if !roleMemberDue(roleCert, st.GetMemberCertificate(), st.GetPublicKey(), time.Now()) {
		return nil
	}
	return s.install(ctx, &consensusv1.SetCredentialsRequest{MemberCertificate: roleCert})
}

// roleMemberDue reports whether the role's member certificate (PEM) should
// replace the one the local consensus holds (installed; its key is pub):
// the role's is of that key and valid, and the installed one is missing, of
// another key, or issued before the role's. Issued, not expiring:
// certificates end at the CA's expiry at the latest, so the certificate of
// a member removed and the one of the member given back (revoked and fresh)
// can expire at the same instant. A renewal the agent installed since is
// issued after the role's, and stays. A role certificate of another key (a
// consensus process made anew) or expired is never installed: the agent
// asks IssueCertificates instead.
func roleMemberDue(role, installed, pub []byte, now time.Time) bool {
	if len(role) == 0 || bytes.Equal(role, installed) {
		return false
	}
	fromRole, err := pki.ParseCertPEM(role)
	if err != nil || !ofKey(fromRole, pub) || now.After(fromRole.NotAfter) {
		return false
	}
	have, err := pki.ParseCertPEM(installed)
	return err != nil || !ofKey(have, pub) || have.NotBefore.Before(fromRole.NotBefore)
}

// install hands certificates to the local consensus.
func (s *Service) install(ctx context.Context, req *consensusv1.SetCredentialsRequest) error {
	cons, err := s.localConsensus()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if _, err := cons.SetCredentials(cctx, req); err != nil {
		return fmt.Errorf("install certificates in the local consensus: %w", err)
	}
	s.log.Info("certificates installed in the local consensus", "consensus", len(req.GetCertificate()) > 0, "member", len(req.GetMemberCertificate()) > 0)
	signal(s.statusKick)
	return nil
}

// roles are the node's roles as last seen.
func (s *Service) roles() *curatorv1.Roles {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.node.GetRoles()
}

// ofKey reports whether c certifies pub.
func ofKey(c *x509.Certificate, pub []byte) bool {
	k, ok := c.PublicKey.(ed25519.PublicKey)
	return ok && bytes.Equal(k, pub)
}
