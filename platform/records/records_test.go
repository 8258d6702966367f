package records

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	storagev1 "curia.dev/gen/curia/storage/v1"
)

// computedNodeFields are the fields of curatorv1.Node the curator computes
// on read: never stored, reserved in NodeRecord.
var computedNodeFields = map[protoreflect.Name]bool{
	"health": true, "last_heartbeat": true, "revision": true, "unreadable": true,
}

// fullNode has every field of curatorv1.Node set, each to a distinct
// value, so that a field read into another's place shows.
func fullNode() *curatorv1.Node {
	ts := func(s int64) *timestamppb.Timestamp { return timestamppb.New(time.Unix(s, 0)) }
	return &curatorv1.Node{
		Id:        "node-0123456789abcdef0123456789abcdef",
		PublicKey: []byte("public key of 32 bytes, exactly."),
		State:     curatorv1.NodeState_NODE_STATE_UP,
		Roles: &curatorv1.Roles{
			ConsensusMember: &curatorv1.ConsensusMember{
				Join: &consensusv1.JoinParameters{
					CaCertificate: []byte("CA"),
					Crl:           []byte("CRL"),
					Voters:        []*consensusv1.Peer{{Name: "node-a", PeerUrls: []string{"https://a:2380"}, ClientUrls: []string{"https://a:2379"}}},
					MemberId:      42,
					PeerUrl:       "https://10.0.0.1:2380",
				},
				MemberCertificate: []byte("member certificate"),
			},
			KubernetesController: &curatorv1.KubernetesController{},
			KubernetesWorker:     &curatorv1.KubernetesWorker{},
		},
		Status: &curatorv1.NodeStatus{
			Address:            "10.0.0.1",
			Version:            "v1.2.3",
			RunningServices:    []string{"consensus"},
			ConsensusApi:       "10.0.0.1:7100",
			ConsensusPeerUrl:   "https://10.0.0.1:2380",
			ConsensusClientUrl: "https://10.0.0.1:2379",
			ConsensusPublicKey: []byte("consensus key of 32 bytes, yes.."),
		},
		Labels:            map[string]string{"rack": "r1", "zone": "z1"},
		Health:            curatorv1.NodeHealth_NODE_HEALTH_HEALTHY,
		LastHeartbeat:     ts(1000),
		CertificateSerial: "0a1b2c",
		Revision:          77,
		Unreadable:        "set only on a record that does not decode",
		Certificates: []*curatorv1.IssuedCertificate{
			{Serial: "0a1b2c", Principal: "node/node-0123", NotAfter: ts(3000), Revoked: true, Issued: ts(2000)},
			{Serial: "0d0e0f", Principal: "consensus/node-0123", NotAfter: ts(5000), Issued: ts(4000)},
		},
		Maintenance: &curatorv1.NodeMaintenance{Reason: "kernel upgrade", By: "admin/ops", Since: ts(6000), Until: ts(6600), LeadershipMovedTo: 7},
	}
}

// storedToday is what the curator stored before curia.storage.v1:
// putNode's marshal of the API's Node without health, last heartbeat and
// revision. Unreadable was never set on a node it wrote (such a node only
// exists in Watch's answers), so it is cleared too.
func storedToday(t *testing.T, n *curatorv1.Node) []byte {
	t.Helper()
	c := proto.Clone(n).(*curatorv1.Node)
	c.Health, c.LastHeartbeat, c.Revision, c.Unreadable = curatorv1.NodeHealth_NODE_HEALTH_UNSPECIFIED, nil, 0, ""
	b, err := proto.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withoutComputed is n as a reader gets it from its record.
func withoutComputed(n *curatorv1.Node) *curatorv1.Node {
	c := proto.Clone(n).(*curatorv1.Node)
	c.Health, c.LastHeartbeat, c.Revision, c.Unreadable = curatorv1.NodeHealth_NODE_HEALTH_UNSPECIFIED, nil, 0, ""
	return c
}

// TestNodeRecordReadsTodaysRecords: a node record as clusters hold it
// today (the API's Node, as putNode stored it) decodes as a NodeRecord
// with every stored field intact and nothing left over, and what curia
// stores now reads as today's format (an earlier curia after a rollback).
func TestNodeRecordReadsTodaysRecords(t *testing.T) {
	t.Parallel()
	n := fullNode()
	m := n.ProtoReflect()
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		if f := fields.Get(i); !m.Has(f) {
			t.Fatalf("the test's node leaves %s unset: set it, and decide whether NodeRecord stores it", f.Name())
		}
	}

	old := storedToday(t, n)
	r := &storagev1.NodeRecord{}
	if err := proto.Unmarshal(old, r); err != nil {
		t.Fatal(err)
	}
	if u := r.ProtoReflect().GetUnknown(); len(u) > 0 {
		t.Fatalf("today's record has %d bytes NodeRecord does not know (a field renumbered or missing)", len(u))
	}
	if got, want := NodeFromRecord(r), withoutComputed(n); !proto.Equal(got, want) {
		t.Fatalf("today's record decodes as\n%v\nwant\n%v", got, want)
	}
	got, err := DecodeNode(old)
	if err != nil {
		t.Fatal(err)
	}
	if want := withoutComputed(n); !proto.Equal(got, want) {
		t.Fatalf("DecodeNode of today's record is\n%v\nwant\n%v", got, want)
	}

	b, err := EncodeNode(n)
	if err != nil {
		t.Fatal(err)
	}
	back := &curatorv1.Node{}
	if err := proto.Unmarshal(b, back); err != nil {
		t.Fatal(err)
	}
	if want := withoutComputed(n); !proto.Equal(back, want) {
		t.Fatalf("the record stored now reads, as today's format, as\n%v\nwant\n%v", back, want)
	}
	if len(back.ProtoReflect().GetUnknown()) > 0 {
		t.Fatal("the record stored now has fields today's format does not know")
	}
}

// TestNodeRecordFieldNumbers: every stored field of the API's Node is in
// NodeRecord under its name, number and type; the computed ones are
// reserved there, by number and name; NodeRecord has nothing else.
func TestNodeRecordFieldNumbers(t *testing.T) {
	t.Parallel()
	api := (&curatorv1.Node{}).ProtoReflect().Descriptor()
	rec := (&storagev1.NodeRecord{}).ProtoReflect().Descriptor()
	sameFields(t, api, rec, computedNodeFields)
	for name := range computedNodeFields {
		f := api.Fields().ByName(name)
		if f == nil {
			t.Fatalf("curatorv1.Node has no field %s: update computedNodeFields", name)
		}
		if !rec.ReservedRanges().Has(f.Number()) || !rec.ReservedNames().Has(name) {
			t.Errorf("NodeRecord does not reserve %s = %d, computed on read", name, f.Number())
		}
	}
}

func fullPendingChange() *consensusv1.PendingChange {
	return &consensusv1.PendingChange{
		Id:         "0011223344556677",
		Operation:  consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_REMOVE,
		MemberId:   0xabcdef,
		NodeId:     "node-0123456789abcdef0123456789abcdef",
		PeerUrl:    "https://10.0.0.2:2380",
		Actor:      "reconciler/r1-abc",
		Fence:      []string{"/curia/leader/1@5", "/curia/leases/reconciler@9"},
		RecordedBy: "consensus/node-0123",
		Started:    timestamppb.New(time.Unix(1700000000, 123)),
		Deadline:   durationpb.New(10 * time.Second),
	}
}

// TestPendingChangeRecordReadsTodaysRecords: a pending change as consensus
// stores it today (the API's PendingChange) decodes as a
// PendingChangeRecord with every field intact, and back.
func TestPendingChangeRecordReadsTodaysRecords(t *testing.T) {
	t.Parallel()
	p := fullPendingChange()
	m := p.ProtoReflect()
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		if f := fields.Get(i); !m.Has(f) {
			t.Fatalf("the test's pending change leaves %s unset: set it, and decide whether PendingChangeRecord stores it", f.Name())
		}
	}
	old, err := proto.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	r := &storagev1.PendingChangeRecord{}
	if err := proto.Unmarshal(old, r); err != nil {
		t.Fatal(err)
	}
	if u := r.ProtoReflect().GetUnknown(); len(u) > 0 {
		t.Fatalf("today's record has %d bytes PendingChangeRecord does not know (a field renumbered or missing)", len(u))
	}
	got, err := DecodePendingChange(old)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, p) {
		t.Fatalf("today's record decodes as\n%v\nwant\n%v", got, p)
	}
	b, err := EncodePendingChange(p)
	if err != nil {
		t.Fatal(err)
	}
	back := &consensusv1.PendingChange{}
	if err := proto.Unmarshal(b, back); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(back, p) || len(back.ProtoReflect().GetUnknown()) > 0 {
		t.Fatalf("the record stored now reads, as today's format, as\n%v\nwant\n%v", back, p)
	}
}

// TestPendingChangeRecordFieldNumbers: the record has the API message's
// fields, under the same names, numbers and types, and no other.
func TestPendingChangeRecordFieldNumbers(t *testing.T) {
	t.Parallel()
	api := (&consensusv1.PendingChange{}).ProtoReflect().Descriptor()
	rec := (&storagev1.PendingChangeRecord{}).ProtoReflect().Descriptor()
	sameFields(t, api, rec, nil)
}

// sameFields checks that every field of api but the computed ones is in
// rec with the same name, number, cardinality and type, and that rec has
// no other field. A nested message of
// another name (a map entry, or a storage copy of an API message) must
// have the same fields in turn.
func sameFields(t *testing.T, api, rec protoreflect.MessageDescriptor, computed map[protoreflect.Name]bool) {
	t.Helper()
	n := 0
	for i := range api.Fields().Len() {
		a := api.Fields().Get(i)
		if computed[a.Name()] {
			continue
		}
		n++
		r := rec.Fields().ByName(a.Name())
		switch {
		case r == nil:
			t.Errorf("%s is stored but %s has no field %s", a.FullName(), rec.FullName(), a.Name())
		case r.Number() != a.Number():
			t.Errorf("%s is %d in storage, %d as stored today: a storage field is never renumbered", r.FullName(), r.Number(), a.Number())
		case r.Kind() != a.Kind() || r.Cardinality() != a.Cardinality() || r.IsMap() != a.IsMap():
			t.Errorf("%s is %v %v in storage, %v %v as stored today", r.FullName(), r.Cardinality(), r.Kind(), a.Cardinality(), a.Kind())
		case a.Enum() != nil && r.Enum().FullName() != a.Enum().FullName():
			t.Errorf("%s is a %s in storage, a %s as stored today", r.FullName(), r.Enum().FullName(), a.Enum().FullName())
		case a.Message() != nil && r.Message().FullName() != a.Message().FullName():
			sameFields(t, a.Message(), r.Message(), nil)
		}
	}
	if got := rec.Fields().Len(); got != n {
		t.Errorf("%s has %d fields, %s %d stored ones", rec.FullName(), got, api.FullName(), n)
	}
}

func TestClusterConfigRecordFieldNumbers(t *testing.T) {
	t.Parallel()
	api := (&curatorv1.ClusterConfig{}).ProtoReflect().Descriptor()
	rec := (&storagev1.ClusterConfigRecord{}).ProtoReflect().Descriptor()
	sameFields(t, api, rec, nil)
}

// TestClusterConfigRecord: a config reads back as written, and a field the
// record does not set reads as its default.
func TestClusterConfigRecord(t *testing.T) {
	t.Parallel()
	full := &curatorv1.ClusterConfig{
		ControlPlaneSize:  5,
		DeadNodeThreshold: durationpb.New(time.Hour),
		MinQuorum:         3,
		Stabilization:     durationpb.New(0), // set, though zero: not the default
		Paused:            true,
		PauseReason:       "maintenance",
	}
	tests := map[string]struct {
		record *storagev1.ClusterConfigRecord
		want   *curatorv1.ClusterConfig
	}{
		"empty record: defaults": {record: &storagev1.ClusterConfigRecord{}, want: DefaultClusterConfig()},
		"only size set": {
			record: &storagev1.ClusterConfigRecord{ControlPlaneSize: 3},
			want: func() *curatorv1.ClusterConfig {
				c := DefaultClusterConfig()
				c.ControlPlaneSize = 3
				return c
			}(),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, err := proto.Marshal(tc.record)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeClusterConfig(b)
			if err != nil || !proto.Equal(got, tc.want) {
				t.Fatalf("got %v (%v), want %v", got, err, tc.want)
			}
		})
	}
	t.Run("round trip", func(t *testing.T) {
		t.Parallel()
		b, err := EncodeClusterConfig(full)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeClusterConfig(b)
		if err != nil || !proto.Equal(got, full) {
			t.Fatalf("got %v (%v), want %v", got, err, full)
		}
	})
	if _, err := DecodeClusterConfig([]byte("\xff\xfe")); err == nil {
		t.Fatal("a record that does not decode decoded")
	}
}
