package recovery

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/offsite"
	"curia.dev/platform/snapshots"
)

// Snapshot is a snapshot file that passed its checks.
type Snapshot struct {
	// Path is the local file.
	Path string
	// Name is the snapshot's name: its file name without .db.
	Name string
	// Size and SHA256 (hex, of the whole file) are what was checked.
	Size   int64
	SHA256 string
	// Metadata is the .json beside the file (curators' snapshot
	// directory), when there is one; the file matched its size and sha256.
	Metadata *snapshots.Metadata
}

// ResolveOptions say how to resolve a snapshot argument.
type ResolveOptions struct {
	// Dir is where a remote snapshot is fetched to, in a directory of its
	// own (default: the system's temporary directory).
	Dir string
	// S3 reaches the object storage of an s3:// snapshot; what it leaves
	// empty comes from $CURIA_S3_ENDPOINT, $CURIA_S3_ACCESS_KEY,
	// $CURIA_S3_SECRET_KEY (and $CURIA_S3_INSECURE=true).
	S3 offsite.Options
}

// ResolveSnapshot turns a snapshot argument into a local file that passed
// its checks: etcd's snapshot stream as Management/GetSnapshot and the
// curators' snapshot directory hold it (a bbolt database of whole 512-byte
// pages, then the sha256 of them, which etcd checks on restore), and, when
// a <name>.json lies beside it, the size and sha256 that metadata
// records. Every snapshot argument curiactl and curia-local take goes
// through here. An s3:// argument (the curators' off-site copies,
// platform/offsite: s3://bucket/prefix/NAME, or s3://bucket/prefix for the
// newest) is fetched first, and kept only if its size and sha256 match
// the object's metadata.
func ResolveSnapshot(ctx context.Context, ref string, opts ResolveOptions) (*Snapshot, error) {
	if strings.Contains(ref, "://") {
		return fetchSnapshot(ctx, ref, opts)
	}
	return CheckSnapshotFile(ref)
}

// fetchSnapshot fetches an s3:// snapshot into a new directory in
// opts.Dir, as <name>.db, then checks it as a local file.
func fetchSnapshot(ctx context.Context, ref string, opts ResolveOptions) (*Snapshot, error) {
	dir, err := os.MkdirTemp(cmp.Or(opts.Dir, os.TempDir()), "offsite-")
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", ref, err)
	}
	// The name is known once fetched (the newest under a prefix).
	tmp := filepath.Join(dir, "fetching.db")
	md, err := offsite.Fetch(ctx, ref, opts.S3, tmp)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("snapshot %s: %w", ref, err)
	}
	path := filepath.Join(dir, md.Name+".db")
	if err := os.Rename(tmp, path); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("snapshot %s: %w", ref, err)
	}
	return CheckSnapshotFile(path)
}

// CheckSnapshotFile checks the snapshot file at path (ResolveSnapshot).
// Each failure wraps ErrBadSnapshot and says what to do.
func CheckSnapshotFile(path string) (*Snapshot, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w: %w", path, ErrBadSnapshot, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w: %w", path, ErrBadSnapshot, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("snapshot %s: %w: not a regular file", path, ErrBadSnapshot)
	}
	size := st.Size()
	body := size - sha256.Size
	if body <= 0 || body%512 != 0 {
		return nil, fmt.Errorf("snapshot %s: %w: %d bytes is no etcd snapshot stream (whole 512-byte pages and a sha256): a truncated copy, or another file? Copy it again (curiactl snapshot save checks what it copies)", path, ErrBadSnapshot, size)
	}
	whole, pages := sha256.New(), sha256.New()
	if _, err := io.Copy(io.MultiWriter(whole, pages), io.LimitReader(f, body)); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w: %w", path, ErrBadSnapshot, err)
	}
	trailer := make([]byte, sha256.Size)
	if _, err := io.ReadFull(f, trailer); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w: %w", path, ErrBadSnapshot, err)
	}
	if !bytes.Equal(trailer, pages.Sum(nil)) {
		return nil, fmt.Errorf("snapshot %s: %w: its sha256 trailer does not match its contents: the file is damaged; take another copy", path, ErrBadSnapshot)
	}
	whole.Write(trailer)
	s := &Snapshot{Path: path, Name: strings.TrimSuffix(filepath.Base(path), snapshots.DBExt), Size: size, SHA256: hex.EncodeToString(whole.Sum(nil))}
	meta := strings.TrimSuffix(path, snapshots.DBExt) + snapshots.MetaExt
	if b, err := os.ReadFile(meta); err == nil {
		var md snapshots.Metadata
		if err := json.Unmarshal(b, &md); err != nil {
			return nil, fmt.Errorf("snapshot %s: %w: its metadata %s does not decode: %w", path, ErrBadSnapshot, meta, err)
		}
		if md.Size != s.Size || (md.SHA256 != "" && md.SHA256 != s.SHA256) {
			return nil, fmt.Errorf("snapshot %s: %w: %d bytes, sha256 %s, but its metadata %s says %d bytes, sha256 %s", path, ErrBadSnapshot, s.Size, s.SHA256, meta, md.Size, md.SHA256)
		}
		s.Metadata = &md
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("snapshot %s: %w", path, err)
	}
	return s, nil
}

// restoreSnapshot streams the snapshot to the node's RestoreSnapshot.
func restoreSnapshot(ctx context.Context, cli consensusv1.ConsensusClient, nodeID string, snap *Snapshot, reason string) (*consensusv1.RecoveryReport, error) {
	f, err := os.Open(snap.Path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	stream, err := cli.RestoreSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&consensusv1.RestoreSnapshotRequest{Msg: &consensusv1.RestoreSnapshotRequest_Header{Header: &consensusv1.RestoreSnapshotHeader{
		NodeId: nodeID, Reason: reason, SnapshotName: snap.Name,
	}}}); err != nil {
		return nil, err
	}
	buf := make([]byte, 1<<20)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if err := stream.Send(&consensusv1.RestoreSnapshotRequest{Msg: &consensusv1.RestoreSnapshotRequest_Chunk{Chunk: buf[:n]}}); err != nil {
				break // the server's answer says why
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	return resp.GetReport(), nil
}
