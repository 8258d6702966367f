// Package reduce is roleserve's control-plane reduce (DESIGN §7, after
// Metropolis' worker_controlplane.go): the bootstrap data, the node's roles
// and the local configuration reduce into one decision — does this node run
// a consensus member, and how. Pure functions, no I/O.
//
//	bootstrap data (bootstrapped, roles confirmed) ─┐
//	roles (ConsensusMember and its join parameters) ─┼─▶ Reduce ─▶ Decision
//	cluster CA, local consensus configured ──────────┘                │
//	                                   decision in force ─▶ Next(in force, new) ─▶ act?
//
// Rules, in order:
//  1. Bootstrap data wins while present: a node that bootstrapped the cluster
//     runs its member from that bootstrap until the curator has confirmed the
//     node's roles once. After that the roles decide — also on the bootstrap
//     node, which is what lets an operator take ConsensusMember away from it
//     (Metropolis left that as a TODO: its bootstrap data lingered forever).
//  2. Roles not known yet (no answer from the curator, none on disk):
//     nothing is decided.
//  3. No ConsensusMember: no control plane.
//  4. ConsensusMember but no local consensus configured: no control plane
//     (the node cannot run one; the reason says so).
//  5. ConsensusMember whose join parameters do not validate (another CA, no
//     voter to join through, no member id or peer URL, a CRL that does not
//     verify): logged by the caller, decides nothing — no start, no stop.
//  6. Otherwise: join with the role's parameters.
//
// Next acts when "this node runs consensus" flips (or on the first
// decision), and when the role names another etcd member than the join
// decision in force: the node was removed from etcd and added again (a new
// learner) while the agent did not see the role absent — it was down or
// cut off from the curator. Unrelated role changes, join parameters sent
// again for the same member, or the bootstrap data giving way to the role
// never restart anything.
package reduce

import (
	"crypto/x509"
	"errors"
	"fmt"

	"buf.build/go/protovalidate"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
)

// Mode is how the local consensus runs.
type Mode int

const (
	// ModeNone: no consensus member on this node.
	ModeNone Mode = iota
	// ModeBootstrap: the member this node bootstrapped the cluster with.
	ModeBootstrap
	// ModeJoin: the member the ConsensusMember role's join parameters name.
	ModeJoin
)

func (m Mode) String() string {
	switch m {
	case ModeNone:
		return "none"
	case ModeBootstrap:
		return "bootstrap"
	case ModeJoin:
		return "join"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Input is everything the decision depends on.
type Input struct {
	// Bootstrapped: this node created the cluster (its enrolment went
	// through bootstrapping) — the bootstrap data.
	Bootstrapped bool
	// RolesConfirmed: the curator has sent this node's record at least
	// once, in this run or an earlier one (persisted). Roles is then the
	// last roles seen.
	RolesConfirmed bool
	// Roles are the node's roles; nil means none.
	Roles *curatorv1.Roles
	// ClusterCAs are the cluster CAs this node trusts (two during a CA
	// rotation).
	ClusterCAs []*x509.Certificate
	// LocalConsensus: a local consensus service is configured.
	LocalConsensus bool
}

// Decision is the reduce's output.
type Decision struct {
	// Decided is false when the input decides nothing (roles unknown, or a
	// role that does not validate): the decision in force stays.
	Decided bool
	// Run: this node runs a consensus member.
	Run bool
	// Mode is how (ModeNone when !Run).
	Mode Mode
	// Join are the role's join parameters (ModeJoin only).
	Join *consensusv1.JoinParameters
	// Reason says why, for a human.
	Reason string
}

// Reduce decides from one input (see the package comment for the rules).
func Reduce(in Input) Decision {
	if in.Bootstrapped && !in.RolesConfirmed {
		if !in.LocalConsensus {
			return Decision{Decided: true, Mode: ModeNone, Reason: "this node bootstrapped the cluster but no local consensus is configured (--consensus)"}
		}
		return Decision{Decided: true, Run: true, Mode: ModeBootstrap, Reason: "bootstrap data: this node bootstrapped the cluster and the curator has not confirmed its roles yet"}
	}
	if !in.RolesConfirmed {
		return Decision{Reason: "this node's roles are not known yet (no answer from the curator, none on disk)"}
	}
	cm := in.Roles.GetConsensusMember()
	if cm == nil {
		return Decision{Decided: true, Mode: ModeNone, Reason: "no ConsensusMember role: not a control-plane node"}
	}
	if !in.LocalConsensus {
		return Decision{Decided: true, Mode: ModeNone, Reason: "ConsensusMember role, but no local consensus is configured (--consensus): this node cannot run a member"}
	}
	if err := ValidateJoin(cm.GetJoin(), in.ClusterCAs); err != nil {
		return Decision{Reason: fmt.Sprintf("ConsensusMember role ignored: %v", err)}
	}
	return Decision{
		Decided: true, Run: true, Mode: ModeJoin, Join: cm.GetJoin(),
		Reason: fmt.Sprintf("ConsensusMember role: member %x joins through %d voter(s)", cm.GetJoin().GetMemberId(), len(cm.GetJoin().GetVoters())),
	}
}

// Next folds a new decision d into the decision in force. It returns the
// decision now in force and whether the launcher must act: when "runs
// consensus" flips, when the first decision is made, or when both are
// joins of different members (MemberChanged). A decision that decides
// nothing keeps the one in force; any other replaces it (mode, join
// parameters, reason) without any action.
func Next(inForce, d Decision) (Decision, bool) {
	if !d.Decided {
		return inForce, false
	}
	if !inForce.Decided {
		return d, true
	}
	return d, inForce.Run != d.Run || MemberChanged(inForce, d)
}

// MemberChanged reports whether two join decisions name different etcd
// members. Only joins are compared: a bootstrap decision names no member
// (the member is the one this node bootstrapped), so the bootstrap data
// giving way to the role is no change.
func MemberChanged(a, b Decision) bool {
	if a.Mode != ModeJoin || b.Mode != ModeJoin {
		return false
	}
	return a.Join.GetMemberId() != b.Join.GetMemberId()
}

// ValidateJoin checks a ConsensusMember role's join parameters: their
// contract (JoinParameters' rules in proto/: a member id, https URLs, a
// voter with a client URL to join through), which the role, read from the
// curator, has not passed through any server's validation; then, against
// the cluster CA, the same CA and a CRL, when present, that the CA signed.
func ValidateJoin(j *consensusv1.JoinParameters, cas []*x509.Certificate) error {
	if j == nil {
		return errors.New("the role carries no join parameters")
	}
	if err := protovalidate.Validate(j); err != nil {
		return fmt.Errorf("join parameters: %w", err)
	}
	if len(cas) == 0 {
		return errors.New("no cluster CA to check the join parameters against")
	}
	roleCAs, err := pki.ParseCertsPEM(j.GetCaCertificate())
	if err != nil {
		return fmt.Errorf("join parameters: CA certificate: %w", err)
	}
	if !pki.SharesCert(roleCAs, cas) {
		return fmt.Errorf("join parameters: CA %q is not this cluster's CA %q", roleCAs[0].Subject, cas[0].Subject)
	}
	if len(j.GetCrl()) > 0 {
		if _, _, err := pki.VerifyCRLOf(j.GetCrl(), cas); err != nil {
			return fmt.Errorf("join parameters: CRL: %w", err)
		}
	}
	return nil
}
