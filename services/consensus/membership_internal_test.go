package consensus

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/records"
)

// TestQuorumGuardJudgesTheCurrentTerm: the quorum guard counts a voter only
// when it answers at the current (highest) term and names that term's
// leader. A voter cut off from the others still answers and still names
// the leader of the term it last saw; counting it lets a removal through
// that leaves a partitioned voter as one of the quorum.
func TestQuorumGuardJudgesTheCurrentTerm(t *testing.T) {
	const target, a, b, c = 1, 2, 3, 4
	ok := func(id, term, leader, index uint64) probeResult {
		return probeResult{
			member: &etcdMember{ID: id},
			status: &clientv3.StatusResponse{Header: &etcdserverpb.ResponseHeader{MemberId: id}, RaftTerm: term, Leader: leader, RaftIndex: index},
		}
	}
	failed := func(id uint64, err error) probeResult {
		return probeResult{member: &etcdMember{ID: id}, err: err}
	}
	alarmed := ok(b, 7, a, 90)
	alarmed.status.Errors = []string{"NOSPACE"}
	for _, tc := range []struct {
		name    string
		probes  []probeResult
		healthy []uint64
		best    uint64
		leader  uint64
	}{
		{"all at the current term", []probeResult{ok(target, 7, a, 100), ok(a, 7, a, 100), ok(b, 7, a, 99)}, []uint64{a, b}, a, a},
		{"the target leads", []probeResult{ok(target, 7, target, 100), ok(a, 7, target, 98), ok(b, 7, target, 99)}, []uint64{a, b}, b, target},
		{"a partitioned voter names the leader of an old term", []probeResult{ok(target, 7, a, 100), ok(a, 7, a, 100), ok(b, 6, b, 120)}, []uint64{a}, a, a},
		{"a voter names a leader at the current term that is no voter", []probeResult{ok(target, 7, a, 100), ok(a, 7, a, 100), ok(b, 7, c, 99)}, []uint64{a}, a, a},
		{"a voter knows no leader", []probeResult{ok(target, 7, a, 100), ok(a, 7, a, 100), ok(b, 8, 0, 99)}, nil, 0, 0},
		{"a voter does not answer", []probeResult{ok(target, 7, a, 100), ok(a, 7, a, 100), failed(b, errors.New("context deadline exceeded"))}, []uint64{a}, a, a},
		{"a voter raises an alarm", []probeResult{ok(target, 7, a, 100), ok(a, 7, a, 100), alarmed}, []uint64{a}, a, a},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := judgeVoters(target, tc.probes)
			var healthy []uint64
			for _, p := range tc.probes {
				if slices.Contains(j.healthy, types.ID(p.member.ID).String()) {
					healthy = append(healthy, p.member.ID)
				}
			}
			var best uint64
			if j.best != nil {
				best = j.best.ID
			}
			if !slices.Equal(healthy, tc.healthy) || best != tc.best || j.leader != tc.leader {
				t.Fatalf("healthy %v (unhealthy %q), transferee %d, leader %d; want healthy %v, transferee %d, leader %d",
					healthy, j.unhealthy, best, j.leader, tc.healthy, tc.best, tc.leader)
			}
			if len(j.healthy)+len(j.unhealthy) != len(tc.probes)-1 {
				t.Fatalf("healthy %v and unhealthy %q do not name every voter but the target once", j.healthy, j.unhealthy)
			}
		})
	}
}

// TestDecodePendingUnreadable: a value that is not a change record, or a
// record naming no id, operation or deadline, is pending and unreadable,
// never nil (which would let changes through) and never an error (which
// would leave it for nobody to clear).
func TestDecodePendingUnreadable(t *testing.T) {
	good, err := records.EncodePendingChange(&consensusv1.PendingChange{Id: "c1", Operation: consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_REMOVE, Deadline: durationpb.New(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	noOp, _ := records.EncodePendingChange(&consensusv1.PendingChange{Id: "c1", Deadline: durationpb.New(time.Second)})
	noDeadline, _ := records.EncodePendingChange(&consensusv1.PendingChange{Id: "c1", Operation: consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_ADD})
	for _, tc := range []struct {
		name  string
		value []byte
		why   string
	}{
		{"good", good, ""},
		{"empty", nil, "names no change id"},
		{"garbage", []byte("\xff\xff not a record"), "decode"},
		{"no operation", noOp, "names no operation"},
		{"no deadline", noDeadline, "names no deadline"},
	} {
		p := decodePending(tc.value, 7, 9)
		switch {
		case p == nil:
			t.Errorf("%s: nil", tc.name)
		case tc.why == "" && p.unreadable != nil:
			t.Errorf("%s: unreadable: %v", tc.name, p.unreadable)
		case tc.why != "" && (p.unreadable == nil || !strings.Contains(p.unreadable.Error(), tc.why) || p.GetId() != "unreadable-7-9"):
			t.Errorf("%s: id %q, unreadable %v; want unreadable, %q", tc.name, p.GetId(), p.unreadable, tc.why)
		}
	}
}
