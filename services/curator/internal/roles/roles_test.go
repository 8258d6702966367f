package roles_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/rpcerr"
	"curia.dev/services/curator/internal/roles"
)

var (
	join1 = &consensusv1.JoinParameters{MemberId: 0x1}
	join2 = &consensusv1.JoinParameters{MemberId: 0x2}
	// cm1 is ConsensusMember of member 1 with its member certificate.
	cm1 = &curatorv1.ConsensusMember{Join: join1, MemberCertificate: []byte("member-1 PEM")}
	kc  = &curatorv1.KubernetesController{}
	kw  = &curatorv1.KubernetesWorker{}
)

// up is an UP node "n1" with roles r.
func up(r *curatorv1.Roles) *curatorv1.Node {
	return &curatorv1.Node{Id: "n1", State: curatorv1.NodeState_NODE_STATE_UP, Roles: r}
}

// wantErr checks err against a code and a part of its message (code OK: no
// error).
func wantErr(t *testing.T, err error, code codes.Code, text string) {
	t.Helper()
	if code == codes.OK {
		if err != nil {
			t.Fatalf("error %v, want none", err)
		}
		return
	}
	if got := rpcerr.Code(err); got != code || !strings.Contains(err.Error(), text) {
		t.Fatalf("error %v (%v), want %v containing %q", err, got, code, text)
	}
}

func wantRoles(t *testing.T, got, want *curatorv1.Roles) {
	t.Helper()
	if !proto.Equal(got, want) {
		t.Fatalf("roles %v, want %v", got, want)
	}
}

// TestPlan: UpdateNodeRoles' first decision: who may have roles, the
// invariant, and which calls need an etcd membership step.
func TestPlan(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		node        *curatorv1.Node
		req         *curatorv1.UpdateNodeRolesRequest
		want        roles.Set
		wantTouches bool
		code        codes.Code
		text        string
	}{
		"a node not UP gets no roles": {
			node: &curatorv1.Node{Id: "n1", State: curatorv1.NodeState_NODE_STATE_STANDBY},
			req:  &curatorv1.UpdateNodeRolesRequest{KubernetesWorker: new(true)},
			code: codes.FailedPrecondition, text: "node n1 is NODE_STATE_STANDBY: roles are for UP nodes",
		},
		"KubernetesController without ConsensusMember is refused": {
			node: up(nil),
			req:  &curatorv1.UpdateNodeRolesRequest{KubernetesController: new(true)},
			code: codes.FailedPrecondition, text: "KubernetesController requires ConsensusMember: give consensus_member=true",
		},
		"ConsensusMember taken from a controller is refused": {
			node: up(&curatorv1.Roles{ConsensusMember: cm1, KubernetesController: kc}),
			req:  &curatorv1.UpdateNodeRolesRequest{ConsensusMember: new(false)},
			code: codes.FailedPrecondition, text: "node n1 has KubernetesController, which requires ConsensusMember: take it first",
		},
		"both taken in one call": {
			node:        up(&curatorv1.Roles{ConsensusMember: cm1, KubernetesController: kc}),
			req:         &curatorv1.UpdateNodeRolesRequest{ConsensusMember: new(false), KubernetesController: new(false)},
			want:        roles.Set{},
			wantTouches: true,
		},
		"KubernetesController with ConsensusMember in one call": {
			node:        up(nil),
			req:         &curatorv1.UpdateNodeRolesRequest{ConsensusMember: new(true), KubernetesController: new(true)},
			want:        roles.Set{ConsensusMember: true, KubernetesController: true},
			wantTouches: true,
		},
		"KubernetesController on a member touches membership (no change of it may be in flight)": {
			node:        up(&curatorv1.Roles{ConsensusMember: cm1}),
			req:         &curatorv1.UpdateNodeRolesRequest{KubernetesController: new(true)},
			want:        roles.Set{ConsensusMember: true, KubernetesController: true},
			wantTouches: true,
		},
		"KubernetesController the node has already: no step": {
			node: up(&curatorv1.Roles{ConsensusMember: cm1, KubernetesController: kc}),
			req:  &curatorv1.UpdateNodeRolesRequest{KubernetesController: new(true)},
			want: roles.Set{ConsensusMember: true, KubernetesController: true},
		},
		"consensus_member=true the node has already is checked against etcd": {
			node:        up(&curatorv1.Roles{ConsensusMember: cm1}),
			req:         &curatorv1.UpdateNodeRolesRequest{ConsensusMember: new(true)},
			want:        roles.Set{ConsensusMember: true},
			wantTouches: true,
		},
		"KubernetesWorker alone: no step, the other roles stay": {
			node: up(&curatorv1.Roles{ConsensusMember: cm1}),
			req:  &curatorv1.UpdateNodeRolesRequest{KubernetesWorker: new(true)},
			want: roles.Set{ConsensusMember: true, KubernetesWorker: true},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			want, touches, err := roles.Plan(tc.node, tc.req)
			wantErr(t, err, tc.code, tc.text)
			if err != nil {
				return
			}
			if want != tc.want || touches != tc.wantTouches {
				t.Fatalf("Plan: %+v, touches %v; want %+v, touches %v", want, touches, tc.want, tc.wantTouches)
			}
		})
	}
}

// TestUpdate: one attempt of UpdateNodeRoles' role write, decided again on
// the record as it is now.
func TestUpdate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		node        *curatorv1.Node
		req         *curatorv1.UpdateNodeRolesRequest
		hadCM       bool
		stepped     bool
		join        *consensusv1.JoinParameters
		want        *curatorv1.Roles
		wantChanged bool
		code        codes.Code
		text        string
	}{
		"a new member: its join parameters, without a certificate yet": {
			node: up(nil), req: &curatorv1.UpdateNodeRolesRequest{ConsensusMember: new(true)},
			stepped: true, join: join1,
			want: &curatorv1.Roles{ConsensusMember: &curatorv1.ConsensusMember{Join: join1}}, wantChanged: true,
		},
		"the same join parameters: the record's role and certificate are kept": {
			node: up(&curatorv1.Roles{ConsensusMember: cm1}), req: &curatorv1.UpdateNodeRolesRequest{ConsensusMember: new(true)},
			hadCM: true, stepped: true, join: proto.Clone(join1).(*consensusv1.JoinParameters),
			want: &curatorv1.Roles{ConsensusMember: cm1},
		},
		"other join parameters replace the record's (a new certificate follows)": {
			node: up(&curatorv1.Roles{ConsensusMember: cm1}), req: &curatorv1.UpdateNodeRolesRequest{ConsensusMember: new(true)},
			hadCM: true, stepped: true, join: join2,
			want: &curatorv1.Roles{ConsensusMember: &curatorv1.ConsensusMember{Join: join2}}, wantChanged: true,
		},
		"a step that gave no join parameters keeps the record's": {
			node: up(&curatorv1.Roles{ConsensusMember: cm1}), req: &curatorv1.UpdateNodeRolesRequest{ConsensusMember: new(true)},
			hadCM: true, stepped: true,
			want: &curatorv1.Roles{ConsensusMember: cm1},
		},
		"ConsensusMember and KubernetesController taken together": {
			node:  up(&curatorv1.Roles{ConsensusMember: cm1, KubernetesController: kc, KubernetesWorker: kw}),
			req:   &curatorv1.UpdateNodeRolesRequest{ConsensusMember: new(false), KubernetesController: new(false)},
			hadCM: true, stepped: true,
			want: &curatorv1.Roles{KubernetesWorker: kw}, wantChanged: true,
		},
		"KubernetesWorker given: no step needed": {
			node: up(nil), req: &curatorv1.UpdateNodeRolesRequest{KubernetesWorker: new(true)},
			want: &curatorv1.Roles{KubernetesWorker: kw}, wantChanged: true,
		},
		"nothing to change": {
			node: up(&curatorv1.Roles{KubernetesWorker: kw}), req: &curatorv1.UpdateNodeRolesRequest{KubernetesWorker: new(true)},
			want: &curatorv1.Roles{KubernetesWorker: kw},
		},
		"the node is no longer UP (deleted and enrolled again)": {
			node: &curatorv1.Node{Id: "n1", State: curatorv1.NodeState_NODE_STATE_NEW},
			req:  &curatorv1.UpdateNodeRolesRequest{KubernetesWorker: new(true)},
			code: codes.FailedPrecondition, text: "roles are for UP nodes",
		},
		"lost ConsensusMember meanwhile (the reconciler took it): conflict": {
			node: up(nil), req: &curatorv1.UpdateNodeRolesRequest{KubernetesController: new(true)},
			hadCM: true, stepped: true,
			code: codes.Aborted, text: "ConsensusMember of node n1 changed while this call ran",
		},
		"gained ConsensusMember meanwhile, the call not about it: conflict": {
			node: up(&curatorv1.Roles{ConsensusMember: cm1}), req: &curatorv1.UpdateNodeRolesRequest{KubernetesWorker: new(true)},
			code: codes.Aborted, text: "ConsensusMember of node n1 changed while this call ran",
		},
		"ConsensusMember changed the way the call asked: no conflict": {
			node: up(&curatorv1.Roles{ConsensusMember: cm1}), req: &curatorv1.UpdateNodeRolesRequest{ConsensusMember: new(true)},
			stepped: true, join: join1,
			want: &curatorv1.Roles{ConsensusMember: cm1},
		},
		"KubernetesController taken meanwhile, a call without a step would now need one: conflict": {
			node:  up(&curatorv1.Roles{ConsensusMember: cm1}),
			req:   &curatorv1.UpdateNodeRolesRequest{KubernetesController: new(true)},
			hadCM: true,
			code:  codes.Aborted, text: "the roles of node n1 changed while this call ran",
		},
		"ConsensusMember wanted but neither the record nor the step gives it: conflict": {
			node: up(nil), req: &curatorv1.UpdateNodeRolesRequest{ConsensusMember: new(true)},
			stepped: true,
			code:    codes.Aborted, text: "node n1 lost ConsensusMember while this call ran",
		},
		"KubernetesController without ConsensusMember is refused on the write too": {
			node: up(&curatorv1.Roles{KubernetesController: kc}), req: &curatorv1.UpdateNodeRolesRequest{KubernetesWorker: new(true)},
			code: codes.FailedPrecondition, text: "node n1 has KubernetesController, which requires ConsensusMember",
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, changed, err := roles.Update(tc.node, tc.req, tc.hadCM, tc.stepped, tc.join)
			wantErr(t, err, tc.code, tc.text)
			if err != nil {
				return
			}
			wantRoles(t, got, tc.want)
			if changed != tc.wantChanged {
				t.Fatalf("changed %v, want %v", changed, tc.wantChanged)
			}
		})
	}
}

// TestReconcile: the reconciler's add_consensus_member and
// remove_consensus_member on a record.
func TestReconcile(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		node        *curatorv1.Node
		join        *consensusv1.JoinParameters // nil: remove
		want        *curatorv1.Roles
		wantChanged bool
		code        codes.Code
		text        string
	}{
		"add to a node without the role": {
			node: up(&curatorv1.Roles{KubernetesWorker: kw}), join: join1,
			want: &curatorv1.Roles{ConsensusMember: &curatorv1.ConsensusMember{Join: join1}, KubernetesWorker: kw}, wantChanged: true,
		},
		"add what the node has: nothing changes, its certificate stays": {
			node: up(&curatorv1.Roles{ConsensusMember: cm1}), join: proto.Clone(join1).(*consensusv1.JoinParameters),
			want: &curatorv1.Roles{ConsensusMember: cm1},
		},
		"add over another member: refused": {
			node: up(&curatorv1.Roles{ConsensusMember: cm1}), join: join2,
			code: codes.FailedPrecondition, text: "node n1 has ConsensusMember already (member 1): remove it first",
		},
		"remove takes KubernetesController with it; KubernetesWorker stays": {
			node: up(&curatorv1.Roles{ConsensusMember: cm1, KubernetesController: kc, KubernetesWorker: kw}),
			want: &curatorv1.Roles{KubernetesWorker: kw}, wantChanged: true,
		},
		"remove from a node without the role: nothing changes": {
			node: up(&curatorv1.Roles{KubernetesWorker: kw}),
			want: &curatorv1.Roles{KubernetesWorker: kw},
		},
		"remove from a record without roles: nothing changes": {
			node: up(nil),
			want: &curatorv1.Roles{},
		},
		"remove from a controller left without ConsensusMember: it goes too": {
			node: up(&curatorv1.Roles{KubernetesController: kc}),
			want: &curatorv1.Roles{}, wantChanged: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, changed, err := roles.Reconcile(tc.node, tc.join)
			wantErr(t, err, tc.code, tc.text)
			if err != nil {
				return
			}
			wantRoles(t, got, tc.want)
			if changed != tc.wantChanged {
				t.Fatalf("changed %v, want %v", changed, tc.wantChanged)
			}
		})
	}
}

// TestNames: roles in messages, in a fixed order.
func TestNames(t *testing.T) {
	t.Parallel()
	for want, r := range map[string]*curatorv1.Roles{
		"":                                  nil,
		"ConsensusMember, KubernetesWorker": {ConsensusMember: cm1, KubernetesWorker: kw},
		"ConsensusMember, KubernetesController, KubernetesWorker": {ConsensusMember: cm1, KubernetesController: kc, KubernetesWorker: kw},
	} {
		if got := roles.Names(r); got != want {
			t.Errorf("Names(%v) = %q, want %q", r, got, want)
		}
	}
}
