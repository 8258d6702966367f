package curator_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/offsite"
	"curia.dev/platform/offsite/offsitetest"
	"curia.dev/platform/proctest"
	"curia.dev/platform/snapshots"
	"curia.dev/services/curator"
	cut "curia.dev/services/curator/curatortest"
)

// TestOffsiteSnapshots: with --snapshot-offsite the leader copies its
// scheduled snapshot to a real S3 server (on disk), where a fetch gets it
// back byte for byte, an etcd database of its revision; each later
// snapshot is copied too, and --snapshot-offsite-keep keeps the newest
// there; ListSnapshots says where each is kept, GetClusterInfo and the
// metrics how the copies go.
func TestOffsiteSnapshots(t *testing.T) {
	start := time.Now()
	s3 := offsitetest.Start(t, "backups")
	dir := t.TempDir()
	target := "s3://backups/cluster-a"
	// An interval of an hour: the new leader takes one scheduled
	// snapshot at once (the directory has none), then none.
	flags := append([]string{"--snapshot-dir", dir, "--snapshot-interval", "1h", "--snapshot-offsite", target, "--snapshot-offsite-keep", "2"}, s3.Flags()...)
	c := cut.New(t, 1, flags...)
	ctx := ctxT(t)
	m := c.Management()

	// wantOffsite waits until ListSnapshots shows exactly the names, newest
	// first, with the storage given, and returns them.
	wantOffsite := func(want map[string]curatorv1.SnapshotStorage, n int) []*curatorv1.SnapshotMetadata {
		t.Helper()
		var list []*curatorv1.SnapshotMetadata
		proctest.Eventually(t, time.Minute, func() error {
			resp, err := m.ListSnapshots(ctx, &curatorv1.ListSnapshotsRequest{})
			if err != nil {
				return err
			}
			if resp.Offsite != target || resp.OffsiteError != "" {
				return fmt.Errorf("off-site %q, error %q", resp.Offsite, resp.OffsiteError)
			}
			if len(resp.Snapshots) != n {
				return fmt.Errorf("%d snapshots listed, want %d", len(resp.Snapshots), n)
			}
			for _, s := range resp.Snapshots {
				if w, ok := want[s.Name]; ok && s.Storage != w {
					return fmt.Errorf("%s: %v, want %v", s.Name, s.Storage, w)
				}
				if off := s.Storage != curatorv1.SnapshotStorage_SNAPSHOT_STORAGE_LOCAL; off != (s.OffsiteUrl == target+"/"+s.Name) {
					return fmt.Errorf("%s: %v, off-site URL %q", s.Name, s.Storage, s.OffsiteUrl)
				}
			}
			list = resp.Snapshots
			return nil
		})
		return list
	}

	// The scheduled snapshot.
	var first *curatorv1.SnapshotMetadata
	proctest.Eventually(t, time.Minute, func() error {
		resp, err := m.ListSnapshots(ctx, &curatorv1.ListSnapshotsRequest{})
		if err != nil {
			return err
		}
		if len(resp.Snapshots) == 0 || resp.Snapshots[0].Storage != curatorv1.SnapshotStorage_SNAPSHOT_STORAGE_LOCAL_AND_OFFSITE {
			return fmt.Errorf("no snapshot copied off-site yet: %v", resp.Snapshots)
		}
		first = resp.Snapshots[0]
		return nil
	})
	t.Logf("scheduled snapshot of %d bytes (%d keys) copied off-site %v after the test began (the cluster's start included)", first.Size, first.TotalKeys, time.Since(start).Round(time.Millisecond))
	if first.Trigger != curatorv1.SnapshotTrigger_SNAPSHOT_TRIGGER_SCHEDULED || first.OffsiteUrl != target+"/"+first.Name {
		t.Fatalf("the first snapshot: %v", first)
	}
	local, err := os.ReadFile(filepath.Join(dir, first.Name+snapshots.DBExt))
	if err != nil {
		t.Fatal(err)
	}
	fetched := filepath.Join(t.TempDir(), "fetched.db")
	md, err := offsite.Fetch(ctx, first.OffsiteUrl, s3.Options(), fetched)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(fetched)
	if err != nil || !bytes.Equal(got, local) || md.SHA256 != first.Sha256 || md.Revision != first.Revision || md.TakenBy != c.Leader().Name || md.Cluster == "" {
		t.Fatalf("fetched %d bytes (%v), metadata %+v; the snapshot: %d bytes, %v", len(got), err, md, len(local), first)
	}
	if st, err := etcdutl.NewV3(zap.NewNop()).Status(fetched); err != nil || st.Revision != first.Revision {
		t.Fatalf("etcdutl status of the fetched copy: revision %d (%v), want %d", st.Revision, err, first.Revision)
	}

	info, err := m.GetClusterInfo(ctx, &curatorv1.GetClusterInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st := info.GetSnapshots(); st.GetOffsite() != target || st.GetOffsiteLastSuccess().AsTime().Before(start) || st.GetOffsiteLastFailure() != "" {
		t.Fatalf("GetClusterInfo's snapshots: %v", st)
	}
	metrics := proctest.MetricsHave(t, c.Curators[0].Metrics, "curia_curator_snapshot_offsite_failures_total", "curia_curator_snapshot_offsite_last_success_timestamp_seconds")
	if v := metricValue(t, metrics, "curia_curator_snapshot_offsite_last_success_timestamp_seconds"); v < float64(start.Unix()) {
		t.Fatalf("last copy at %v, before the test began (%v)", v, start.Unix())
	}
	if v := metricValue(t, metrics, "curia_curator_snapshot_offsite_failures_total"); v != 0 {
		t.Fatalf("%v failed copies", v)
	}

	// Two more, one at a time: each is copied; off-site the two newest
	// are kept, the first only in the directory.
	cli := c.Etcd(c.Voters[0].ClientURL)
	var names []string // newest first
	for i := range 2 {
		// The first: 1000 keys more, about 8 MB (a new revision: a new name).
		for j := range 1 + 999*(1-i) {
			if _, err := cli.Put(ctx, fmt.Sprintf("/test/offsite/%d/%d", i, j), strings.Repeat("x", 8<<10)); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := m.TakeSnapshot(ctx, &curatorv1.TakeSnapshotRequest{Reason: "the test"})
		if err != nil {
			t.Fatal(err)
		}
		taken := time.Now()
		names = append([]string{resp.Snapshot.Name}, names...)
		wantOffsite(map[string]curatorv1.SnapshotStorage{resp.Snapshot.Name: curatorv1.SnapshotStorage_SNAPSHOT_STORAGE_LOCAL_AND_OFFSITE}, i+2)
		t.Logf("snapshot of %d bytes (%d keys) listed off-site %v after TakeSnapshot answered (the copy starts within a second)", resp.Snapshot.Size, resp.Snapshot.TotalKeys, time.Since(taken).Round(time.Millisecond))
	}
	if !c.Curators[0].LogContains("snapshot copied off-site") {
		t.Fatal("the curator logged no copy")
	}
	list := wantOffsite(map[string]curatorv1.SnapshotStorage{
		names[0]:   curatorv1.SnapshotStorage_SNAPSHOT_STORAGE_LOCAL_AND_OFFSITE,
		names[1]:   curatorv1.SnapshotStorage_SNAPSHOT_STORAGE_LOCAL_AND_OFFSITE,
		first.Name: curatorv1.SnapshotStorage_SNAPSHOT_STORAGE_LOCAL,
	}, 3)
	if list[0].Name != names[0] || list[2].Name != first.Name {
		t.Fatalf("ListSnapshots: %v", list)
	}
	cl, err := offsite.New(target, s3.Options())
	if err != nil {
		t.Fatal(err)
	}
	if off, err := cl.Names(ctx); err != nil || strings.Join(off, " ") != strings.Join(names, " ") {
		t.Fatalf("off-site: %v (%v), want %v", off, err, names)
	}

	// Deleted from the directory, a snapshot is still listed off-site.
	if err := snapshots.Dir(dir).Remove(names[1]); err != nil {
		t.Fatal(err)
	}
	wantOffsite(map[string]curatorv1.SnapshotStorage{names[1]: curatorv1.SnapshotStorage_SNAPSHOT_STORAGE_OFFSITE}, 3)
}

// TestOffsiteFailure: a copy that fails (no such bucket) is logged,
// counted and reported, and is tried again; the snapshot in the directory
// is taken all the same.
func TestOffsiteFailure(t *testing.T) {
	s3 := offsitetest.Start(t, "backups")
	dir := t.TempDir()
	flags := append([]string{"--snapshot-dir", dir, "--snapshot-interval", "1s", "--snapshot-offsite", "s3://no-such-bucket/x"}, s3.Flags()...)
	c := cut.New(t, 1, flags...)
	ctx := ctxT(t)
	m := c.Management()
	proctest.Eventually(t, time.Minute, func() error {
		metrics := proctest.MetricsHave(t, c.Curators[0].Metrics, "curia_curator_snapshot_offsite_failures_total")
		if v := metricValue(t, metrics, "curia_curator_snapshot_offsite_failures_total"); v < 2 {
			return fmt.Errorf("%v failed copies so far", v)
		}
		return nil
	})
	info, err := m.GetClusterInfo(ctx, &curatorv1.GetClusterInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	st := info.GetSnapshots()
	if st.GetLastGood() == nil || st.GetLastFailure() != "" || !strings.Contains(st.GetOffsiteLastFailure(), "bucket") || st.GetOffsiteLastSuccess() != nil {
		t.Fatalf("GetClusterInfo's snapshots: %v", st)
	}
	resp, err := m.ListSnapshots(ctx, &curatorv1.ListSnapshotsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Snapshots) == 0 || resp.Snapshots[0].Storage != curatorv1.SnapshotStorage_SNAPSHOT_STORAGE_LOCAL || resp.OffsiteError == "" {
		t.Fatalf("ListSnapshots: %v", resp)
	}
}

// TestOffsiteConfig: the off-site flags are checked, each with an error
// that says what is wrong.
func TestOffsiteConfig(t *testing.T) {
	t.Setenv(offsite.EnvEndpoint, "")
	t.Setenv(offsite.EnvAccessKey, "")
	t.Setenv(offsite.EnvSecretKey, "")
	s3 := offsite.Options{Endpoint: "127.0.0.1:9000", AccessKey: "a", SecretKey: "s", Insecure: true}
	for name, tc := range map[string]struct {
		dir, url string
		keep     int
		s3       offsite.Options
		want     string // in the error; "" for none
	}{
		"ok":          {"/snapshots", "s3://bucket/prefix", 3, s3, ""},
		"off":         {"/snapshots", "", 0, offsite.Options{}, ""},
		"no dir":      {"", "s3://bucket/prefix", 3, s3, "--snapshot-offsite s3://bucket/prefix needs --snapshot-dir"},
		"scheme":      {"/snapshots", "https://bucket/prefix", 3, s3, "the scheme must be s3://"},
		"no bucket":   {"/snapshots", "s3:///prefix", 3, s3, "no bucket"},
		"keep":        {"/snapshots", "s3://bucket/prefix", 0, s3, "--snapshot-offsite-keep 0: at least 1"},
		"no endpoint": {"/snapshots", "s3://bucket/prefix", 3, offsite.Options{}, "CURIA_S3_ENDPOINT"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := curator.DefaultConfig()
			cfg.Name, cfg.CAKey, cfg.Etcd = "c0", "ca.key", []string{"https://127.0.0.1:2379"}
			cfg.TLS.CA, cfg.TLS.Cert, cfg.TLS.Key = "ca.pem", "cert.pem", "key.pem"
			cfg.Snapshots.Dir, cfg.Snapshots.Offsite, cfg.Snapshots.OffsiteKeep, cfg.Snapshots.S3 = tc.dir, tc.url, tc.keep, tc.s3
			err := cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}
