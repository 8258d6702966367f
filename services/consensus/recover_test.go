package consensus_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
	ct "curia.dev/services/consensus/consensustest"
)

var recoverAdmin = pki.Principal{Kind: pki.KindAdmin, Name: "ops"}

// writeKeys writes n keys under /curia/test/ and returns them as written.
func writeKeys(t *testing.T, cli *clientv3.Client, n int) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i := range n {
		k, v := fmt.Sprintf("/curia/test/k%03d", i), fmt.Sprintf("v%d-%d", i, time.Now().UnixNano())
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := cli.Put(ctx, k, v)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	return out
}

// checkKeys fails unless every key has its value.
func checkKeys(t *testing.T, cli *clientv3.Client, want map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/curia/test/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range resp.Kvs {
		got[string(kv.Key)] = string(kv.Value)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("key %s = %q after the recovery, want %q (acknowledged before the loss)", k, got[k], v)
		}
	}
}

// leaderless waits until n's member has no leader.
func leaderless(t *testing.T, n *ct.Node) {
	t.Helper()
	ct.Eventually(t, 30*time.Second, func() error {
		if st := n.Status(); st.LeaderId != 0 {
			return fmt.Errorf("%s still follows leader %s", n.ID, types.ID(st.LeaderId))
		}
		return nil
	})
}

func code(err error) codes.Code { return status.Code(err) }

// TestRecoverFromSurvivor: a 3-voter cluster loses two voters for good; the
// survivor's data becomes a new single-voter cluster with every write
// acknowledged before the loss, revisions moved forward, and the old
// members fenced out: one that comes back with its data cannot join, and
// its node may wipe it (Leave).
func TestRecoverFromSurvivor(t *testing.T) {
	proctest.SkipShort(t)
	c := ct.NewCluster(t)
	nodes, _ := c.Voters(3)
	survivor, lost := nodes[0], nodes[1:]
	cli := c.Etcd(survivor.ClientURL, lost[0].ClientURL, lost[1].ClientURL)
	written := writeKeys(t, cli, 50)
	before := survivor.Status()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	req := &consensusv1.RecoverRequest{MemberId: before.MemberId, Reason: "test: two voters lost"}
	// A quorum is reachable: refused, nothing changed.
	_, err := survivor.Consensus(recoverAdmin).Recover(ctx, req)
	if code(err) != codes.FailedPrecondition {
		t.Fatalf("Recover with a quorum reachable: %v, want FailedPrecondition", err)
	}
	t.Logf("refused with a quorum: %v", err)
	if got := len(survivor.Members().Members); got != 3 {
		t.Fatalf("%d members after a refused recovery, want 3", got)
	}

	for _, n := range lost {
		n.Kill()
	}
	leaderless(t, survivor)

	// Only an admin may; and only naming this node's member.
	if _, err := survivor.Curator().Recover(ctx, req); code(err) != codes.PermissionDenied {
		t.Fatalf("Recover as the curator: %v, want PermissionDenied", err)
	}
	wrong := proto.Clone(req).(*consensusv1.RecoverRequest)
	wrong.MemberId = before.MemberId + 1
	if _, err := survivor.Consensus(recoverAdmin).Recover(ctx, wrong); code(err) != codes.FailedPrecondition {
		t.Fatalf("Recover naming another member: %v, want FailedPrecondition", err)
	}

	resp, err := survivor.Consensus(recoverAdmin).Recover(ctx, req)
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	r := resp.Report
	t.Logf("report: %v", r)
	if r.OldMemberId != before.MemberId || r.OldClusterId != before.ClusterId || r.NewClusterId == before.ClusterId || r.NewClusterId == 0 {
		t.Errorf("report: member %s of cluster %s → cluster %s; want member %s of %s → a new cluster",
			types.ID(r.OldMemberId), types.ID(r.OldClusterId), types.ID(r.NewClusterId), types.ID(before.MemberId), types.ID(before.ClusterId))
	}
	if len(r.DroppedMembers) != 2 || r.RecoveredBy != recoverAdmin.String() || r.AppliedIndex == 0 {
		t.Errorf("report: dropped %v, by %q, applied index %d; want the 2 lost members, by %s, the survivor's index", r.DroppedMembers, r.RecoveredBy, r.AppliedIndex, recoverAdmin)
	}
	if _, err := os.Stat(r.KeptDataDir); err != nil {
		t.Errorf("the old data is not kept where the report says: %v", err)
	}

	after := survivor.Status()
	if after.State != consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING || !after.Leader || after.ClusterId != r.NewClusterId {
		t.Fatalf("after the recovery: %v, want the running leader of cluster %s", after, types.ID(r.NewClusterId))
	}
	ms := survivor.Members()
	if len(ms.Members) != 1 || ms.Members[0].Learner {
		t.Fatalf("members after the recovery: %v, want this one voter", ms.Members)
	}
	newCli := c.Etcd(survivor.ClientURL)
	checkKeys(t, newCli, written)
	put, err := newCli.Put(ctx, "/curia/test/after", "x")
	if err != nil {
		t.Fatal(err)
	}
	if put.Header.Revision <= r.NewRevision {
		t.Errorf("first write after the recovery at revision %d, want past %d + %d: revisions seen by the lost majority could be reused", put.Header.Revision, r.Revision, r.RevisionBump)
	}
	// The record: superseded old cluster, report, audit event.
	sup, err := newCli.Get(ctx, keys.Superseded(before.ClusterId))
	if err != nil || len(sup.Kvs) != 1 {
		t.Fatalf("superseded record: %v %v", sup, err)
	}
	ev := lastAudit(t, newCli)
	if ev.Action != auditv1.AuditAction_AUDIT_ACTION_CLUSTER_RECOVER || ev.Actor != recoverAdmin.String() {
		t.Errorf("last audit event %v, want the recovery by %s", ev, recoverAdmin)
	}

	// An old member comes back with its data: it cannot join the new
	// cluster, and its node may wipe it.
	old := lost[0]
	old.Start()
	ct.Eventually(t, 30*time.Second, func() error {
		_, err := old.Self().Leave(ctx, &consensusv1.LeaveRequest{})
		return err
	})
	if got := len(survivor.Members().Members); got != 1 {
		t.Errorf("%d members after an old member came back, want 1", got)
	}
	if st := old.Status(); st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE {
		t.Errorf("the old member after Leave: %v, want IDLE (wiped)", st)
	}
}

func lastAudit(t *testing.T, cli *clientv3.Client) *auditv1.Event {
	t.Helper()
	resp, err := cli.Get(context.Background(), keys.AuditPrefix, clientv3.WithLastKey()...)
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("audit log: %v", err)
	}
	ev := &auditv1.Event{}
	if err := proto.Unmarshal(resp.Kvs[0].Value, ev); err != nil {
		t.Fatal(err)
	}
	return ev
}

// TestRestoreSnapshot: with every voter gone, a snapshot becomes a new
// cluster on a node with no data; a damaged snapshot changes nothing; a
// node whose member has a quorum refuses.
func TestRestoreSnapshot(t *testing.T) {
	proctest.SkipShort(t)
	c := ct.NewCluster(t)
	nodes, _ := c.Voters(1)
	cli := c.Etcd(nodes[0].ClientURL)
	written := writeKeys(t, cli, 20)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The running member records its cluster's id in the data, which the
	// snapshot carries.
	original := nodes[0].Status().ClusterId
	ct.Eventually(t, 30*time.Second, func() error {
		resp, err := cli.Get(ctx, keys.ClusterID)
		if err != nil || len(resp.Kvs) == 0 {
			return fmt.Errorf("no %s yet (%v)", keys.ClusterID, err)
		}
		return nil
	})
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}

	header := func(n *ct.Node) *consensusv1.RestoreSnapshotRequest {
		return &consensusv1.RestoreSnapshotRequest{Msg: &consensusv1.RestoreSnapshotRequest_Header{Header: &consensusv1.RestoreSnapshotHeader{
			NodeId: n.ID, Reason: "test: every voter lost", SnapshotName: "test",
		}}}
	}
	send := func(n *ct.Node, data []byte) (*consensusv1.RestoreSnapshotResponse, error) {
		s, err := n.Consensus(recoverAdmin).RestoreSnapshot(ctx)
		if err != nil {
			return nil, err
		}
		if err := s.Send(header(n)); err != nil {
			return nil, err
		}
		for b := range slices.Chunk(data, 64<<10) {
			if err := s.Send(&consensusv1.RestoreSnapshotRequest{Msg: &consensusv1.RestoreSnapshotRequest_Chunk{Chunk: b}}); err != nil {
				return nil, err
			}
		}
		return s.CloseAndRecv()
	}

	// The live member has a quorum (its own): refused.
	if _, err := send(nodes[0], snap); code(err) != codes.FailedPrecondition {
		t.Fatalf("RestoreSnapshot on a member with a quorum: %v, want FailedPrecondition", err)
	}
	nodes[0].Kill()

	fresh := c.NewNode()
	// Damaged in any page's header or first element (bbolt panics on
	// some such damage, in a goroutine of its own that nothing recovers:
	// the hash is checked before the database is opened), in the hash, or
	// cut short.
	var at []int
	for page := 0; page*4096 < len(snap)-sha256.Size; page++ {
		for _, off := range []int{0, 16, 20, 24} {
			at = append(at, page*4096+off)
		}
	}
	for _, i := range append(at, len(snap)-1) {
		damaged := bytes.Clone(snap)
		damaged[i] ^= 0xff
		if _, err := send(fresh, damaged); code(err) != codes.InvalidArgument {
			t.Fatalf("RestoreSnapshot of a snapshot damaged at byte %d: %v, want InvalidArgument", i, err)
		}
	}
	if _, err := send(fresh, snap[:len(snap)-4096]); code(err) != codes.InvalidArgument {
		t.Fatalf("RestoreSnapshot of a snapshot cut short: %v, want InvalidArgument", err)
	}
	if st := fresh.Status(); st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE {
		t.Fatalf("after a refused restore: %v, want IDLE", st)
	}
	if _, err := os.Stat(filepath.Join(fresh.DataDir, "etcd")); err == nil {
		t.Fatal("a refused restore left etcd data")
	}

	resp, err := send(fresh, snap)
	if err != nil {
		t.Fatalf("RestoreSnapshot: %v", err)
	}
	t.Logf("report: %v", resp.Report)
	if st := fresh.Status(); !st.Leader || st.ClusterId != resp.Report.NewClusterId {
		t.Fatalf("after the restore: %v, want the leader of cluster %s", st, types.ID(resp.Report.NewClusterId))
	}
	checkKeys(t, c.Etcd(fresh.ClientURL), written)
	// The fresh node knew no cluster; the data named the one it was taken
	// of, and the new cluster records that it superseded it: clients
	// pinned to the old one follow (platform/etcdpin).
	if resp.Report.OldClusterId != original {
		t.Fatalf("report's old cluster %s, want the snapshot's %s", types.ID(resp.Report.OldClusterId), types.ID(original))
	}
	got, err := c.Etcd(fresh.ClientURL).Get(ctx, keys.Superseded(original))
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != types.ID(resp.Report.NewClusterId).String() {
		t.Fatalf("superseded record of %s: %v, %v; want %s", types.ID(original), got, err, types.ID(resp.Report.NewClusterId))
	}
}

// TestRecoverFinishesAfterCrash: a recovery whose process dies after the
// restore (before the swap, or before the record) is finished by the
// process's next start: the new cluster runs, with the record.
func TestRecoverFinishesAfterCrash(t *testing.T) {
	proctest.SkipShort(t)
	for _, point := range []string{"recover-before-swap", "recover-before-record"} {
		t.Run(point, func(t *testing.T) {
			c := ct.NewCluster(t)
			nodes, _ := c.Voters(3)
			survivor := nodes[0]
			written := writeKeys(t, c.Etcd(survivor.ClientURL), 10)
			before := survivor.Status()
			for _, n := range nodes[1:] {
				n.Kill()
			}
			leaderless(t, survivor)
			survivor.ArmCrash(point)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := survivor.Consensus(recoverAdmin).Recover(ctx, &consensusv1.RecoverRequest{MemberId: before.MemberId, Reason: "test: crash"}); err == nil {
				t.Fatal("Recover succeeded through an armed crash")
			}
			ct.Eventually(t, 30*time.Second, func() error {
				if survivor.Running() {
					return errors.New("still running")
				}
				return nil
			})
			survivor.Start()
			var cli *clientv3.Client
			ct.Eventually(t, time.Minute, func() error {
				st := survivor.Status()
				if !st.Leader || st.ClusterId == before.ClusterId {
					return fmt.Errorf("not yet the leader of a new cluster: %v", st)
				}
				if cli == nil {
					cli = c.Etcd(survivor.ClientURL)
				}
				resp, err := cli.Get(ctx, keys.Superseded(before.ClusterId))
				if err != nil || len(resp.Kvs) == 0 {
					return fmt.Errorf("no superseded record yet (%v)", err)
				}
				return nil
			})
			checkKeys(t, cli, written)
			if ev := lastAudit(t, cli); ev.Action != auditv1.AuditAction_AUDIT_ACTION_CLUSTER_RECOVER {
				t.Errorf("last audit event %v, want the recovery", ev)
			}
		})
	}
}

// TestRecoveryFencesOldMembers: two voters lost to a recovery come back
// together with their data. Between them they hold the old cluster's
// quorum; but the reconciler revoked their member certificates when it took
// their roles, and a member kept on disk restarts only after the curators'
// revocation list: neither runs etcd again. (What is left is their nodes'
// Leave, which asks the curators, as in the e2e TestRecovery.)
func TestRecoveryFencesOldMembers(t *testing.T) {
	proctest.SkipShort(t)
	c := ct.NewCluster(t)
	curators := serveCRL(t, c.PKI)
	c.Flags = append(c.Flags, "--curator", curators.addr, "--restart-crl-wait", "30s")
	nodes, _ := c.Voters(3)
	survivor, lost := nodes[0], nodes[1:]
	// What the reconciler does once the recovered cluster runs: the lost
	// members' nodes lose ConsensusMember, and with it their member
	// certificates.
	certs := recoverDroppingLost(t, survivor, lost)
	curators.revoke(t, certs...)

	// The curators answer slower than etcd elects a leader (a loaded
	// machine): without waiting for their list, the two old members would
	// be connected to each other before it came, and etcd checks the list
	// only on new connections.
	curators.setDelay(3 * time.Second)
	for _, n := range lost {
		n.Start()
	}
	ct.Eventually(t, time.Minute, func() error {
		for _, n := range lost {
			st := n.Status()
			if st.LeaderId != 0 || st.State == consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING {
				t.Fatalf("%s's old member runs again (%v, leader %s): the old cluster's quorum is back", n.ID, st.State, types.ID(st.LeaderId))
			}
			if st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_STOPPED {
				return fmt.Errorf("%s: %v (%s), want STOPPED", n.ID, st.State, st.StateReason)
			}
		}
		return nil
	})
	for _, n := range lost {
		t.Logf("%s: %s", n.ID, n.Status().StateReason)
	}
	if got := len(survivor.Members().Members); got != 1 {
		t.Errorf("%d members after the old members came back, want 1", got)
	}
}

// TestRecoveryFencesOldMembersBehindList (issue 29, N2): as
// TestRecoveryFencesOldMembers, but the two old members kept a list newer
// than the curators' (the cluster's state stepped back), so the list that
// revokes them is numbered below theirs and they refuse it as older. A
// list older than the one kept does not end the restart's wait: they stay
// stopped and say why.
func TestRecoveryFencesOldMembersBehindList(t *testing.T) {
	proctest.SkipShort(t)
	c := ct.NewCluster(t)
	curators := serveCRL(t, c.PKI)
	c.Flags = append(c.Flags, "--curator", curators.addr, "--restart-crl-wait", "3s")
	nodes, _ := c.Voters(3)
	survivor, lost := nodes[0], nodes[1:]
	// The members' list grows to number 3 (revoking nothing of theirs),
	// and each keeps it on disk.
	cli := c.Etcd(survivor.ClientURL)
	for range 3 {
		c.PKI.Revoke(t, cli)
	}
	for _, n := range lost {
		ct.Eventually(t, 30*time.Second, func() error {
			der, err := os.ReadFile(filepath.Join(n.DataDir, "crl.der"))
			if err != nil {
				return err
			}
			l, err := x509.ParseRevocationList(der)
			if err != nil {
				return err
			}
			if l.Number.Cmp(big.NewInt(3)) < 0 {
				return fmt.Errorf("%s keeps CRL %v, want 3", n.ID, l.Number)
			}
			return nil
		})
	}
	certs := recoverDroppingLost(t, survivor, lost)
	curators.revoke(t, certs...) // number 1: below the kept 3
	for _, n := range lost {
		n.Start()
	}
	ct.Eventually(t, time.Minute, func() error {
		for _, n := range lost {
			st := n.Status()
			if st.LeaderId != 0 || st.State == consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING {
				t.Fatalf("%s's old member runs again (%v, leader %s): a list older than the kept one ended its wait", n.ID, st.State, types.ID(st.LeaderId))
			}
			if st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_STOPPED {
				return fmt.Errorf("%s: %v (%s), want STOPPED", n.ID, st.State, st.StateReason)
			}
			if !strings.Contains(st.StateReason, "older than the one this member kept") {
				t.Fatalf("%s stopped for another reason: %s", n.ID, st.StateReason)
			}
		}
		return nil
	})
	for _, n := range lost {
		t.Logf("%s: %s", n.ID, n.Status().StateReason)
	}
}

// crlServer serves Curator/WatchCRL, as every curator replica does, with a
// list the test signs.
type crlServer struct {
	curatorv1.UnimplementedCuratorServer
	pki  *ct.PKI
	addr string

	mu      sync.Mutex
	delay   time.Duration // before a stream's first list
	list    []byte
	number  int64
	revoked []x509.RevocationListEntry
	changed chan struct{}
}

func serveCRL(t *testing.T, k *ct.PKI) *crlServer {
	t.Helper()
	initial, err := os.ReadFile(filepath.Join(k.Dir, pki.CRLFile))
	if err != nil {
		t.Fatal(err)
	}
	s := &crlServer{pki: k, list: initial, changed: make(chan struct{})}
	srv, err := rpc.NewServer(rpc.ServerConfig{
		Credentials:    k.Creds(t, pki.Principal{Kind: pki.KindCurator}),
		AllowEnrolling: true,
		Policy: rpc.Policy{curatorv1.Curator_WatchCRL_FullMethodName: {Allow: []pki.Kind{
			pki.KindConsensus, pki.KindMember, pki.KindEnrolling,
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	curatorv1.RegisterCuratorServer(srv.GRPC(), s)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = lis.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return s
}

// revoke publishes a newer list that also revokes certs.
func (s *crlServer) revoke(t *testing.T, certs ...*x509.Certificate) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range certs {
		s.revoked = append(s.revoked, x509.RevocationListEntry{SerialNumber: c.SerialNumber, RevocationTime: time.Now()})
	}
	s.number++
	list, err := s.pki.CA.CRL(s.revoked, big.NewInt(s.number), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s.list = list
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *crlServer) setDelay(d time.Duration) {
	s.mu.Lock()
	s.delay = d
	s.mu.Unlock()
}

func (s *crlServer) WatchCRL(_ *curatorv1.WatchCRLRequest, stream curatorv1.Curator_WatchCRLServer) error {
	s.mu.Lock()
	delay := s.delay
	s.mu.Unlock()
	select {
	case <-stream.Context().Done():
		return nil
	case <-time.After(delay):
	}
	for {
		s.mu.Lock()
		list, changed := s.list, s.changed
		s.mu.Unlock()
		if err := stream.Send(&curatorv1.WatchCRLResponse{Crl: list}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// recoverDroppingLost kills the lost voters, recovers the cluster from the
// survivor and returns the lost members' certificates (for the test to
// revoke, as the reconciler would).
func recoverDroppingLost(t *testing.T, survivor *ct.Node, lost []*ct.Node) []*x509.Certificate {
	t.Helper()
	before := survivor.Status()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, n := range lost {
		n.Kill()
	}
	leaderless(t, survivor)
	if _, err := survivor.Consensus(recoverAdmin).Recover(ctx, &consensusv1.RecoverRequest{MemberId: before.MemberId, Reason: "test: two voters lost"}); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	var certs []*x509.Certificate
	for _, n := range lost {
		b, err := os.ReadFile(n.MemberCert)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := pki.ParseCertPEM(b)
		if err != nil {
			t.Fatal(err)
		}
		certs = append(certs, cert)
	}
	return certs
}
