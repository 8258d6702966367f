// Package roles is the curator's role decision: which roles a node's record
// gets, from the record and what is asked of it. It owns that decision for
// both writers of roles, so that they cannot drift apart:
//
//   - an operator's UpdateNodeRoles: Plan before the etcd membership step,
//     Update on every attempt of the role write after it (the record is read
//     again each time; Update decides again from it);
//   - the reconciler's ReconcileNodeRoles: Reconcile, which adds or removes
//     ConsensusMember as etcd membership says.
//
// Both build the roles with Desired and hold the one invariant, Valid:
// KubernetesController requires ConsensusMember.
//
// It is pure: no etcd, no clock, no I/O. The curator reads the record,
// takes the etcd step, issues and revokes certificates, fences and writes.
//
// Its errors wrap platform/rpcerr's kinds (rpcerr.Refused: FailedPrecondition;
// rpcerr.Conflict: Aborted, reason CONFLICT), the very kinds the curator's
// errRefused and errConflict are, so the curator returns them as they are
// and its error interceptor gives them their codes.
package roles

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/rpcerr"
)

// Set says which roles a node holds (or should hold).
type Set struct{ ConsensusMember, KubernetesController, KubernetesWorker bool }

// Any reports whether the set holds a role.
func (s Set) Any() bool { return s != Set{} }

// Of is the Set of r.
func Of(r *curatorv1.Roles) Set {
	return Set{
		ConsensusMember:      r.GetConsensusMember() != nil,
		KubernetesController: r.GetKubernetesController() != nil,
		KubernetesWorker:     r.GetKubernetesWorker() != nil,
	}
}

// Requested is the roles have with the request applied: a role the
// request names is what it says, the others stay.
func Requested(have *curatorv1.Roles, req *curatorv1.UpdateNodeRolesRequest) Set {
	want := Of(have)
	if req.ConsensusMember != nil {
		want.ConsensusMember = req.GetConsensusMember()
	}
	if req.KubernetesController != nil {
		want.KubernetesController = req.GetKubernetesController()
	}
	if req.KubernetesWorker != nil {
		want.KubernetesWorker = req.GetKubernetesWorker()
	}
	return want
}

// Allowed refuses roles for a node that is not UP.
func Allowed(n *curatorv1.Node) error {
	if n.State != curatorv1.NodeState_NODE_STATE_UP {
		return fmt.Errorf("%w: node %s is %s: roles are for UP nodes (approve it and let it commit)", rpcerr.Refused, n.Id, n.State)
	}
	return nil
}

// Valid checks that want may follow from the node's roles:
// KubernetesController requires ConsensusMember.
func Valid(n *curatorv1.Node, want Set) error {
	if !want.KubernetesController || want.ConsensusMember {
		return nil
	}
	if n.GetRoles().GetKubernetesController() != nil {
		return fmt.Errorf("%w: node %s has KubernetesController, which requires ConsensusMember: take it first (kubernetes_controller=false, in this call or before)", rpcerr.Refused, n.Id)
	}
	return fmt.Errorf("%w: KubernetesController requires ConsensusMember: give consensus_member=true (in this call or before)", rpcerr.Refused)
}

// TouchesMembership reports whether req, on node n, concerns etcd
// membership: it names ConsensusMember (membership is the truth: an
// explicit value is checked against the member list, even one the node
// has), or it gives KubernetesController, which requires ConsensusMember
// and so must not land while a change of it is in flight. Other role
// changes keep the record's ConsensusMember as it is, and their write is
// conditional on that record: they need no member list and no guard on
// membership.
func TouchesMembership(n *curatorv1.Node, req *curatorv1.UpdateNodeRolesRequest, want Set) bool {
	return req.ConsensusMember != nil || (want.KubernetesController && n.GetRoles().GetKubernetesController() == nil)
}

// Plan is UpdateNodeRoles' first decision, on the record n as read before
// any etcd step: the roles req asks for, and whether the call concerns
// etcd membership (TouchesMembership: then the curator plans a membership
// step and guards the role write on the epoch it left). A node that is not
// UP, or roles that break the invariant, are refused.
func Plan(n *curatorv1.Node, req *curatorv1.UpdateNodeRolesRequest) (want Set, touches bool, err error) {
	if err := Allowed(n); err != nil {
		return Set{}, false, err
	}
	want = Requested(n.GetRoles(), req)
	if err := Valid(n, want); err != nil {
		return Set{}, false, err
	}
	return want, TouchesMembership(n, req, want), nil
}

// Update is what one attempt of UpdateNodeRoles' role write writes on the
// record n, read again for that attempt: hadCM is whether the node had
// ConsensusMember when the call first read it, stepped whether the call
// took an etcd membership step (its role write is then guarded on
// membership), join the join parameters that step gave (nil: none).
// changed is false when the record has those roles already.
//
// It refuses (Aborted, CONFLICT: read the node and decide again) when
// ConsensusMember changed under the call other than the call asked (the
// reconciler aligned it with etcd membership), and when a call that took
// no step would now touch membership (the roles changed meanwhile).
func Update(n *curatorv1.Node, req *curatorv1.UpdateNodeRolesRequest, hadCM, stepped bool, join *consensusv1.JoinParameters) (out *curatorv1.Roles, changed bool, err error) {
	// Deleted and enrolled again meanwhile: this call was decided on the
	// node that is gone.
	if err := Allowed(n); err != nil {
		return nil, false, err
	}
	hasCM := n.GetRoles().GetConsensusMember() != nil
	if hasCM != hadCM && (req.ConsensusMember == nil || hasCM != req.GetConsensusMember()) {
		return nil, false, fmt.Errorf("%w: ConsensusMember of node %s changed while this call ran (the reconciler aligned it with etcd membership?): read the node and decide again", rpcerr.Conflict, n.Id)
	}
	want, touches, err := Plan(n, req)
	if err != nil {
		return nil, false, err
	}
	if !stepped && touches {
		return nil, false, fmt.Errorf("%w: the roles of node %s changed while this call ran: read the node and decide again", rpcerr.Conflict, n.Id)
	}
	out, err = Desired(n, want, join)
	if err != nil {
		return nil, false, err
	}
	return out, !proto.Equal(out, n.GetRoles()), nil
}

// Desired is the roles of want on the record n: ConsensusMember carrying
// join when it is other join parameters than the record's (the curator then
// issues its member certificate), and the record's otherwise. Wanting
// ConsensusMember that neither the record nor join gives is a conflict:
// the record lost it meanwhile.
func Desired(n *curatorv1.Node, want Set, join *consensusv1.JoinParameters) (*curatorv1.Roles, error) {
	out := &curatorv1.Roles{}
	if want.ConsensusMember {
		out.ConsensusMember = n.GetRoles().GetConsensusMember()
		if join != nil && !proto.Equal(join, out.ConsensusMember.GetJoin()) {
			out.ConsensusMember = &curatorv1.ConsensusMember{Join: join}
		}
		if out.ConsensusMember == nil {
			return nil, fmt.Errorf("%w: node %s lost ConsensusMember while this call ran: read the node and decide again", rpcerr.Conflict, n.Id)
		}
	}
	if want.KubernetesController {
		out.KubernetesController = &curatorv1.KubernetesController{}
	}
	if want.KubernetesWorker {
		out.KubernetesWorker = &curatorv1.KubernetesWorker{}
	}
	return out, nil
}

// Reconcile is what the reconciler's change writes on the record n (DESIGN
// §4): with join (add_consensus_member), ConsensusMember carrying join; a
// node that has ConsensusMember with other join parameters is refused
// (remove it first). Without join (remove_consensus_member),
// ConsensusMember goes, and KubernetesController with it (it requires
// ConsensusMember: both go in one write); KubernetesWorker stays. changed
// is false when the record is so already.
//
// The curator checks the reconciler's fence before it returns a refusal,
// like every refusal of a fenced call.
func Reconcile(n *curatorv1.Node, join *consensusv1.JoinParameters) (out *curatorv1.Roles, changed bool, err error) {
	have := n.GetRoles()
	want := Of(have)
	if join != nil {
		if cm := have.GetConsensusMember(); cm != nil && !proto.Equal(cm.GetJoin(), join) {
			return nil, false, fmt.Errorf("%w: node %s has ConsensusMember already (member %x): remove it first", rpcerr.Refused, n.Id, cm.GetJoin().GetMemberId())
		}
		want.ConsensusMember = true
	} else {
		want.ConsensusMember, want.KubernetesController = false, false
	}
	if err := Valid(n, want); err != nil {
		return nil, false, err
	}
	out, err = Desired(n, want, join)
	if err != nil {
		return nil, false, err
	}
	return out, !proto.Equal(out, clone(have)), nil
}

// Names lists r's roles for messages and logs ("ConsensusMember,
// KubernetesWorker").
func Names(r *curatorv1.Roles) string {
	var names []string
	if r.GetConsensusMember() != nil {
		names = append(names, "ConsensusMember")
	}
	if r.GetKubernetesController() != nil {
		names = append(names, "KubernetesController")
	}
	if r.GetKubernetesWorker() != nil {
		names = append(names, "KubernetesWorker")
	}
	return strings.Join(names, ", ")
}

// clone is r's roles in a record of their own (empty for nil), for
// comparing with what Reconcile writes.
func clone(r *curatorv1.Roles) *curatorv1.Roles {
	out := &curatorv1.Roles{}
	if r != nil {
		out.ConsensusMember = r.ConsensusMember
		out.KubernetesController = r.KubernetesController
		out.KubernetesWorker = r.KubernetesWorker
	}
	return out
}
