package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/spf13/cobra"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

func (a *app) snapshotCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "List the curators' etcd snapshots, copy one off the cluster, restore one after losing every voter",
		Example: `  curiactl snapshot list
  curiactl snapshot save backup.db
  curiactl snapshot restore backup.db --consensus 10.0.0.11:7100`,
	}
	cmd.AddCommand(a.snapshotListCmd(), a.snapshotSaveCmd(), a.snapshotRestoreCmd())
	return cmd
}

func (a *app) snapshotListCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the snapshots of the curators' snapshot directory, newest first (ListSnapshots)",
		Long: `List the etcd snapshots of the curators' snapshot directory, newest first
(Management/ListSnapshots). FAILED_PRECONDITION, reason SNAPSHOTS_OFF,
when the curators run without --snapshot-dir.`,
		Example: `  curiactl snapshot list
  curiactl snapshot list -o json`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := a.mgmt()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd.Context())
			defer cancel()
			resp, err := m.ListSnapshots(ctx, &curatorv1.ListSnapshotsRequest{})
			if err != nil {
				return err
			}
			return printMessage(a.stdout, a.output, resp, func(w io.Writer) { snapshotTable(w, resp.GetSnapshots()) })
		},
	}
}

func snapshotTable(w io.Writer, snaps []*curatorv1.SnapshotMetadata) {
	row(w, "NAME", "TAKEN", "REVISION", "SIZE", "KEYS", "TRIGGER", "TAKEN BY")
	for _, s := range snaps {
		row(w, s.GetName(), timestamp(s.GetTakenAt()), strconv.FormatInt(s.GetRevision(), 10), bytesSize(s.GetSize()),
			strconv.FormatInt(s.GetTotalKeys(), 10), enumName(s.GetTrigger().String(), "SNAPSHOT_TRIGGER_"), orDash(s.GetTakenBy()))
	}
}

func (a *app) snapshotSaveCmd() *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "save FILE",
		Short: "Copy a snapshot to FILE, checking its size and sha256 (GetSnapshot)",
		Long: `Copy a snapshot of the curators' snapshot directory to FILE
(Management/GetSnapshot): the newest, or the one --name names (snapshot
list shows them). The file is etcd's snapshot stream as is, which
etcdutl snapshot restore and make recover SNAPSHOT=FILE take. It is
written to a temporary file beside FILE and renamed into place only once
its size and sha256 match the snapshot's metadata: FILE is never left
half written.`,
		Example: `  curiactl snapshot save backup.db
  curiactl snapshot save backup.db --name snapshot-20260101T120000Z-rev1234`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, files []string) error {
			m, err := a.mgmt()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd.Context())
			defer cancel()
			if name == "" {
				list, err := m.ListSnapshots(ctx, &curatorv1.ListSnapshotsRequest{})
				if err != nil {
					return err
				}
				if len(list.GetSnapshots()) == 0 {
					return errors.New("the snapshot directory holds no snapshot")
				}
				name = list.GetSnapshots()[0].GetName()
			}
			meta, err := saveSnapshot(ctx, m, name, files[0])
			if err != nil {
				return err
			}
			return printMessage(a.stdout, a.output, meta, func(w io.Writer) {
				row(w, "SAVED:", files[0])
				row(w, "NAME:", meta.GetName())
				row(w, "REVISION:", strconv.FormatInt(meta.GetRevision(), 10))
				row(w, "SIZE:", fmt.Sprintf("%d bytes (%s)", meta.GetSize(), bytesSize(meta.GetSize())))
				row(w, "SHA256:", meta.GetSha256())
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the snapshot to copy, as snapshot list names it (default: the newest)")
	return cmd
}

// saveSnapshot streams snapshot name into path, atomically: a temporary
// file beside it, checked against the metadata's size and sha256, synced,
// then renamed.
func saveSnapshot(ctx context.Context, m curatorv1.ManagementClient, name, path string) (*curatorv1.SnapshotMetadata, error) {
	stream, err := m.GetSnapshot(ctx, &curatorv1.GetSnapshotRequest{Name: name})
	if err != nil {
		return nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	meta := first.GetSnapshot()
	if meta == nil {
		return nil, errors.New("GetSnapshot: the first message carries no metadata")
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	sum := sha256.New()
	size, err := copyChunks(io.MultiWriter(tmp, sum), first.GetChunk(), stream.Recv)
	if err != nil {
		return nil, err
	}
	if err := verify(meta, size, sum); err != nil {
		return nil, err
	}
	if err := tmp.Sync(); err != nil {
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return nil, err
	}
	ok = true
	return meta, nil
}

// copyChunks writes first, then every chunk recv returns until io.EOF, to
// w, and returns how many bytes it wrote.
func copyChunks(w io.Writer, first []byte, recv func() (*curatorv1.GetSnapshotResponse, error)) (int64, error) {
	n, err := w.Write(first)
	size := int64(n)
	if err != nil {
		return size, err
	}
	for {
		r, err := recv()
		if errors.Is(err, io.EOF) {
			return size, nil
		}
		if err != nil {
			return size, err
		}
		n, err := w.Write(r.GetChunk())
		size += int64(n)
		if err != nil {
			return size, err
		}
	}
}

// verify checks what was received against the snapshot's metadata.
func verify(meta *curatorv1.SnapshotMetadata, size int64, sum hash.Hash) error {
	if meta.GetSize() != 0 && size != meta.GetSize() {
		return fmt.Errorf("snapshot %s: received %d bytes, its metadata says %d: not saved", meta.GetName(), size, meta.GetSize())
	}
	if want := meta.GetSha256(); want != "" {
		if got := hex.EncodeToString(sum.Sum(nil)); got != want {
			return fmt.Errorf("snapshot %s: sha256 %s, its metadata says %s: not saved", meta.GetName(), got, want)
		}
	}
	return nil
}
