package consensus

// Quorum-loss recovery (Recover, RestoreSnapshot).
//
// When a majority of the voters is gone for good, no membership change can
// be made: etcd needs a quorum for every one. What is left is the data of
// the survivors (or a snapshot). A recovery makes one node's member the only
// member of a new cluster built from such data:
//
//	checks        the caller named this node's member (consent); no leader
//	              here for three election timeouts, and no other voter this
//	              process reaches has one (else a quorum is reachable: a
//	              partition or an election, not a loss)
//	restore       etcd stops; its database is restored as a new cluster
//	              (etcdutl's restore: a new cluster id and member id, every
//	              revision bumped and marked compacted) into etcd.restoring,
//	              renamed etcd.recovered once complete, with the report in
//	              recovery.json
//	swap          etcd → etcd.before-recovery-<time> (kept, never deleted);
//	              etcd.recovered → etcd
//	start         etcd restarts from the new data: a single voter
//	record        one transaction: the membership epoch bumped (every
//	              snapshot taken before is stale), the old cluster id marked
//	              superseded, the report and an audit event; a membership
//	              change left pending by the old cluster is resolved from the
//	              new member list
//
// A crash anywhere is finished by the next start of the process
// (finishRecoveryOnDisk, then recordRecovery once etcd runs), never done
// twice: the swap and the record are idempotent.
//
// Why a new cluster id, and why the bump: old members that come back with
// their data cannot talk to the new cluster (etcd's peers check the cluster
// id), and their agents may wipe them once the curators say their node lost
// ConsensusMember (the reconciler takes it: a role without a member): Leave
// accepts the answer of the cluster that superseded theirs. The survivor may
// have missed writes the majority committed; their revisions would be
// reused with other contents, and a watcher that had seen them would skip
// the new ones. With every revision moved a long way forward and marked
// compacted, watchers resume with "compacted" and reload.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/audit"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// defaultRevisionBump is how far a recovery moves revisions forward, as
// etcd's disaster recovery guide advises for Kubernetes: far more than a
// survivor can have missed.
const defaultRevisionBump = 1_000_000_000

// maxSnapshotBytes bounds an uploaded snapshot: etcd's largest backend quota.
const maxSnapshotBytes = 8 << 30

func (x *server) Recover(ctx context.Context, req *consensusv1.RecoverRequest) (*consensusv1.RecoverResponse, error) {
	m := x.s.member
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	st := m.status()
	if !m.hasData() {
		return nil, fmt.Errorf("%w: this node holds no member data (%s): recover on a node that does, or restore a snapshot here (RestoreSnapshot)", errRefused, lifecycle(st))
	}
	if req.GetMemberId() != st.GetMemberId() {
		return nil, fmt.Errorf("%w: this node holds member %s, not %s: name the member whose data you mean to keep (Status member_id)", errRefused, types.ID(st.GetMemberId()), types.ID(req.GetMemberId()))
	}
	if err := x.checkMemberCert(); err != nil {
		return nil, err
	}
	if err := x.checkQuorumLost(ctx); err != nil {
		return nil, err
	}
	r := x.newRecovery(ctx, req.GetReason(), req.GetRevisionBump(), "member data")
	r.OldMemberId, r.OldClusterId = st.GetMemberId(), st.GetClusterId()
	r.AppliedIndex, r.Term = st.GetRaftIndex(), st.GetRaftTerm()
	if e := m.instance(); e != nil {
		r.OldClusterId = uint64(e.Server.Cluster().ID())
		for _, mem := range e.Server.Cluster().Members() {
			if uint64(mem.ID) != st.GetMemberId() {
				r.DroppedMembers = append(r.DroppedMembers, &consensusv1.Member{Id: uint64(mem.ID), NodeId: mem.Name, PeerUrls: mem.PeerURLs, ClientUrls: mem.ClientURLs, Learner: mem.IsLearner})
			}
		}
	}
	m.stop()
	// etcd's database, closed: everything this member applied.
	src := filepath.Join(m.cfg.DataDir, "recover-source.db")
	if err := copyFile(filepath.Join(m.etcdDir(), "member", "snap", "db"), src); err != nil {
		return nil, x.restartAfterFailure(ctx, fmt.Errorf("copy this member's database: %w", err))
	}
	defer os.Remove(src)
	return x.recoverFrom(ctx, src, true, r)
}

func (x *server) RestoreSnapshot(stream consensusv1.Consensus_RestoreSnapshotServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return fmt.Errorf("%w: the first message must be the header (node_id, reason, snapshot_name)", errBadRequest)
	}
	if h.GetNodeId() != x.s.cfg.nodeID {
		return fmt.Errorf("%w: this is node %s, not %s: name the node that is to become the cluster", errRefused, x.s.cfg.nodeID, h.GetNodeId())
	}
	m := x.s.member
	// The new member starts with this process's member certificate.
	if err := x.checkMemberCert(); err != nil {
		return err
	}
	// The upload first, outside the lock (it may take long), to a file of
	// its own (another upload may run meanwhile).
	upload, err := receiveFile(stream, m.cfg.DataDir)
	if upload != "" {
		defer os.Remove(upload)
	}
	if err != nil {
		return err
	}
	if err := verifySnapshotHash(upload); err != nil {
		return err
	}
	if _, err := snapshot.NewV3(m.zap).Status(upload); err != nil {
		return fmt.Errorf("%w: the snapshot does not open as an etcd database: %v", errBadRequest, err)
	}
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	if err := x.checkQuorumLost(ctx); err != nil {
		return err
	}
	r := x.newRecovery(ctx, h.GetReason(), h.GetRevisionBump(), "snapshot "+h.GetSnapshotName())
	st := m.status()
	r.OldMemberId, r.OldClusterId = st.GetMemberId(), st.GetClusterId()
	m.stop()
	resp, err := x.recoverFrom(ctx, upload, false, r)
	if err != nil {
		return err
	}
	return stream.SendAndClose(&consensusv1.RestoreSnapshotResponse{Report: resp.GetReport()})
}

// receiveFile writes the chunks of a RestoreSnapshot stream to a new file
// in dir and returns its path ("" when none was made).
func receiveFile(stream consensusv1.Consensus_RestoreSnapshotServer, dir string) (string, error) {
	f, err := os.CreateTemp(dir, "restore-upload-*.db")
	if err != nil {
		return "", err
	}
	defer f.Close()
	return f.Name(), writeChunks(stream, f)
}

// writeChunks writes the chunks of a RestoreSnapshot stream to f and
// syncs it.
func writeChunks(stream consensusv1.Consensus_RestoreSnapshotServer, f *os.File) error {
	var n int64
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if msg.GetHeader() != nil {
			return fmt.Errorf("%w: a second header: send the header once, then the chunks", errBadRequest)
		}
		if n += int64(len(msg.GetChunk())); n > maxSnapshotBytes {
			return fmt.Errorf("%w: the snapshot is larger than etcd's largest quota (%d bytes)", errBadRequest, int64(maxSnapshotBytes))
		}
		if _, err := f.Write(msg.GetChunk()); err != nil {
			return err
		}
	}
	if n == 0 {
		return fmt.Errorf("%w: no snapshot bytes after the header", errBadRequest)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

// verifySnapshotHash checks the sha256 that etcd's Snapshot stream ends
// with (GetSnapshot's files keep it), before anything opens the database:
// bbolt panics on some damaged files in a goroutine of its own, which
// nothing recovers, and the process would die of a bad upload.
func verifySnapshotHash(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	// etcd's own test (etcdutl's hasChecksum): a database of 512-byte
	// multiples, then the hash.
	n := st.Size() - sha256.Size
	if n <= 0 || n%512 != 0 {
		return fmt.Errorf("%w: %d bytes are no etcd snapshot (a database followed by its sha256, as Management/GetSnapshot copies it)", errBadRequest, st.Size())
	}
	h := sha256.New()
	if _, err := io.CopyN(h, f, n); err != nil {
		return err
	}
	trailer := make([]byte, sha256.Size)
	if _, err := io.ReadFull(f, trailer); err != nil {
		return err
	}
	if !bytes.Equal(h.Sum(nil), trailer) {
		return fmt.Errorf("%w: the snapshot's sha256 does not match its contents: it is damaged or incomplete; nothing changed", errBadRequest)
	}
	return nil
}

// newRecovery starts a report.
func (x *server) newRecovery(ctx context.Context, reason string, bump uint64, source string) *consensusv1.RecoveryReport {
	if bump == 0 {
		bump = defaultRevisionBump
	}
	by := "unknown"
	if p, ok := rpc.PrincipalFromContext(ctx); ok {
		by = p.String()
	}
	return &consensusv1.RecoveryReport{
		NodeId: x.s.cfg.nodeID, Source: source, RevisionBump: bump,
		RecoveredBy: by, Reason: reason, StartedAt: timestamppb.Now(),
	}
}

// checkQuorumLost refuses a recovery while a quorum may be reachable: this
// member follows a leader or hears from one within three election
// timeouts, or another voter it can reach has one. Without its own etcd
// running it can only ask the others.
func (x *server) checkQuorumLost(ctx context.Context) error {
	m := x.s.member
	if e := m.instance(); e != nil {
		window := 3 * m.cfg.ElectionTimeout
		deadline := time.Now().Add(window)
		for {
			if lead := e.Server.Lead(); lead != 0 {
				return fmt.Errorf("%w: this member follows leader %s (term %d): a quorum of voters is reachable, so this is a partition or an election, not a loss; recovery would fork the cluster", errRefused, types.ID(lead), e.Server.Term())
			}
			if time.Now().After(deadline) {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	eps := m.otherVoters()
	if len(eps) == 0 {
		return nil
	}
	creds, err := m.id.memberCreds()
	if err != nil {
		// Without a member certificate, etcd's ports cannot be asked:
		// the operator's check (curia-local recover asks every
		// consensus API and the curators) is what remains.
		x.s.log.Warn("recovery: cannot ask the other voters (no member certificate)", "err", err)
		return nil
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		TLS:         rpc.ClientTLSConfig(creds, []pki.Kind{pki.KindMember}),
		DialTimeout: time.Second,
		Logger:      m.zap,
	})
	if err != nil {
		return nil //nolint:nilerr // nothing reachable: no quorum seen
	}
	defer cli.Close()
	for _, ep := range eps {
		sctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		st, err := cli.Status(sctx, ep)
		cancel()
		if err == nil && st.Leader != 0 {
			return fmt.Errorf("%w: voter %s answers and follows leader %s (term %d): a quorum of voters is reachable, so this is a partition, not a loss; recovery would fork the cluster", errRefused, ep, types.ID(st.Leader), st.RaftTerm)
		}
	}
	return nil
}

// otherVoters are the client URLs of the voters other than this member, as
// its etcd knows them, else as remembered on disk.
func (m *member) otherVoters() []string {
	var eps []string
	if e := m.instance(); e != nil {
		eps = voterEndpoints(e)
	} else {
		m.mu.Lock()
		eps = slices.Clone(m.kept.Endpoints)
		m.mu.Unlock()
	}
	return slices.DeleteFunc(eps, func(u string) bool { return u == m.cfg.AdvertiseClientURL })
}

// instance is the current etcd instance (running or starting), or nil.
func (m *member) instance() *embed.Etcd {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etcd
}

// recoverFrom restores db (etcd stopped) as this node's new single-member
// cluster and records it. On failure before the swap, the member's old
// data restarts as it was.
func (x *server) recoverFrom(ctx context.Context, db string, skipHashCheck bool, r *consensusv1.RecoveryReport) (*consensusv1.RecoverResponse, error) {
	m := x.s.member
	st, err := snapshot.NewV3(m.zap).Status(db)
	if err != nil {
		return nil, x.restartAfterFailure(ctx, fmt.Errorf("%w: read the database to restore: %v", errBadRequest, err))
	}
	r.Revision = st.Revision
	r.NewRevision = st.Revision + int64(r.GetRevisionBump()) //nolint:gosec // G115: a bump past int64 fails in etcd's restore first
	restoring, recovered := m.etcdDir()+".restoring", m.etcdDir()+".recovered"
	for _, d := range []string{restoring, recovered} {
		if err := os.RemoveAll(d); err != nil {
			return nil, x.restartAfterFailure(ctx, err)
		}
	}
	err = snapshot.NewV3(m.zap).Restore(snapshot.RestoreConfig{
		SnapshotPath:        db,
		Name:                x.s.cfg.nodeID,
		OutputDataDir:       restoring,
		PeerURLs:            []string{x.s.cfg.AdvertisePeerURL},
		InitialCluster:      x.s.cfg.nodeID + "=" + x.s.cfg.AdvertisePeerURL,
		InitialClusterToken: fmt.Sprintf("%s/recovered/%d", x.s.cfg.Cluster, time.Now().UnixNano()),
		SkipHashCheck:       skipHashCheck,
		RevisionBump:        r.GetRevisionBump(),
		MarkCompacted:       true,
	})
	if err != nil {
		os.RemoveAll(restoring)
		if !skipHashCheck {
			err = fmt.Errorf("%w: %v (is it a whole snapshot, as GetSnapshot streams it?)", errBadRequest, err)
		}
		return nil, x.restartAfterFailure(ctx, fmt.Errorf("restore the database as a new cluster: %w", err))
	}
	if err := m.writeRecoveryReport(r); err != nil {
		return nil, x.restartAfterFailure(ctx, err)
	}
	if err := os.Rename(restoring, recovered); err != nil {
		return nil, x.restartAfterFailure(ctx, err)
	}
	failpoint.Crash("recover-before-swap")
	kept, err := m.finishRecoveryOnDisk()
	if err != nil {
		return nil, err
	}
	r.KeptDataDir = kept
	if err := m.writeRecoveryReport(r); err != nil {
		return nil, err
	}
	x.s.log.Warn("recovery: restored as a new single-member cluster; starting it", "source", r.GetSource(), "revision", r.GetRevision(), "bump", r.GetRevisionBump(), "old_data", kept)
	sctx, cancel := context.WithTimeout(ctx, x.s.cfg.StartTimeout)
	defer cancel()
	if err := m.start(sctx, modeRestart, ""); err != nil {
		return nil, fmt.Errorf("start the recovered member (the next start of this process retries): %w", err)
	}
	failpoint.Crash("recover-before-record")
	report, err := x.s.recordRecovery(sctx)
	if err != nil {
		return nil, fmt.Errorf("the recovered member runs, but recording the recovery failed (this process retries it): %w", err)
	}
	return &consensusv1.RecoverResponse{Report: report}, nil
}

// restartAfterFailure restarts the member's own data after a recovery
// failed before touching it, and returns err.
func (x *server) restartAfterFailure(ctx context.Context, err error) error {
	m := x.s.member
	if m.hasData() && m.instance() == nil {
		sctx, cancel := context.WithCancel(ctx)
		cancel() // not waited for: it may never find its quorum
		if rerr := m.start(sctx, modeRestart, ""); rerr != nil && !errors.Is(rerr, context.Canceled) {
			x.s.log.Error("recovery failed, and restarting the old member failed too", "err", rerr)
		}
	}
	return err
}

func (m *member) recoveryPath() string { return filepath.Join(m.cfg.DataDir, "recovery.json") }

func (m *member) writeRecoveryReport(r *consensusv1.RecoveryReport) error {
	b, err := protojson.MarshalOptions{Indent: "  "}.Marshal(r)
	if err != nil {
		return err
	}
	return pki.WriteFileAtomic(m.recoveryPath(), b, 0o600)
}

// finishRecoveryOnDisk completes a swap begun by a recovery: a complete
// restore (etcd.recovered) replaces etcd, which is kept as
// etcd.before-recovery-<time>; a partial one (etcd.restoring) is dropped.
// It returns where the old data went ("" when there was none or no swap).
// It runs with etcd stopped: from a recovery, and at every process start.
func (m *member) finishRecoveryOnDisk() (string, error) {
	if err := os.RemoveAll(m.etcdDir() + ".restoring"); err != nil {
		return "", err
	}
	recovered := m.etcdDir() + ".recovered"
	if _, err := os.Stat(recovered); err != nil {
		return "", nil //nolint:nilerr // no swap to finish
	}
	kept := ""
	if _, err := os.Stat(m.etcdDir()); err == nil {
		kept = m.etcdDir() + ".before-recovery-" + time.Now().UTC().Format("20060102T150405Z")
		if err := os.Rename(m.etcdDir(), kept); err != nil {
			return "", fmt.Errorf("move the old data aside: %w", err)
		}
	}
	if err := os.Rename(recovered, m.etcdDir()); err != nil {
		return "", fmt.Errorf("put the recovered data in place: %w", err)
	}
	m.mu.Lock()
	m.kept = persisted{Endpoints: []string{m.cfg.AdvertiseClientURL}}
	err := m.save()
	m.mu.Unlock()
	return kept, err
}

// recordRecovery writes the record of a recovery whose report waits on
// disk, once the recovered member runs: the membership epoch bumped, the
// old cluster superseded, the report, an audit event. A membership change
// the old cluster left pending is resolved from the new member list.
func (s *Service) recordRecovery(ctx context.Context) (*consensusv1.RecoveryReport, error) {
	m := s.member
	b, err := os.ReadFile(m.recoveryPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r := &consensusv1.RecoveryReport{}
	if err := protojson.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("read %s: %w", m.recoveryPath(), err)
	}
	e, cli, err := m.running()
	if err != nil {
		return nil, err
	}
	r.NewMemberId, r.NewClusterId = uint64(e.Server.MemberID()), uint64(e.Server.Cluster().ID())
	if r.GetOldClusterId() == 0 {
		// A restore onto a member that knew no cluster (its data wiped):
		// the data says which cluster it was taken of.
		if resp, err := cli.Get(ctx, keys.ClusterID); err == nil && len(resp.Kvs) > 0 {
			if id, err := types.IDFromString(strings.TrimSpace(string(resp.Kvs[0].Value))); err == nil && uint64(id) != r.GetNewClusterId() {
				r.OldClusterId = uint64(id)
			}
		}
	}
	r.FinishedAt = timestamppb.Now()
	value, err := proto.Marshal(r)
	if err != nil {
		return nil, err
	}
	ops := []clientv3.Op{
		clientv3.OpPut(keys.MembershipEpoch, s.recorder()),
		clientv3.OpPut(keys.ClusterID, types.ID(r.GetNewClusterId()).String()),
		clientv3.OpPut(keys.RecoveryReport(r.GetFinishedAt().AsTime()), string(value)),
		audit.Put(&auditv1.Event{
			Actor: r.GetRecoveredBy(), RecordedBy: s.recorder(), Action: auditv1.AuditAction_AUDIT_ACTION_CLUSTER_RECOVER,
			NodeId: r.GetNodeId(), MemberId: r.GetNewMemberId(), Reason: describeRecovery(r),
		}),
	}
	if r.GetOldClusterId() != 0 && r.GetOldClusterId() != r.GetNewClusterId() {
		ops = append(ops, clientv3.OpPut(keys.Superseded(r.GetOldClusterId()), types.ID(r.GetNewClusterId()).String()))
	}
	if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		return nil, fmt.Errorf("record the recovery: %w", err)
	}
	if err := os.Remove(m.recoveryPath()); err != nil {
		return nil, err
	}
	// A change the old cluster left pending: its recorder was of the
	// old cluster. Resolved from the new member list at once.
	if err := s.resolvePending(ctx, cli, true); err != nil {
		s.log.Warn("recovery: resolve the membership change the old cluster left pending (the pending follower retries)", "err", err)
	}
	s.log.Warn("recovery recorded", "report", describeRecovery(r))
	return r, nil
}

// describeRecovery is the report in words.
func describeRecovery(r *consensusv1.RecoveryReport) string {
	var dropped []string
	for _, d := range r.GetDroppedMembers() {
		dropped = append(dropped, fmt.Sprintf("%s (%s)", types.ID(d.GetId()), d.GetNodeId()))
	}
	return fmt.Sprintf("recovered by %s from %s of node %s (member %s of cluster %s, applied index %d, term %d, revision %d): new cluster %s, member %s, revisions bumped by %d to %d; dropped members: %s; reason: %s",
		r.GetRecoveredBy(), r.GetSource(), r.GetNodeId(), types.ID(r.GetOldMemberId()), types.ID(r.GetOldClusterId()), r.GetAppliedIndex(), r.GetTerm(), r.GetRevision(),
		types.ID(r.GetNewClusterId()), types.ID(r.GetNewMemberId()), r.GetRevisionBump(), r.GetNewRevision(), strings.Join(dropped, ", "), r.GetReason())
}

func lifecycle(st *consensusv1.StatusResponse) string {
	s := strings.ToLower(strings.TrimPrefix(st.GetState().String(), "LIFECYCLE_STATE_"))
	if st.GetStateReason() != "" {
		s += ": " + st.GetStateReason()
	}
	return s
}

// copyFile copies src to dst and syncs it.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if _, err := io.Copy(out, in); err != nil {
		return err
	}
	if err := out.Sync(); err != nil {
		return err
	}
	return out.Close()
}
