package recovery

import (
	"bytes"
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
	// Dir is where a remote snapshot would be fetched to (default: the
	// system's temporary directory).
	Dir string
}

// ResolveSnapshot turns a snapshot argument into a local file that passed
// its checks: etcd's snapshot stream as Management/GetSnapshot and the
// curators' snapshot directory hold it (a bbolt database of whole 512-byte
// pages, then the sha256 of them, which etcd checks on restore), and, when
// a <name>.json lies beside it, the size and sha256 that metadata
// records. Every snapshot argument curiactl and curia-local take goes
// through here, so that a remote one (s3://...: platform/offsite, later)
// is fetched to a local file here and checked like any other.
func ResolveSnapshot(ctx context.Context, ref string, opts ResolveOptions) (*Snapshot, error) {
	if scheme, _, ok := strings.Cut(ref, "://"); ok {
		// The seam for remote snapshots: fetch to a file in opts.Dir,
		// then check it as a local one.
		_ = ctx
		return nil, fmt.Errorf("snapshot %s: %s:// snapshots cannot be fetched yet: copy it to a local file (curiactl snapshot save FILE, or your storage's own tool) and name that", ref, scheme)
	}
	return CheckSnapshotFile(ref)
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
