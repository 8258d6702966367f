package pki

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Kind is the kind of a principal: what a certificate's holder is.
type Kind string

// The principal kinds of DESIGN §2. Consensus is the identity of a node's
// consensus process towards curia (its API; every node has one, workers
// too); etcd's ports refuse it. Member is the identity of a node's etcd
// member: the only node-side identity that etcd's ports accept, issued by
// the curator only while the node holds ConsensusMember and revoked when the
// role goes, so that a worker holds nothing that reaches etcd.
const (
	KindAdmin      Kind = "admin"
	KindCurator    Kind = "curator"
	KindReconciler Kind = "reconciler"
	KindNode       Kind = "node"
	KindConsensus  Kind = "consensus"
	KindMember     Kind = "member"
)

// KindEnrolling is a node that has no certificate of the CA yet and
// registers with the curator using a self-signed certificate of its ed25519
// identity key (SelfSignedCert); its Name is NodeID of that key. It proves
// only that the caller holds the key, which anyone can generate: servers admit
// it only when asked to (rpc.ServerConfig.AllowEnrolling) and only to methods
// that allow it.
//
// It is never a certificate identity: Validate, ParsePrincipal,
// PrincipalFromURI and PrincipalFromCert refuse it, so the CA never issues
// it and a URI SAN never carries it. ParseForwarded accepts it.
const KindEnrolling Kind = "enrolling"

// Named reports whether principals of this kind carry a name
// (admin/<name>, node/<id>, consensus/<node-id>, member/<node-id>,
// enrolling/<node-id>).
func (k Kind) Named() bool {
	return k == KindAdmin || k == KindNode || k == KindConsensus || k == KindMember || k == KindEnrolling
}

// valid reports whether k is a kind of certificate identity.
func (k Kind) valid() bool {
	switch k {
	case KindAdmin, KindCurator, KindReconciler, KindNode, KindConsensus, KindMember:
		return true
	}
	return false
}

// Principal is a verified identity: who is on the other end of a connection.
type Principal struct {
	Kind Kind
	// Name is the admin's name or the node id; empty for curator and reconciler.
	Name string
}

// String renders the principal as its SPIFFE path without the trust domain,
// e.g. "node/node-0123…", "curator".
func (p Principal) String() string {
	if p.Name == "" {
		return string(p.Kind)
	}
	return string(p.Kind) + "/" + p.Name
}

// URI is the principal's SPIFFE ID in the given cluster (trust domain).
func (p Principal) URI(cluster string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: cluster, Path: "/" + p.String()}
}

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,62}[a-z0-9])?$`)
	nodeIDRE  = regexp.MustCompile(`^node-[0-9a-f]{32}$`)
	clusterRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,62}[a-z0-9])?$`)
)

// ValidateCluster checks a cluster name (the SPIFFE trust domain).
func ValidateCluster(cluster string) error {
	if !clusterRE.MatchString(cluster) {
		return fmt.Errorf("cluster name %q: want lower-case letters, digits, '.' and '-', at most 64 characters", cluster)
	}
	return nil
}

// Validate checks that the principal is a well-formed certificate identity.
// It refuses KindEnrolling, which no certificate of the CA carries.
func (p Principal) Validate() error {
	if p.Kind == KindEnrolling {
		return fmt.Errorf("%s principals are not certificate identities: nodes present them with a self-signed certificate, the CA never issues them", KindEnrolling)
	}
	if !p.Kind.valid() {
		return fmt.Errorf("unknown principal kind %q", p.Kind)
	}
	if !p.Kind.Named() {
		if p.Name != "" {
			return fmt.Errorf("principal kind %q takes no name, got %q", p.Kind, p.Name)
		}
		return nil
	}
	switch p.Kind {
	case KindNode, KindConsensus, KindMember:
		if !nodeIDRE.MatchString(p.Name) {
			return fmt.Errorf("%s principal: %q is not a node id (node-<32 hex digits>)", p.Kind, p.Name)
		}
	default:
		if !nameRE.MatchString(p.Name) {
			return fmt.Errorf("%s principal: name %q: want lower-case letters, digits, '.' and '-'", p.Kind, p.Name)
		}
	}
	return nil
}

// ErrNoIdentity is returned when a certificate carries no usable curia identity.
var ErrNoIdentity = errors.New("certificate carries no curia identity")

// ParsePrincipal parses "kind" or "kind/name" (the String form) of a
// certificate identity. Like Validate, it refuses enrolling principals.
func ParsePrincipal(s string) (Principal, error) {
	kind, name, slash := strings.Cut(s, "/")
	if slash && name == "" {
		// "curator/" would otherwise pass as "curator".
		return Principal{}, fmt.Errorf("principal %q: empty name after '/'", s)
	}
	p := Principal{Kind: Kind(kind), Name: name}
	if err := p.Validate(); err != nil {
		return Principal{}, err
	}
	return p, nil
}

// ParseForwarded parses the String form of any principal, enrolling ones
// included: the form in which a curator follower forwards its caller to the
// leader (rpc.ForwardedContext). It is not for certificates; they go through
// PrincipalFromCert.
func ParseForwarded(s string) (Principal, error) {
	name, ok := strings.CutPrefix(s, string(KindEnrolling)+"/")
	if !ok {
		return ParsePrincipal(s)
	}
	if !nodeIDRE.MatchString(name) {
		return Principal{}, fmt.Errorf("%s principal: %q is not a node id (node-<32 hex digits>)", KindEnrolling, name)
	}
	return Principal{Kind: KindEnrolling, Name: name}, nil
}

// PrincipalFromURI parses a SPIFFE ID of the given cluster. It refuses
// enrolling principals (see KindEnrolling).
func PrincipalFromURI(u *url.URL, cluster string) (Principal, error) {
	if u.Scheme != "spiffe" {
		return Principal{}, fmt.Errorf("%w: URI %q is not a spiffe:// ID", ErrNoIdentity, u)
	}
	if u.Host != cluster {
		return Principal{}, fmt.Errorf("%w: URI %q belongs to cluster %q, not %q", ErrNoIdentity, u, u.Host, cluster)
	}
	p, err := ParsePrincipal(strings.TrimPrefix(u.Path, "/"))
	if err != nil {
		return Principal{}, fmt.Errorf("%w: %v", ErrNoIdentity, err)
	}
	// Only the canonical spelling is an identity: a port, user info, query,
	// fragment or percent-encoding would let two different URIs name the
	// same principal, and other SPIFFE consumers reject them anyway.
	if want := p.URI(cluster).String(); u.String() != want {
		return Principal{}, fmt.Errorf("%w: URI %q is not in canonical form %q", ErrNoIdentity, u, want)
	}
	return p, nil
}

// PrincipalFromCert maps a verified peer certificate to its principal. It
// requires exactly one spiffe:// URI SAN, of the given cluster. This is the one
// function that turns certificates into identities (DESIGN §2).
func PrincipalFromCert(cert *x509.Certificate, cluster string) (Principal, error) {
	var found []*url.URL
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" {
			found = append(found, u)
		}
	}
	switch len(found) {
	case 0:
		return Principal{}, fmt.Errorf("%w: no spiffe:// URI SAN", ErrNoIdentity)
	case 1:
		return PrincipalFromURI(found[0], cluster)
	default:
		return Principal{}, fmt.Errorf("%w: %d spiffe:// URI SANs, want exactly one", ErrNoIdentity, len(found))
	}
}

// NodeID derives a node's id from its ed25519 public key: "node-" and the hex
// of the key's first 16 bytes (as in Metropolis). It never changes. pub must
// be a whole ed25519 public key.
func NodeID(pub ed25519.PublicKey) string {
	return "node-" + hex.EncodeToString(pub[:16])
}
