package curator_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpcerr"
	"curia.dev/platform/snapshots"
	cut "curia.dev/services/curator/curatortest"
)

// TestSnapshotRestore: a snapshot taken on demand, restored with etcdutl
// (hash checked) into a fresh data directory and served by an embedded
// etcd, holds the /curia/ keyspace exactly as the cluster had it at the
// snapshot's revision; its metadata says what it is.
func TestSnapshotRestore(t *testing.T) {
	dir := t.TempDir()
	c := cut.New(t, 1, "--snapshot-dir", dir, "--snapshot-interval", "0")
	ctx := ctxT(t)
	for range 3 {
		c.NewAgent().Enrol(ctx) // nodes, certificates, audit events: a keyspace worth comparing
	}
	// etcd writes its storage version a few seconds after it starts (its
	// version monitor); a snapshot taken before has none to report. Until
	// then Status guesses "3.5.0" for a data directory without one, so
	// the wait is for the server's own minor version, not for any.
	voterCli := c.Etcd(c.Voters[0].ClientURL)
	proctest.Eventually(t, time.Minute, func() error {
		st, err := voterCli.Status(ctx, c.Voters[0].ClientURL)
		if err != nil {
			return err
		}
		if minor := strings.Join(strings.SplitN(st.Version, ".", 3)[:2], ".") + "."; !strings.HasPrefix(st.StorageVersion, minor) {
			return fmt.Errorf("etcd %s has written no storage version of its own yet (Status says %q)", st.Version, st.StorageVersion)
		}
		return nil
	})
	resp, err := c.Management().TakeSnapshot(ctx, &curatorv1.TakeSnapshotRequest{Reason: "the test restores it"})
	if err != nil {
		t.Fatal(err)
	}
	md := resp.Snapshot
	c.NewAgent().Enrol(ctx) // after the snapshot: not in it

	db := filepath.Join(dir, md.Name+snapshots.DBExt)
	file, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(file)
	voter := c.Voters[0]
	switch {
	case resp.Reused:
		t.Fatal("an on-demand snapshot was reused")
	case md.Name != snapshots.Name(md.TakenAt.AsTime(), md.Revision):
		t.Fatalf("name %s, taken at %v, revision %d", md.Name, md.TakenAt.AsTime(), md.Revision)
	case md.Size != int64(len(file)) || md.Sha256 != hex.EncodeToString(sum[:]):
		t.Fatalf("metadata says %d bytes, sha256 %s; the file is %d bytes, %x", md.Size, md.Sha256, len(file), sum)
	case md.Source.GetName() != voter.ID || md.Source.GetLearner() || len(md.Members) != 1 || !proto.Equal(md.Members[0], md.Source):
		t.Fatalf("source %v, members %v: want the one voter %s", md.Source, md.Members, voter.ID)
	case md.Trigger != curatorv1.SnapshotTrigger_SNAPSHOT_TRIGGER_ON_DEMAND || md.Reason != "on demand by admin/test: the test restores it" || md.RequestedBy != "admin/test" || md.TakenBy != c.Leader().Name:
		t.Fatalf("trigger %v, reason %q, requested by %q, taken by %q", md.Trigger, md.Reason, md.RequestedBy, md.TakenBy)
	case md.TotalKeys == 0 || md.EtcdHash == 0 || md.StorageVersion == "":
		t.Fatalf("etcdutl's status: %d keys, hash %d, storage version %q", md.TotalKeys, md.EtcdHash, md.StorageVersion)
	}
	// The .json beside it says the same.
	onDisk, err := snapshots.Dir(dir).Read(md.Name)
	if err != nil {
		t.Fatal(err)
	}
	if onDisk.Revision != md.Revision || onDisk.SHA256 != md.Sha256 || onDisk.Source.ID != strconv.FormatUint(md.Source.Id, 16) {
		t.Fatalf("%s.json: %+v, the API: %v", md.Name, onDisk, md)
	}

	// The file is of the revision the metadata names (etcd's restore
	// keeps the history: a read at an older revision would match too).
	st, err := etcdutl.NewV3(zap.NewNop()).Status(db)
	if err != nil || st.Revision != md.Revision {
		t.Fatalf("etcdutl status of %s: revision %d (%v), the metadata says %d", db, st.Revision, err, md.Revision)
	}
	want := keyspace(t, c.Etcd(voter.ClientURL), md.Revision)
	got := keyspace(t, restore(t, db), md.Revision)
	if len(want) < 10 {
		t.Fatalf("only %d keys under %s", len(want), keys.Prefix)
	}
	if !maps.Equal(got, want) {
		for k, v := range want {
			if got[k] != v {
				t.Errorf("restored %s: %q, the source had %q", k, got[k], v)
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("restored %s, which the source did not have", k)
			}
		}
		t.Fatalf("the restored keyspace differs from the source's at revision %d", md.Revision)
	}

	// A damaged copy does not restore: etcd checks the sha256 trailer.
	bad := bytes.Clone(file)
	bad[len(bad)/2] ^= 0xff
	badPath := filepath.Join(t.TempDir(), "bad.db")
	if err := os.WriteFile(badPath, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := etcdutl.NewV3(zap.NewNop()).Restore(restoreConfig(badPath, filepath.Join(t.TempDir(), "data"), "http://127.0.0.1:1")); err == nil {
		t.Fatal("a damaged snapshot restored")
	}

	// The call is in the audit log.
	var found bool
	for _, ev := range cut.AuditLog(t, c.Management()) {
		found = found || ev.Action == auditv1.AuditAction_AUDIT_ACTION_SNAPSHOT && ev.Actor == "admin/test" && strings.Contains(ev.Reason, md.Name)
	}
	if !found {
		t.Fatalf("no audit event of snapshot %s by admin/test", md.Name)
	}
}

// keyspace is everything under /curia/ at revision rev.
func keyspace(t *testing.T, cli *clientv3.Client, rev int64) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, keys.Prefix, clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out
}

func restoreConfig(db, dataDir, peer string) etcdutl.RestoreConfig {
	return etcdutl.RestoreConfig{
		SnapshotPath: db, Name: "restored", OutputDataDir: dataDir,
		PeerURLs: []string{peer}, InitialCluster: "restored=" + peer, InitialClusterToken: "restored",
	}
}

// restore restores the snapshot db into a fresh data directory with
// etcdutl, as `etcdutl snapshot restore` does (hash checked), starts an
// embedded etcd on it and returns a client of it.
func restore(t *testing.T, db string) *clientv3.Client {
	t.Helper()
	data := filepath.Join(t.TempDir(), "data")
	peer := url.URL{Scheme: "http", Host: proctest.FreeAddr(t)}
	client := url.URL{Scheme: "http", Host: proctest.FreeAddr(t)}
	if err := etcdutl.NewV3(zap.NewNop()).Restore(restoreConfig(db, data, peer.String())); err != nil {
		t.Fatalf("restore %s: %v", db, err)
	}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "restored", data
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.InitialCluster, cfg.InitialClusterToken = "restored="+peer.String(), "restored"
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("start etcd on the restored data: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("etcd on the restored data: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("etcd on the restored data is not ready within a minute")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client.String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestScheduledSnapshots: the leader takes a snapshot every interval; the
// retention keeps the newest --snapshot-keep and deletes those older than
// --snapshot-max-age; what interrupted writes left long ago is removed and
// never listed; a write in progress is left alone. GetClusterInfo and the
// metrics report the newest.
func TestScheduledSnapshots(t *testing.T) {
	dir := t.TempDir()
	d := snapshots.Dir(dir)
	now := time.Now()
	// Before the curators start: a snapshot a month old, and the files of
	// two interrupted writes an hour ago and of one in progress.
	month := now.Add(-30 * 24 * time.Hour)
	ancient := snapshots.Metadata{Name: snapshots.Name(month, 1), TakenAt: month.UTC(), Revision: 1, Trigger: snapshots.Scheduled, Reason: "scheduled"}
	touch := func(file string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, file), []byte("not a database"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(filepath.Join(dir, file), mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	touch(ancient.Name+snapshots.DBExt, month)
	if err := d.WriteMeta(ancient); err != nil {
		t.Fatal(err)
	}
	hourAgo := now.Add(-time.Hour)
	leftover := snapshots.Name(hourAgo, 2)
	touch(leftover+snapshots.DBExt, hourAgo)
	touch("incoming-1"+snapshots.PartExt, hourAgo)
	inProgress := snapshots.Name(now, 3)
	touch(inProgress+snapshots.DBExt, now)

	c := cut.New(t, 1, "--snapshot-dir", dir, "--snapshot-interval", "1s", "--snapshot-keep", "3", "--snapshot-max-age", "24h")
	ctx := ctxT(t)
	m := c.Management()
	seen := map[string]bool{}
	proctest.Eventually(t, time.Minute, func() error {
		resp, err := m.ListSnapshots(ctx, &curatorv1.ListSnapshotsRequest{})
		if err != nil {
			return err
		}
		for _, s := range resp.Snapshots {
			if s.Name == leftover || s.Name == inProgress {
				t.Fatalf("%s, which has no .json, is listed", s.Name)
			}
			if s.Name == ancient.Name {
				// Deleted for its age by the first retention, not
				// for the count (which would keep it beside two).
				if len(resp.Snapshots) > 2 {
					t.Fatalf("the month-old snapshot is kept beside %d others", len(resp.Snapshots)-1)
				}
				continue
			}
			if s.Trigger != curatorv1.SnapshotTrigger_SNAPSHOT_TRIGGER_SCHEDULED || s.Reason != "scheduled" || s.RequestedBy != "" {
				t.Fatalf("snapshot %s: trigger %v, reason %q, requested by %q", s.Name, s.Trigger, s.Reason, s.RequestedBy)
			}
			seen[s.Name] = true
		}
		if len(seen) < 5 {
			return fmt.Errorf("%d scheduled snapshots so far", len(seen))
		}
		return nil
	})
	info, err := m.GetClusterInfo(ctx, &curatorv1.GetClusterInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	st := info.GetSnapshots()
	if !st.GetEnabled() || st.GetDirectory() != dir || st.GetInterval().AsDuration() != time.Second || !seen[st.GetLastGood().GetName()] || st.GetLastFailure() != "" {
		t.Fatalf("GetClusterInfo's snapshots: %v", st)
	}
	metrics := proctest.MetricsHave(t, c.Curators[0].Metrics, "curia_curator_snapshot_last_success_timestamp_seconds", "curia_curator_snapshot_last_success_revision", "curia_curator_snapshot_failures_total")
	if v := metricValue(t, metrics, "curia_curator_snapshot_last_success_timestamp_seconds"); v < float64(now.Unix()) {
		t.Fatalf("last success at %v, before the test began (%v)", v, now.Unix())
	}
	if v := metricValue(t, metrics, "curia_curator_snapshot_failures_total"); v != 0 {
		t.Fatalf("%v failures", v)
	}

	// Stopped, the directory holds the 3 newest, and the write in progress.
	c.Curators[0].Stop()
	list, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, md := range list {
		names = append(names, md.Name)
		if !seen[md.Name] && md.TakenAt.Before(now) {
			t.Errorf("%s is kept, but it is no snapshot of this test's curator", md.Name)
		}
	}
	if len(list) != 3 {
		t.Fatalf("%d snapshots kept (%v), want 3", len(list), names)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		files = append(files, e.Name())
	}
	want := []string{inProgress + snapshots.DBExt}
	for _, n := range names {
		want = append(want, n+snapshots.DBExt, n+snapshots.MetaExt)
	}
	slices.Sort(want)
	if !slices.Equal(files, want) {
		t.Fatalf("the directory holds %v, want %v", files, want)
	}
}

// metricValue is the value of an unlabelled metric in a /metrics body.
func metricValue(t *testing.T, body, name string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no %s in /metrics", name)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestGetSnapshot: GetSnapshot, through a follower, streams the metadata,
// then bytes equal to the file in chunks whose base64 concatenates; bad
// names are InvalidArgument, unknown ones NotFound; only admins list and
// copy snapshots, the reconciler may take them; a snapshot before a
// membership change reuses one less than 30 s old, and every TakeSnapshot
// is in the audit log.
func TestGetSnapshot(t *testing.T) {
	dir := t.TempDir()
	c := cut.New(t, 2, "--snapshot-dir", dir, "--snapshot-interval", "0")
	ctx := ctxT(t)
	// About 2.4 MB outside /curia/: a stream of several chunks.
	cli := c.Etcd(c.Voters[0].ClientURL)
	for i := range 24 {
		if _, err := cli.Put(ctx, fmt.Sprintf("/test/%d", i), strings.Repeat(strconv.Itoa(i%10), 100<<10)); err != nil {
			t.Fatal(err)
		}
	}
	follower := leaseFollower(c)
	m := curatorv1.NewManagementClient(c.Conn(follower, cut.Admin))
	taken, err := m.TakeSnapshot(ctx, &curatorv1.TakeSnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	md := taken.Snapshot
	file, err := os.ReadFile(filepath.Join(dir, md.Name+snapshots.DBExt))
	if err != nil {
		t.Fatal(err)
	}

	stream, err := m.GetSnapshot(ctx, &curatorv1.GetSnapshotRequest{Name: md.Name})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first.Snapshot, md) || len(first.Chunk) != 0 {
		t.Fatalf("first message %v, want the metadata %v alone", first, md)
	}
	var got []byte
	var chunks []int
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if resp.Snapshot != nil {
			t.Fatal("metadata after the first message")
		}
		got = append(got, resp.Chunk...)
		chunks = append(chunks, len(resp.Chunk))
	}
	if !bytes.Equal(got, file) {
		t.Fatalf("streamed %d bytes, the file has %d (or they differ)", len(got), len(file))
	}
	for i, n := range chunks[:len(chunks)-1] {
		if n%3 != 0 {
			t.Fatalf("chunk %d has %d bytes, not a multiple of 3", i, n)
		}
	}
	if len(chunks) < 3 {
		t.Fatalf("%d chunks for %d bytes", len(chunks), len(file))
	}

	get := func(m curatorv1.ManagementClient, name string) error {
		stream, err := m.GetSnapshot(ctx, &curatorv1.GetSnapshotRequest{Name: name})
		if err == nil {
			_, err = stream.Recv()
		}
		return err
	}
	wantCode(t, get(m, "../../etc/passwd"), codes.InvalidArgument, "snapshot-<UTC yyyymmddThhmmssZ>-rev<revision>")
	wantCode(t, get(m, md.Name+snapshots.DBExt), codes.InvalidArgument, "no directory, no extension")
	wantCode(t, get(m, snapshots.Name(time.Now(), 987654321)), codes.NotFound, "ListSnapshots")

	// Who may.
	reconciler := curatorv1.NewManagementClient(c.Conn(follower, pki.Principal{Kind: pki.KindReconciler}))
	node := curatorv1.NewManagementClient(c.Conn(follower, pki.Principal{Kind: pki.KindNode, Name: c.Voters[0].ID}))
	for who, cl := range map[string]curatorv1.ManagementClient{"reconciler": reconciler, "node": node} {
		wantCode(t, get(cl, md.Name), codes.PermissionDenied, "")
		_, err := cl.ListSnapshots(ctx, &curatorv1.ListSnapshotsRequest{})
		wantCode(t, err, codes.PermissionDenied, "")
		if who == "node" {
			_, err := cl.TakeSnapshot(ctx, &curatorv1.TakeSnapshotRequest{})
			wantCode(t, err, codes.PermissionDenied, "")
		}
	}

	// Before a membership change, the reconciler gets the snapshot just
	// taken; on demand, a new one.
	before, err := reconciler.TakeSnapshot(ctx, &curatorv1.TakeSnapshotRequest{BeforeMembershipChange: "remove member 1234 (node x)", Reason: "the test"})
	if err != nil {
		t.Fatal(err)
	}
	if !before.Reused || before.Snapshot.Name != md.Name {
		t.Fatalf("before a membership change: %s, reused %v; want %s reused", before.Snapshot.GetName(), before.Reused, md.Name)
	}
	if _, err := cli.Put(ctx, "/test/moved", "on"); err != nil { // a new revision: a new name
		t.Fatal(err)
	}
	again, err := m.TakeSnapshot(ctx, &curatorv1.TakeSnapshotRequest{Reason: "once more"})
	if err != nil {
		t.Fatal(err)
	}
	if again.Reused || again.Snapshot.Name == md.Name {
		t.Fatalf("on demand: %s, reused %v; want a new one", again.Snapshot.GetName(), again.Reused)
	}
	list, err := m.ListSnapshots(ctx, &curatorv1.ListSnapshotsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Snapshots) != 2 || list.Snapshots[0].Name != again.Snapshot.Name || list.Snapshots[1].Name != md.Name || list.Directory != dir {
		t.Fatalf("ListSnapshots: %v", list)
	}
	var events []string
	for _, ev := range cut.AuditLog(t, c.Management()) {
		if ev.Action == auditv1.AuditAction_AUDIT_ACTION_SNAPSHOT {
			events = append(events, ev.Actor+": "+ev.Reason)
		}
	}
	wantEvents := []*regexp.Regexp{
		regexp.MustCompile(`^admin/test: snapshot ` + md.Name + ` taken \(on demand by admin/test\)$`),
		regexp.MustCompile(`^reconciler: snapshot ` + md.Name + `, taken .* ago, handed out instead of a new one \(before membership change: remove member 1234 \(node x\) \(the test\)\)$`),
		regexp.MustCompile(`^admin/test: snapshot ` + again.Snapshot.Name + ` taken \(on demand by admin/test: once more\)$`),
	}
	if len(events) != len(wantEvents) {
		t.Fatalf("audit events of snapshots: %q", events)
	}
	for i, re := range wantEvents {
		if !re.MatchString(events[i]) {
			t.Fatalf("audit event %d: %q, want %v", i, events[i], re)
		}
	}
}

// TestSnapshotsOff: without --snapshot-dir the snapshot calls say so
// (FailedPrecondition, SNAPSHOTS_OFF) and GetClusterInfo says they are
// off.
func TestSnapshotsOff(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	m := c.Management()
	_, err := m.TakeSnapshot(ctx, &curatorv1.TakeSnapshotRequest{})
	wantKind(t, err, rpcerr.SnapshotsOff, "", "--snapshot-dir")
	_, err = m.ListSnapshots(ctx, &curatorv1.ListSnapshotsRequest{})
	wantKind(t, err, rpcerr.SnapshotsOff, "", "--snapshot-dir")
	stream, err := m.GetSnapshot(ctx, &curatorv1.GetSnapshotRequest{Name: snapshots.Name(time.Now(), 1)})
	if err == nil {
		_, err = stream.Recv()
	}
	wantKind(t, err, rpcerr.SnapshotsOff, "", "--snapshot-dir")
	info, err := m.GetClusterInfo(ctx, &curatorv1.GetClusterInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetSnapshots().GetEnabled() || info.GetSnapshots().GetLastGood() != nil {
		t.Fatalf("snapshots off, GetClusterInfo says %v", info.GetSnapshots())
	}
}
