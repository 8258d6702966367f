package rpc

import (
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	fencev1 "curia.dev/gen/curia/fence/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
)

const testNodeID = "node-0123456789abcdef0123456789abcdef"

// TestValidateRequest runs the validation layer over the real generated
// requests of each service: the rules declared in proto/ hold, and a
// violation names its field and rule. The services' own tests show the
// same over gRPC with mTLS.
func TestValidateRequest(t *testing.T) {
	fence := &fencev1.Fence{Conditions: []*fencev1.FenceCondition{{Key: "/curia/leader/1", CreateRevision: 5}}, MembershipEpoch: 3}
	join := &consensusv1.JoinParameters{
		CaCertificate: []byte("ca"),
		Voters:        []*consensusv1.Peer{{Name: testNodeID, PeerUrls: []string{"https://10.0.0.1:2380"}, ClientUrls: []string{"https://10.0.0.1:2379"}}},
		MemberId:      7,
		PeerUrl:       "https://10.0.0.2:2380",
	}
	withJoin := func(f func(j *consensusv1.JoinParameters)) *consensusv1.JoinParameters {
		j := proto.Clone(join).(*consensusv1.JoinParameters)
		f(j)
		return j
	}
	tests := map[string]struct {
		req       proto.Message
		wantField string // "" means valid
		wantRule  string
	}{
		// consensus
		"add node: valid":                         {req: &consensusv1.AddNodeRequest{NodeId: testNodeID, PeerUrl: "https://node-a:2380", Fence: fence}},
		"add node: valid IPv6 and trailing slash": {req: &consensusv1.AddNodeRequest{NodeId: testNodeID, PeerUrl: "https://[fd00::1]:2380/", Fence: fence}},
		"add node: bad node id": {req: &consensusv1.AddNodeRequest{NodeId: "node-XYZ", PeerUrl: "https://a:2380", Fence: fence},
			wantField: "node_id", wantRule: "curia.node_id"},
		"add node: URL with fragment": {req: &consensusv1.AddNodeRequest{NodeId: testNodeID, PeerUrl: "https://a:2380#x", Fence: fence},
			wantField: "peer_url", wantRule: "curia.https_host_port"},
		"add node: URL without host": {req: &consensusv1.AddNodeRequest{NodeId: testNodeID, PeerUrl: "https://:2380", Fence: fence},
			wantField: "peer_url", wantRule: "curia.https_host_port"},
		"add node: http URL": {req: &consensusv1.AddNodeRequest{NodeId: testNodeID, PeerUrl: "http://a:2380", Fence: fence},
			wantField: "peer_url", wantRule: "curia.https_host_port"},
		"add node: URL without port": {req: &consensusv1.AddNodeRequest{NodeId: testNodeID, PeerUrl: "https://a", Fence: fence},
			wantField: "peer_url", wantRule: "curia.https_host_port"},
		"add node: URL with a path": {req: &consensusv1.AddNodeRequest{NodeId: testNodeID, PeerUrl: "https://a:2380/x", Fence: fence},
			wantField: "peer_url", wantRule: "curia.https_host_port"},
		"add node: URL with a user": {req: &consensusv1.AddNodeRequest{NodeId: testNodeID, PeerUrl: "https://u@a:2380", Fence: fence},
			wantField: "peer_url", wantRule: "curia.https_host_port"},
		"add node: no fence": {req: &consensusv1.AddNodeRequest{NodeId: testNodeID, PeerUrl: "https://a:2380"},
			wantField: "fence", wantRule: "required"},
		"promote: no member id": {req: &consensusv1.PromoteMemberRequest{Fence: fence},
			wantField: "member_id", wantRule: "uint64.gt"},
		"remove: no target": {req: &consensusv1.RemoveMemberRequest{Fence: fence},
			wantField: "target", wantRule: "required"},
		"remove: too long reason": {req: &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_MemberId{MemberId: 1}, Fence: fence, Reason: strings.Repeat("x", 1025)},
			wantField: "reason", wantRule: "string.max_bytes"},
		"remove: absent node id with a slash": {req: &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_MemberId{MemberId: 1}, Fence: fence, AbsentNodeId: "a/b"},
			wantField: "absent_node_id", wantRule: "string.not_contains"},
		"remove: valid": {req: &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: testNodeID}, Fence: fence, Reason: strings.Repeat("x", 1024)}},
		"start: no mode": {req: &consensusv1.StartRequest{},
			wantField: "mode", wantRule: "required"},
		"start: join valid": {req: &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: join}}},
		"start: join without a voter client URL": {req: &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: withJoin(func(j *consensusv1.JoinParameters) { j.Voters[0].ClientUrls = nil })}},
			wantField: "join", wantRule: "join.voter_client_url"},
		"start: join with a bad voter URL": {req: &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: withJoin(func(j *consensusv1.JoinParameters) { j.Voters[0].ClientUrls = []string{"https://a:2379?x=1"} })}},
			wantField: "join.voters[0].client_urls[0]", wantRule: "curia.https_host_port"},

		// curator
		"acquire: TTL too short": {req: &curatorv1.AcquireRequest{Name: "reconciler", Holder: "r1", TtlSeconds: 1},
			wantField: "ttl_seconds", wantRule: "int64.gte_lte"},
		"acquire: TTL too long": {req: &curatorv1.AcquireRequest{Name: "reconciler", Holder: "r1", TtlSeconds: 61},
			wantField: "ttl_seconds", wantRule: "int64.gte_lte"},
		"acquire: holder with a newline": {req: &curatorv1.AcquireRequest{Name: "reconciler", Holder: "r\n1", TtlSeconds: 10},
			wantField: "holder", wantRule: "curia.printable"},
		"acquire: bad name": {req: &curatorv1.AcquireRequest{Name: "Reconciler", Holder: "r1", TtlSeconds: 10},
			wantField: "name", wantRule: "curia.dns_label"},
		"acquire: valid": {req: &curatorv1.AcquireRequest{Name: "reconciler", Holder: "reconciler-0 (b3f1…)", TtlSeconds: 10}},
		"keep alive: no lease": {req: &curatorv1.KeepAliveRequest{},
			wantField: "lease", wantRule: "required"},
		"reconcile: join without voters": {req: &curatorv1.ReconcileNodeRolesRequest{Fence: fence, NodeId: testNodeID, NodeRevision: 4,
			Change: &curatorv1.ReconcileNodeRolesRequest_AddConsensusMember{AddConsensusMember: withJoin(func(j *consensusv1.JoinParameters) { j.Voters = nil })}},
			wantField: "add_consensus_member.voters", wantRule: "repeated.min_items"},
		"reconcile: remove false": {req: &curatorv1.ReconcileNodeRolesRequest{Fence: fence, NodeId: testNodeID, NodeRevision: 4,
			Change: &curatorv1.ReconcileNodeRolesRequest_RemoveConsensusMember{}},
			wantField: "remove_consensus_member", wantRule: "bool.const"},
		"reconcile: valid": {req: &curatorv1.ReconcileNodeRolesRequest{Fence: fence, NodeId: testNodeID, NodeRevision: 4,
			Change: &curatorv1.ReconcileNodeRolesRequest_AddConsensusMember{AddConsensusMember: join}}},
		"status: URL with fragment": {req: &curatorv1.UpdateNodeStatusRequest{NodeId: testNodeID, Status: &curatorv1.NodeStatus{ConsensusClientUrl: "https://a:2379#f"}},
			wantField: "status.consensus_client_url", wantRule: "curia.https_host_port"},
		"status: short consensus key": {req: &curatorv1.UpdateNodeStatusRequest{NodeId: testNodeID, Status: &curatorv1.NodeStatus{ConsensusPublicKey: []byte{1}}},
			wantField: "status.consensus_public_key", wantRule: "bytes.len"},
		"status: empty endpoints are fine": {req: &curatorv1.UpdateNodeStatusRequest{NodeId: testNodeID, Status: &curatorv1.NodeStatus{Address: "10.0.0.1"}}},
		"register: bad label key": {req: &curatorv1.RegisterNodeRequest{PublicKey: make([]byte, 32), Labels: map[string]string{"-x": "y"}},
			wantField: `labels["-x"] (key)`, wantRule: "curia.label_key"},
		"bootstrap: bad label value": {req: &curatorv1.BootstrapClusterRequest{PublicKey: make([]byte, 32), Status: &curatorv1.NodeStatus{ConsensusPeerUrl: "https://127.0.0.1:2380"}, Labels: map[string]string{"zone": "a b"}},
			wantField: `labels["zone"]`, wantRule: "curia.label_value"},
		"bootstrap: no peer URL": {req: &curatorv1.BootstrapClusterRequest{PublicKey: make([]byte, 32), Status: &curatorv1.NodeStatus{}},
			wantField: "status", wantRule: "bootstrap.consensus_peer_url"},
		"watch: resume with min revision": {req: &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_AllNodes{AllNodes: true}, StartRevision: 5, MinRevision: 3},
			wantField: "", wantRule: "watch.min_revision_resume"},
		"update roles: too long reason": {req: &curatorv1.UpdateNodeRolesRequest{NodeId: testNodeID, Reason: strings.Repeat("é", 513)},
			wantField: "reason", wantRule: "string.max_bytes"},

		// reconciler
		"pause: too long reason": {req: &reconcilerv1.PauseRequest{Reason: strings.Repeat("x", 1025)},
			wantField: "reason", wantRule: "string.max_bytes"},
		"pause: valid": {req: &reconcilerv1.PauseRequest{Reason: "maintenance"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := ValidateRequest(tc.req)
			if tc.wantRule == "" {
				if err != nil {
					t.Fatalf("valid request refused: %v", err)
				}
				return
			}
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument {
				t.Fatalf("got %v, want InvalidArgument", err)
			}
			want := tc.wantField + ": "
			if tc.wantField == "" {
				want = "invalid request: "
			}
			if !strings.Contains(st.Message(), want) || !strings.Contains(st.Message(), "["+tc.wantRule+"]") {
				t.Fatalf("message %q does not name field %q and rule %q", st.Message(), tc.wantField, tc.wantRule)
			}
			var br *errdetails.BadRequest
			for _, d := range st.Details() {
				if b, ok := d.(*errdetails.BadRequest); ok {
					br = b
				}
			}
			if br == nil || len(br.GetFieldViolations()) != 1 {
				t.Fatalf("details %v: want a BadRequest with one field violation", st.Details())
			}
			if fv := br.GetFieldViolations()[0]; fv.GetField() != tc.wantField || fv.GetReason() != tc.wantRule || fv.GetDescription() == "" {
				t.Fatalf("field violation %v, want field %q, reason %q and a description", fv, tc.wantField, tc.wantRule)
			}
		})
	}
}

// TestEveryRuleCompiles validates an empty message of every curia type: a
// rule that does not compile (a CEL typo in proto/) would answer Internal
// to every caller of the requests that carry it.
func TestEveryRuleCompiles(t *testing.T) {
	n := 0
	protoregistry.GlobalTypes.RangeMessages(func(mt protoreflect.MessageType) bool {
		if !strings.HasPrefix(string(mt.Descriptor().FullName()), "curia.") {
			return true
		}
		n++
		err := ValidateRequest(mt.New().Interface())
		if code := status.Code(err); code != codes.OK && code != codes.InvalidArgument {
			t.Errorf("%s: %v", mt.Descriptor().FullName(), err)
		}
		return true
	})
	if n < 50 {
		t.Fatalf("only %d curia messages registered: are the gen packages imported?", n)
	}
}
