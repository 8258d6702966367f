package snaps

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
	"curia.dev/platform/rpcerr"
	"curia.dev/platform/snapshots"
)

// Taking one snapshot, for the leader (snaps.go):
//
//  1. Choose a member: a voter the client uses (the curator keeps the
//     client on the voters that answer) that answers its status, a
//     follower when one does (the etcd leader has the most to do). Its
//     status gives its id and its revision before; the member list and
//     the joining records name every member.
//  2. Read etcd's Maintenance.Snapshot from that member alone, into a .part
//     file of the directory, as is: the database, then its sha256. The
//     trailer must match the data, and the size be a database's plus the
//     trailer (what etcdutl's restore checks).
//  3. Sync; ask the member for its revision after.
//  4. Verify with etcdutl's snapshot status: the database opens, its bolt
//     structure checks, it fills the stream but the trailer, and its
//     revision lies between the member's before and after (the snapshot is
//     of that member at one moment in between).
//  5. Still leading: rename the .part to <name>.db, then write <name>.json.
//     The .json makes it a snapshot; until then it is a leftover.

// snapshotSource is the member a snapshot is read from.
type snapshotSource struct {
	endpoint string
	member   snapshots.Member
	// revision is the member's revision before the snapshot.
	revision int64
}

// snapshotStatusTimeout bounds each status call of a snapshot.
const snapshotStatusTimeout = 5 * time.Second

// snapshot takes, verifies and writes one snapshot (the file comment),
// then applies the retention.
func (sn *Snapshotter) snapshot(ctx context.Context, req request) (snapshots.Metadata, error) {
	if _, _, ok := sn.Lead.Ours(); !ok {
		return snapshots.Metadata{}, rpcerr.NotLeader
	}
	failpoint.Hold("before-snapshot")
	members, err := sn.members(ctx)
	if err != nil {
		return snapshots.Metadata{}, err
	}
	src, err := sn.source(ctx, members)
	if err != nil {
		return snapshots.Metadata{}, err
	}
	takenAt := time.Now().UTC()
	part, sum, size, err := sn.download(ctx, src.endpoint)
	if err != nil {
		return snapshots.Metadata{}, err
	}
	keep := false
	defer func() {
		if !keep {
			os.Remove(part)
		}
	}()
	after, err := sn.memberRevision(ctx, src.endpoint)
	if err != nil {
		return snapshots.Metadata{}, err
	}
	st, err := etcdutl.NewV3(zap.NewNop()).Status(part)
	if err != nil {
		return snapshots.Metadata{}, fmt.Errorf("%w: the snapshot read from member %s does not open as an etcd database: %v", rpcerr.Unavailable, src.member.ID, err)
	}
	if st.TotalSize != size-sha256.Size {
		return snapshots.Metadata{}, fmt.Errorf("%w: the snapshot read from member %s is a database of %d bytes in a stream of %d", rpcerr.Unavailable, src.member.ID, st.TotalSize, size)
	}
	if st.Revision < max(src.revision, 1) || st.Revision > after {
		return snapshots.Metadata{}, fmt.Errorf("%w: the snapshot read from member %s holds revision %d, but the member was at revisions %d to %d while it was read", rpcerr.Unavailable, src.member.ID, st.Revision, src.revision, after)
	}
	md := snapshots.Metadata{
		Name: snapshots.Name(takenAt, st.Revision), TakenAt: takenAt, Revision: st.Revision,
		Source: src.member, Members: members,
		Size: size, SHA256: hex.EncodeToString(sum),
		EtcdHash: st.Hash, TotalKeys: st.TotalKey, StorageVersion: st.Version,
		Trigger: req.trigger, Reason: req.reason, RequestedBy: req.requestedBy,
		TakenBy: sn.Name, Cluster: sn.Cluster,
	}
	if _, _, ok := sn.Lead.Ours(); !ok {
		return snapshots.Metadata{}, fmt.Errorf("%w: leadership moved while the snapshot was taken; it is dropped", rpcerr.NotLeader)
	}
	if same, err := sn.dir.Read(md.Name); err == nil {
		// Taken in the same second at the same revision: the same data.
		return same, nil
	}
	if err := os.Rename(part, sn.dir.DB(md.Name)); err != nil {
		return snapshots.Metadata{}, sn.fsError("name the snapshot", err)
	}
	keep = true
	if err := snapshots.SyncDir(sn.cfg.Dir); err != nil {
		return snapshots.Metadata{}, sn.fsError("sync the snapshot directory", err)
	}
	if err := sn.dir.WriteMeta(md); err != nil {
		return snapshots.Metadata{}, sn.fsError("write the snapshot's metadata", err)
	}
	sn.prune(time.Now())
	return md, nil
}

// fsError is a failure of the snapshot directory: the operator's to fix.
func (sn *Snapshotter) fsError(what string, err error) error {
	return fmt.Errorf("%w: %s in %s: %v", rpcerr.Refused, what, sn.cfg.Dir, err)
}

// members is etcd's member list; a learner that never started is named
// by its joining record.
func (sn *Snapshotter) members(ctx context.Context) ([]snapshots.Member, error) {
	list, err := sn.Etcd.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: list etcd members: %v", rpcerr.Unavailable, err)
	}
	joining, err := sn.Etcd.Get(ctx, keys.MembershipJoining, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("%w: read the joining records: %v", rpcerr.Unavailable, err)
	}
	nodeOf := map[string]string{}
	for _, kv := range joining.Kvs {
		if url, err := keys.JoiningPeerURL(string(kv.Key)); err == nil {
			nodeOf[url] = string(kv.Value)
		}
	}
	var out []snapshots.Member
	for _, m := range list.Members {
		sm := snapshots.Member{ID: snapshots.FormatID(m.ID), Name: m.Name, PeerURLs: m.PeerURLs, Learner: m.IsLearner}
		if sm.Name == "" && len(m.PeerURLs) > 0 {
			sm.Name = nodeOf[m.PeerURLs[0]]
		}
		out = append(out, sm)
	}
	return out, nil
}

// source chooses the member to read the snapshot from: a voter among the
// client's endpoints that answers, a follower when one does.
func (sn *Snapshotter) source(ctx context.Context, members []snapshots.Member) (snapshotSource, error) {
	var leader *snapshotSource
	var last error
	for _, ep := range sn.Etcd.Endpoints() {
		sctx, cancel := context.WithTimeout(ctx, snapshotStatusTimeout)
		st, err := sn.Member.Status(sctx, ep)
		cancel()
		if err != nil {
			last = err
			continue
		}
		src := snapshotSource{endpoint: ep, revision: st.Header.Revision, member: snapshots.Member{ID: snapshots.FormatID(st.Header.MemberId)}}
		for _, m := range members {
			if m.ID == src.member.ID {
				src.member = m
			}
		}
		if st.Leader != st.Header.MemberId {
			return src, nil
		}
		leader = &src
	}
	if leader != nil {
		return *leader, nil
	}
	return snapshotSource{}, fmt.Errorf("%w: no etcd member to read a snapshot from answered (endpoints %v): %v", rpcerr.Unavailable, sn.Etcd.Endpoints(), last)
}

// memberRevision is the revision of the member at endpoint, now.
func (sn *Snapshotter) memberRevision(ctx context.Context, endpoint string) (int64, error) {
	sctx, cancel := context.WithTimeout(ctx, snapshotStatusTimeout)
	defer cancel()
	st, err := sn.Member.Status(sctx, endpoint)
	if err != nil {
		return 0, fmt.Errorf("%w: status of etcd member %s after its snapshot: %v", rpcerr.Unavailable, endpoint, err)
	}
	return st.Header.Revision, nil
}

// download reads etcd's snapshot stream from the member at endpoint into a
// .part file of the directory, synced, and returns its path, the sha256 of
// the whole file and its size. The stream ends with the sha256 of what came
// before: it must match.
func (sn *Snapshotter) download(ctx context.Context, endpoint string) (path string, sum []byte, size int64, err error) {
	cc, err := sn.Member.Dial(endpoint)
	if err != nil {
		return "", nil, 0, fmt.Errorf("%w: dial etcd member %s: %v", rpcerr.Unavailable, endpoint, err)
	}
	defer cc.Close()
	stream, err := etcdserverpb.NewMaintenanceClient(cc).Snapshot(ctx, &etcdserverpb.SnapshotRequest{})
	if err != nil {
		return "", nil, 0, fmt.Errorf("%w: ask etcd member %s for a snapshot: %v", rpcerr.Unavailable, endpoint, err)
	}
	f, err := sn.dir.CreatePart()
	if err != nil {
		return "", nil, 0, sn.fsError("create a file", err)
	}
	path = f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(path)
		}
	}()
	whole, body := sha256.New(), sha256.New()
	var tail []byte // the last sha256.Size bytes so far: the trailer, once the stream ends
	for {
		resp, rerr := stream.Recv()
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return "", nil, 0, fmt.Errorf("%w: read the snapshot of etcd member %s: %v", rpcerr.Unavailable, endpoint, rerr)
		}
		blob := resp.GetBlob()
		if _, err := f.Write(blob); err != nil {
			return "", nil, 0, sn.fsError("write the snapshot", err)
		}
		whole.Write(blob)
		size += int64(len(blob))
		tail = append(tail, blob...)
		if n := len(tail) - sha256.Size; n > 0 {
			body.Write(tail[:n])
			tail = append(tail[:0], tail[n:]...)
		}
	}
	// etcd's restore takes a file whose size is 32 past a multiple of 512
	// as a database with its sha256 (etcdutl hasChecksum).
	if len(tail) != sha256.Size || size%512 != sha256.Size || !bytes.Equal(tail, body.Sum(nil)) {
		return "", nil, 0, fmt.Errorf("%w: the snapshot of etcd member %s (%d bytes) does not end with the sha256 of its data", rpcerr.Unavailable, endpoint, size)
	}
	if err := f.Sync(); err != nil {
		return "", nil, 0, sn.fsError("sync the snapshot", err)
	}
	if err := f.Close(); err != nil {
		return "", nil, 0, sn.fsError("close the snapshot", err)
	}
	return path, whole.Sum(nil), size, nil
}
