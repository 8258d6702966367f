package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpc/rpctest"
)

const testCluster = "curiactl.test"

// fakeManagement answers a few Management calls the way a curator does.
type fakeManagement struct {
	curatorv1.UnimplementedManagementServer
	snapshot []byte
	// badHash makes GetSnapshot's metadata carry a sha256 of other bytes.
	badHash bool
}

var fakeIDs = []string{"node-0000000000000000000000000000000a", "node-0000000000000000000000000000000b"}

func (f *fakeManagement) GetNodes(req *curatorv1.GetNodesRequest, s grpc.ServerStreamingServer[curatorv1.GetNodesResponse]) error {
	// One batch a node, as a curator sends them in several.
	for _, id := range fakeIDs {
		if req.GetFilter() != "" && !strings.Contains(req.GetFilter(), `"`+id+`"`) {
			continue
		}
		n := &curatorv1.Node{Id: id, State: curatorv1.NodeState_NODE_STATE_UP, Health: curatorv1.NodeHealth_NODE_HEALTH_HEALTHY,
			Roles: &curatorv1.Roles{ConsensusMember: &curatorv1.ConsensusMember{MemberCertificate: []byte("-----BEGIN CERTIFICATE-----")}}}
		if err := s.Send(&curatorv1.GetNodesResponse{Nodes: []*curatorv1.Node{n}}); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeManagement) ApproveNode(context.Context, *curatorv1.ApproveNodeRequest) (*curatorv1.ApproveNodeResponse, error) {
	st, err := status.New(codes.Unavailable, "not leader: no curator leads yet").WithDetails(
		&errdetails.ErrorInfo{Reason: "NOT_LEADER", Domain: "curia.dev"},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(2 * time.Second)})
	if err != nil {
		return nil, err
	}
	return nil, st.Err()
}

func (f *fakeManagement) ListSnapshots(context.Context, *curatorv1.ListSnapshotsRequest) (*curatorv1.ListSnapshotsResponse, error) {
	return &curatorv1.ListSnapshotsResponse{Snapshots: []*curatorv1.SnapshotMetadata{f.meta()}}, nil
}

func (f *fakeManagement) meta() *curatorv1.SnapshotMetadata {
	sum := sha256.Sum256(f.snapshot)
	if f.badHash {
		sum = sha256.Sum256([]byte("other bytes"))
	}
	return &curatorv1.SnapshotMetadata{Name: "snapshot-20260101T000000Z-rev7", Revision: 7, Size: int64(len(f.snapshot)), Sha256: hex.EncodeToString(sum[:])}
}

func (f *fakeManagement) GetSnapshot(req *curatorv1.GetSnapshotRequest, s grpc.ServerStreamingServer[curatorv1.GetSnapshotResponse]) error {
	if req.GetName() != f.meta().GetName() {
		return status.Errorf(codes.NotFound, "no snapshot %s", req.GetName())
	}
	if err := s.Send(&curatorv1.GetSnapshotResponse{Snapshot: f.meta()}); err != nil {
		return err
	}
	for b := f.snapshot; len(b) > 0; {
		n := min(len(b), 3000)
		if err := s.Send(&curatorv1.GetSnapshotResponse{Chunk: b[:n]}); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// serveFake starts a curator-like server of f, with real mTLS, and returns
// its address and the admin's TLS files.
func serveFake(t *testing.T, f *fakeManagement) (string, rpc.TLSFiles) {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA(testCluster, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.WriteCA(dir, ca); err != nil {
		t.Fatal(err)
	}
	pair := func(p pki.Principal) rpc.TLSFiles {
		iss, err := ca.Issue(pki.IssueRequest{Cluster: testCluster, Principal: p, Validity: time.Hour, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
		if err != nil {
			t.Fatal(err)
		}
		base := pki.FileBase(p)
		if _, err := pki.WritePair(dir, base, iss.CertPEM, iss.KeyPEM); err != nil {
			t.Fatal(err)
		}
		return rpc.TLSFiles{CA: filepath.Join(dir, pki.CACertFile), Cert: filepath.Join(dir, pki.CertFile(base)), Key: filepath.Join(dir, pki.KeyFile(base))}
	}
	creds, err := rpc.LoadCredentials(testCluster, pair(pki.Principal{Kind: pki.KindCurator}))
	if err != nil {
		t.Fatal(err)
	}
	admin := []pki.Kind{pki.KindAdmin}
	srv, err := rpc.NewServer(rpc.ServerConfig{Credentials: creds, Policy: rpc.Policy{
		curatorv1.Management_GetNodes_FullMethodName:      {Allow: admin},
		curatorv1.Management_ApproveNode_FullMethodName:   {Allow: admin},
		curatorv1.Management_ListSnapshots_FullMethodName: {Allow: admin},
		curatorv1.Management_GetSnapshot_FullMethodName:   {Allow: admin},
	}})
	if err != nil {
		t.Fatal(err)
	}
	curatorv1.RegisterManagementServer(srv.GRPC(), f)
	addr := rpctest.Serve(t, srv)
	return addr, pair(pki.Principal{Kind: pki.KindAdmin, Name: "alice"})
}

// TestAgainstAServer runs curiactl against a server with the curators'
// TLS: connection settings from the environment (the cluster name from the
// certificate), streams read to their end, errors with their details.
func TestAgainstAServer(t *testing.T) {
	f := &fakeManagement{snapshot: bytes.Repeat([]byte("etcd snapshot "), 1000)}
	addr, files := serveFake(t, f)
	env := map[string]string{envCurators: "127.0.0.1:1," + addr, envCA: files.CA, envCert: files.Cert, envKey: files.Key}
	curiactl := func(args ...string) (string, string, int) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"--timeout", "10s"}, args...), func(k string) string { return env[k] }, &out, &errOut)
		return out.String(), errOut.String(), code
	}

	out, errOut, code := curiactl("nodes", "list")
	if code != 0 || !strings.Contains(out, fakeIDs[0]+"  UP") || !strings.Contains(out, fakeIDs[1]+"  UP") {
		t.Errorf("nodes list: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = curiactl("nodes", "get", fakeIDs[1], "-o", "json")
	if code != 0 || !strings.Contains(out, `"id": "`+fakeIDs[1]+`"`) || strings.Contains(out, "memberCertificate") {
		t.Errorf("nodes get -o json: exit %d\n%s%s", code, out, errOut)
	}
	_, errOut, code = curiactl("nodes", "get", "node-ffffffffffffffffffffffffffffffff")
	if code != exitNotFound || !strings.Contains(errOut, "Error: NOT_FOUND: ") {
		t.Errorf("nodes get of an unknown node: exit %d\n%s", code, errOut)
	}
	_, errOut, code = curiactl("nodes", "approve", fakeIDs[0])
	if want := "Error: UNAVAILABLE: not leader: no curator leads yet\n  reason: NOT_LEADER\n  retry after: 2s\n"; code != exitUnavailable || errOut != want {
		t.Errorf("nodes approve: exit %d\n%s\nwant exit %d\n%s", code, errOut, exitUnavailable, want)
	}

	dir := t.TempDir()
	file := filepath.Join(dir, "backup.db")
	out, errOut, code = curiactl("snapshot", "save", file)
	if b, err := os.ReadFile(file); code != 0 || err != nil || !bytes.Equal(b, f.snapshot) || !strings.Contains(out, "REVISION:  7\n") {
		t.Fatalf("snapshot save: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	f.badHash = true
	_, errOut, code = curiactl("snapshot", "save", filepath.Join(dir, "bad.db"))
	if code != exitFailed || !strings.Contains(errOut, "not saved") {
		t.Errorf("snapshot save of a snapshot whose hash differs: exit %d\n%s", code, errOut)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("after a failed save the directory holds %v, want backup.db alone", entries)
	}

	// The wrong cluster name: the credentials do not load.
	env[envCluster] = "other.test"
	if _, errOut, code = curiactl("nodes", "list"); code != exitConfig || !strings.Contains(errOut, "admin credentials") {
		t.Errorf("wrong cluster: exit %d\n%s", code, errOut)
	}
}
