package recovery

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/docindex"
	"curia.dev/platform/offsite"
	"curia.dev/platform/offsite/offsitetest"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpc/rpctest"
	"curia.dev/platform/snapshots"
)

func TestFilesIndex(t *testing.T) { docindex.Check(t) }

// snapshotBytes is an etcd snapshot stream: pages, then their sha256.
func snapshotBytes(pages int) []byte {
	b := bytes.Repeat([]byte{7}, 512*pages)
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

func TestCheckSnapshotFile(t *testing.T) {
	dir := t.TempDir()
	good := snapshotBytes(3)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := write("snapshot-20260101T000000Z-rev7.db", good)
	s, err := CheckSnapshotFile(p)
	if err != nil {
		t.Fatal(err)
	}
	whole := sha256.Sum256(good)
	if s.Name != "snapshot-20260101T000000Z-rev7" || s.Size != int64(len(good)) || s.SHA256 != hex.EncodeToString(whole[:]) || s.Metadata != nil {
		t.Errorf("%+v", s)
	}
	// With its metadata beside it: checked against it.
	md, _ := json.Marshal(snapshots.Metadata{Name: s.Name, Revision: 7, Size: s.Size, SHA256: s.SHA256})
	write("snapshot-20260101T000000Z-rev7.json", md)
	if s, err := CheckSnapshotFile(p); err != nil || s.Metadata == nil || s.Metadata.Revision != 7 {
		t.Errorf("with metadata: %+v %v", s, err)
	}

	damaged := append([]byte(nil), good...)
	damaged[100] ^= 1
	md, _ = json.Marshal(snapshots.Metadata{Size: 1})
	for name, tc := range map[string]struct {
		path string
		want string
	}{
		"missing":        {filepath.Join(dir, "none.db"), "no such file"},
		"a directory":    {dir, "not a regular file"},
		"truncated":      {write("truncated.db", good[:len(good)-1]), "no etcd snapshot stream"},
		"empty":          {write("empty.db", nil), "no etcd snapshot stream"},
		"damaged":        {write("damaged.db", damaged), "trailer does not match"},
		"other metadata": {func() string { write("other.json", md); return write("other.db", good) }(), "its metadata"},
		"bad metadata":   {func() string { write("garbled.json", []byte("{")); return write("garbled.db", good) }(), "does not decode"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := CheckSnapshotFile(tc.path)
			if !errors.Is(err, ErrBadSnapshot) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v, want ErrBadSnapshot and %q", err, tc.want)
			}
		})
	}

	if s, err := ResolveSnapshot(context.Background(), p, ResolveOptions{}); err != nil || s.Path != p {
		t.Errorf("local: %+v %v", s, err)
	}
}

// TestResolveOffsiteSnapshot: an s3:// snapshot (an off-site copy the
// curators uploaded, on a real S3 server keeping its objects on disk) is
// fetched by name or as the newest of its prefix and checked like a local
// file; a damaged object is refused and leaves no file behind.
func TestResolveOffsiteSnapshot(t *testing.T) {
	srv := offsitetest.Start(t, "backups")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := offsite.New("s3://backups/curia", srv.Options())
	if err != nil {
		t.Fatal(err)
	}
	local := t.TempDir()
	good := snapshotBytes(4)
	sum := sha256.Sum256(good)
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	md := snapshots.Metadata{Name: snapshots.Name(at, 42), TakenAt: at, Revision: 42, Size: int64(len(good)), SHA256: hex.EncodeToString(sum[:]), Cluster: "curia", TakenBy: "curator-1"}
	if err := os.WriteFile(snapshots.Dir(local).DB(md.Name), good, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Upload(ctx, md, snapshots.Dir(local).DB(md.Name)); err != nil {
		t.Fatal(err)
	}
	into := t.TempDir()
	for _, ref := range []string{"s3://backups/curia/" + md.Name, "s3://backups/curia"} {
		s, err := ResolveSnapshot(ctx, ref, ResolveOptions{Dir: into, S3: srv.Options()})
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		if s.Name != md.Name || s.SHA256 != md.SHA256 || filepath.Dir(filepath.Dir(s.Path)) != into {
			t.Errorf("%s resolved to %+v, want %s (sha256 %s) in %s", ref, s, md.Name, md.SHA256, into)
		}
	}

	// The object damaged behind the client's back: refused, nothing kept.
	obj := srv.ObjectFile("backups", "curia/"+md.Name)
	b, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	b[10] ^= 1
	if err := os.WriteFile(obj, b, 0o600); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	if _, err := ResolveSnapshot(ctx, "s3://backups/curia/"+md.Name, ResolveOptions{Dir: empty, S3: srv.Options()}); err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("a damaged object: %v, want a refusal that names the sha256", err)
	}
	if left, _ := os.ReadDir(empty); len(left) != 0 {
		t.Errorf("a refused fetch left %v", left)
	}
}

func TestChooseSurvivor(t *testing.T) {
	all := []Survivor{
		{Node: "node-1", Answered: true, member: 1, RaftIndex: 90, RaftTerm: 3},
		{Node: "node-2", Answered: true, member: 2, RaftIndex: 120, RaftTerm: 3},
		{Node: "node-3"},
		{Node: "node-4", Answered: true, State: "idle"},
	}
	best, why, err := chooseSurvivor(all)
	if err != nil || best.Node != "node-2" {
		t.Fatalf("%v %v", best, err)
	}
	if want := "it applied raft index 120 (term 3), the highest; node-1 applied 90 (term 3); no answer from node-3, whose data (if any) is not compared"; why != want {
		t.Errorf("why: %s\nwant %s", why, want)
	}
	_, _, err = chooseSurvivor(all[2:])
	if !errors.Is(err, ErrNoSurvivor) || !strings.Contains(err.Error(), "(no answer from [node-3]): restore a snapshot (--snapshot FILE --confirm NODE)") {
		t.Errorf("no survivor: %v", err)
	}
	_, _, err = chooseSurvivor(all[2:3])
	if !errors.Is(err, ErrNoSurvivor) || !strings.Contains(err.Error(), "no consensus process answered ([node-3]): check the addresses") {
		t.Errorf("no answer at all: %v", err)
	}
}

// fakeConsensus answers Status as a member does, and counts the calls
// that would change something.
type fakeConsensus struct {
	consensusv1.UnimplementedConsensusServer
	st      *consensusv1.StatusResponse
	changes atomic.Int32
}

func (f *fakeConsensus) Status(context.Context, *consensusv1.StatusRequest) (*consensusv1.StatusResponse, error) {
	return f.st, nil
}

func (f *fakeConsensus) Recover(context.Context, *consensusv1.RecoverRequest) (*consensusv1.RecoverResponse, error) {
	f.changes.Add(1)
	return &consensusv1.RecoverResponse{Report: &consensusv1.RecoveryReport{AppliedIndex: f.st.GetRaftIndex(), Revision: 10, NewRevision: 1000000010}}, nil
}

// serve starts consensus processes of fs with real mTLS and returns their
// targets and the admin's credentials.
func serve(t *testing.T, fs ...*fakeConsensus) ([]Target, *rpc.Credentials) {
	t.Helper()
	const cluster = "recovery.test"
	dir := t.TempDir()
	ca, err := pki.NewCA(cluster, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.WriteCA(dir, ca); err != nil {
		t.Fatal(err)
	}
	creds := func(p pki.Principal) *rpc.Credentials {
		iss, err := ca.Issue(pki.IssueRequest{Cluster: cluster, Principal: p, Validity: time.Hour, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
		if err != nil {
			t.Fatal(err)
		}
		base := pki.FileBase(p)
		if _, err := pki.WritePair(dir, base, iss.CertPEM, iss.KeyPEM); err != nil {
			t.Fatal(err)
		}
		c, err := rpc.LoadCredentials(cluster, rpc.TLSFiles{CA: filepath.Join(dir, pki.CACertFile), Cert: filepath.Join(dir, pki.CertFile(base)), Key: filepath.Join(dir, pki.KeyFile(base))})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	admin := creds(pki.Principal{Kind: pki.KindAdmin, Name: "alice"})
	var targets []Target
	for _, f := range fs {
		id := f.st.GetNodeId()
		srv, err := rpc.NewServer(rpc.ServerConfig{Credentials: creds(pki.Principal{Kind: pki.KindConsensus, Name: id}), Policy: rpc.Policy{
			consensusv1.Consensus_Status_FullMethodName:  {Allow: []pki.Kind{pki.KindAdmin}},
			consensusv1.Consensus_Recover_FullMethodName: {Allow: []pki.Kind{pki.KindAdmin}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		consensusv1.RegisterConsensusServer(srv.GRPC(), f)
		targets = append(targets, Target{Addr: rpctest.Serve(t, srv)})
	}
	return targets, admin
}

func node(i int) string { return fmt.Sprintf("node-%032x", i) }

// TestRecover: against consensus processes alone (no curator named), the
// recovery names the survivor by its node id, changes nothing without
// consent, recovers with it, and refuses while a member follows a leader.
func TestRecover(t *testing.T) {
	ctx := context.Background()
	a := &fakeConsensus{st: &consensusv1.StatusResponse{NodeId: node(1), MemberId: 0xa, State: consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING, RaftIndex: 50, RaftTerm: 2}}
	b := &fakeConsensus{st: &consensusv1.StatusResponse{NodeId: node(2), MemberId: 0xb, State: consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING, RaftIndex: 70, RaftTerm: 2}}
	targets, admin := serve(t, a, b)
	c := Cluster{Nodes: targets, Credentials: admin}
	var out bytes.Buffer
	opts := Options{Settle: 100 * time.Millisecond, Out: &out, Program: "curiactl"}

	rep, err := Recover(ctx, c, opts)
	if !errors.Is(err, ErrNoConsent) || !strings.Contains(err.Error(), "--confirm "+node(2)) || rep == nil || rep.Chosen != node(2) {
		t.Fatalf("without consent: %v, report %+v\n%s", err, rep, out.String())
	}
	if a.changes.Load()+b.changes.Load() != 0 {
		t.Fatal("changed something without consent")
	}
	if !strings.Contains(out.String(), "curiactl: the most up-to-date survivor is "+node(2)) {
		t.Errorf("progress:\n%s", out.String())
	}

	opts.Confirm = node(1)
	if _, err := Recover(ctx, c, opts); !errors.Is(err, ErrNoConsent) {
		t.Fatalf("consent to another node: %v", err)
	}
	opts.Confirm = node(2)
	rep, err = Recover(ctx, c, opts)
	if err != nil || b.changes.Load() != 1 || a.changes.Load() != 0 || rep.RecoveredAt.IsZero() {
		t.Fatalf("with consent: %v, changes %d %d", err, a.changes.Load(), b.changes.Load())
	}
	if len(rep.LostRevisions) == 0 || !strings.Contains(strings.Join(rep.LostRevisions, "\n"), "no surviving member that answered had applied more") {
		t.Errorf("lost revisions: %q", rep.LostRevisions)
	}

	// A member follows a leader: a quorum is reachable.
	a.st.LeaderId = 0xc
	_, err = Recover(ctx, c, opts)
	if !errors.Is(err, ErrQuorumReachable) || !strings.Contains(err.Error(), "follows leader c") {
		t.Fatalf("with a leader: %v", err)
	}
	if b.changes.Load() != 1 {
		t.Fatal("recovered although a quorum is reachable")
	}
}
