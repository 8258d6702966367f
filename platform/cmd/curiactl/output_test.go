package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/recovery"
)

var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func testNodes() []*curatorv1.Node {
	return []*curatorv1.Node{
		{
			Id: "node-00000000000000000000000000000001", State: curatorv1.NodeState_NODE_STATE_UP,
			Health: curatorv1.NodeHealth_NODE_HEALTH_HEALTHY, LastHeartbeat: timestamppb.New(now.Add(-3 * time.Second)),
			Roles: &curatorv1.Roles{
				ConsensusMember: &curatorv1.ConsensusMember{
					MemberCertificate: []byte("-----BEGIN CERTIFICATE-----\nMEMBERCERT\n-----END CERTIFICATE-----\n"),
					Join:              &consensusv1.JoinParameters{CaCertificate: []byte("CACERT"), MemberId: 0x8e9e05c52164694d},
				},
				KubernetesController: &curatorv1.KubernetesController{},
			},
			Status: &curatorv1.NodeStatus{Address: "127.0.0.11", Version: "v1.2.3"},
		},
		{
			Id: "node-00000000000000000000000000000002", State: curatorv1.NodeState_NODE_STATE_NEW,
			Health: curatorv1.NodeHealth_NODE_HEALTH_UNKNOWN,
		},
	}
}

func TestNodeTable(t *testing.T) {
	var b bytes.Buffer
	tw := newTable(&b)
	nodeTable(tw, testNodes(), now)
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	want := `ID                                     STATE  HEALTH   ROLES                                   ADDRESS     VERSION  HEARTBEAT
node-00000000000000000000000000000001  UP     HEALTHY  consensus-member,kubernetes-controller  127.0.0.11  v1.2.3   3s ago
node-00000000000000000000000000000002  NEW    UNKNOWN  -                                       -           -        never
`
	if b.String() != want {
		t.Fatalf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestNoCertificateBytes: no output format prints a certificate.
func TestNoCertificateBytes(t *testing.T) {
	var nodes []*curatorv1.Node
	for _, n := range testNodes() {
		nodes = append(nodes, redact(n))
	}
	for _, format := range []string{"table", "json", "yaml"} {
		var b bytes.Buffer
		if err := printMessage(&b, format, &curatorv1.GetNodesResponse{Nodes: nodes}, func(w io.Writer) { nodeTable(w, nodes, now) }); err != nil {
			t.Fatal(err)
		}
		for _, secret := range []string{"MEMBERCERT", "BEGIN CERTIFICATE", "LS0tLS1CRUdJTi", "Q0FDRVJU"} {
			if strings.Contains(b.String(), secret) {
				t.Errorf("-o %s prints %q:\n%s", format, secret, b.String())
			}
		}
		if format != "table" && !strings.Contains(b.String(), "node-00000000000000000000000000000001") {
			t.Errorf("-o %s lacks the node:\n%s", format, b.String())
		}
	}
	if testNodes()[0].GetRoles().GetConsensusMember().GetMemberCertificate() == nil {
		t.Fatal("redact changed its argument")
	}
	var b bytes.Buffer
	nodeDetail(&b, nodes[0], now)
	if strings.Contains(b.String(), "MEMBERCERT") || !strings.Contains(b.String(), "8e9e05c52164694d") {
		t.Fatalf("nodes get:\n%s", b.String())
	}
}

func TestYAMLUsesJSONNames(t *testing.T) {
	var b bytes.Buffer
	cfg := &curatorv1.GetClusterConfigResponse{Config: &curatorv1.ClusterConfig{ControlPlaneSize: 3, DeadNodeThreshold: durationpb.New(5 * time.Minute)}, Revision: 7}
	if err := printMessage(&b, "yaml", cfg, nil); err != nil {
		t.Fatal(err)
	}
	want := "config:\n  controlPlaneSize: 3\n  deadNodeThreshold: 300s\nrevision: \"7\"\n"
	if b.String() != want {
		t.Fatalf("yaml:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestConfigTable(t *testing.T) {
	var b bytes.Buffer
	tw := newTable(&b)
	configTable(tw, &curatorv1.ClusterConfig{ControlPlaneSize: 3, DeadNodeThreshold: durationpb.New(5 * time.Minute), MinQuorum: 1,
		Stabilization: durationpb.New(2 * time.Second), PauseReason: "disk"}, 42)
	tw.Flush()
	want := `KEY                  VALUE
control_plane_size   3
dead_node_threshold  5m0s
min_quorum           1
stabilization        2s
paused               false
pause_reason         "disk"
revision             42
`
	if b.String() != want {
		t.Fatalf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestParseAssignments(t *testing.T) {
	cfg, paths, err := parseAssignments([]string{"control_plane_size=5", "dead-node-threshold=90s", "paused=true", "pause_reason=a=b", "paused=false"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(paths, ",") != "control_plane_size,dead_node_threshold,paused,pause_reason" {
		t.Errorf("paths %v", paths)
	}
	if cfg.GetControlPlaneSize() != 5 || cfg.GetDeadNodeThreshold().AsDuration() != 90*time.Second || cfg.GetPaused() || cfg.GetPauseReason() != "a=b" {
		t.Errorf("config %v", cfg)
	}
	for in, want := range map[string]string{
		"control_plane_size":    "want KEY=VALUE",
		"size=3":                `unknown key "size": the keys are control_plane_size, dead_node_threshold`,
		"control_plane_size=-1": "no unsigned number",
		"paused=maybe":          "not true or false",
		"stabilization=2":       "no duration",
	} {
		if _, _, err := parseAssignments([]string{in}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
}

func TestHumanDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		1500 * time.Millisecond:          "2s",
		3 * time.Minute:                  "3m",
		3*time.Minute + 12*time.Second:   "3m12s",
		5*time.Hour + 3*time.Minute:      "5h3m",
		4*24*time.Hour + 2*time.Hour + 1: "4d2h",
	} {
		if got := humanDuration(d); got != want {
			t.Errorf("%v: %s, want %s", d, got, want)
		}
	}
	if got := bytesSize(20 * 1024 * 1024); got != "20.0 MiB" {
		t.Errorf("bytesSize: %s", got)
	}
}

func TestStatusTable(t *testing.T) {
	var b bytes.Buffer
	tw := newTable(&b)
	statusTable(tw, &clusterStatus{Cluster: "curia", CuratorLeader: "curator-1", CuratorTerm: 12, EtcdLeader: "node-a", EtcdLeaderMember: "8e9e05c52164694d",
		Voters: []string{"node-a", "node-b", "node-c"}, HealthyVoters: 3, Quorum: 2, FailureTolerance: 1, MembershipEpoch: 5,
		ActiveReconciler: "reconciler-2", Paused: true, PauseReason: "maintenance", ControlPlaneSize: 3, ConfigRevision: 9,
		NodesByState: map[string]int64{"NODE_STATE_UP": 4, "NODE_STATE_NEW": 1},
		Learners:     []string{"node-d"}, LearnerLag: map[string]uint64{"node-d": 120},
		ReconcilerLastResult: "WAITING", ReconcilerLastDetail: "a learner\nto catch up", ReconcilerLastRun: "2026-01-02T03:04:00Z", ReconcilerPaused: "drill",
		PendingChange: &pendingChange{ID: "c1", Operation: "PROMOTE", NodeID: "node-d", MemberID: "00000000000000dd", Actor: "reconciler",
			Fence: []string{"leases/reconciler@7", "epoch@12"}, RecordedBy: "consensus/node-a", Since: "2026-01-02T03:03:50Z", Deadline: "30s"}}, now)
	tw.Flush()
	for _, want := range []string{
		"CURATOR LEADER:      curator-1 (term 12)\n",
		"ETCD LEADER:         node-a (member 8e9e05c52164694d)\n",
		"VOTERS:              3, 3 healthy, quorum 2: node-a node-b node-c\n",
		"FAILURE TOLERANCE:   1\n",
		"LEARNERS:            1 node-d (lag 120)\n",
		"PENDING CHANGE:      PROMOTE node-d (member 00000000000000dd) by reconciler since 2026-01-02T03:03:50Z, 15s ago; fence leases/reconciler@7 epoch@12; change c1, recorded by consensus/node-a\n",
		"ACTIVE RECONCILER:   reconciler-2 (last pass WAITING at 2026-01-02T03:04:00Z)\n",
		"RECONCILER SAYS:     a learner to catch up\n",
		"PAUSED:              yes: maintenance; the active reconciler is paused (Reconciler/Pause): drill\n",
		"NODES:               NEW=1 UP=4\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	tw = newTable(&b)
	statusTable(tw, &clusterStatus{}, now)
	tw.Flush()
	if !strings.Contains(b.String(), "PENDING CHANGE:      none\n") {
		t.Errorf("status without a pending change:\n%s", b.String())
	}
}

func TestFormatError(t *testing.T) {
	st, err := status.New(codes.Aborted, "a membership change is in flight").WithDetails(
		&errdetails.ErrorInfo{Reason: "CHANGE_PENDING", Domain: "curia.dev", Metadata: map[string]string{"node": "node-x"}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)},
	)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if code := renderError(&b, st.Err()); code != exitRefused {
		t.Errorf("exit %d, want %d", code, exitRefused)
	}
	want := "Error: ABORTED: a membership change is in flight\n  reason: CHANGE_PENDING\n  node: node-x\n  retry after: 1.5s\n"
	if b.String() != want {
		t.Errorf("rendered:\n%s\nwant:\n%s", b.String(), want)
	}

	st, _ = status.New(codes.InvalidArgument, "invalid request").WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
		{Field: "node_id", Description: "must be node-<32 hex digits>", Reason: "node_id"},
	}})
	if got := formatError(st.Err()); got != "Error: INVALID_ARGUMENT: invalid request\n  field node_id: must be node-<32 hex digits> (node_id)\n" {
		t.Errorf("rendered:\n%s", got)
	}
	if got := formatError(errors.New("open x: no such file")); got != "Error: open x: no such file\n" {
		t.Errorf("rendered:\n%s", got)
	}
}

func TestExitCodes(t *testing.T) {
	for err, want := range map[error]int{
		status.Error(codes.NotFound, ""):                 exitNotFound,
		status.Error(codes.Unavailable, ""):              exitUnavailable,
		status.Error(codes.DeadlineExceeded, ""):         exitUnavailable,
		status.Error(codes.InvalidArgument, ""):          exitInvalid,
		status.Error(codes.FailedPrecondition, ""):       exitRefused,
		status.Error(codes.PermissionDenied, ""):         exitDenied,
		status.Error(codes.Internal, ""):                 exitFailed,
		usageError{errors.New("x")}:                      exitUsage,
		configError{errors.New("x")}:                     exitConfig,
		errors.New("local"):                              exitFailed,
		context.DeadlineExceeded:                         exitUnavailable,
		fmt.Errorf("x: %w", recovery.ErrNoConsent):       exitRefused,
		fmt.Errorf("%w: y", recovery.ErrQuorumReachable): exitRefused,
		fmt.Errorf("%w: z", recovery.ErrNoSurvivor):      exitRefused,
		fmt.Errorf("%w: w", recovery.ErrBadSnapshot):     exitFailed,
	} {
		if got := exitCode(err); got != want {
			t.Errorf("%v: exit %d, want %d", err, got, want)
		}
	}
	if codeName(codes.OK) != "OK" || codeName(codes.FailedPrecondition) != "FAILED_PRECONDITION" {
		t.Errorf("codeName: %s %s", codeName(codes.OK), codeName(codes.FailedPrecondition))
	}
}

// TestSettingsNamed: without connection settings, curiactl says which flag
// or variable is missing, and exits 3.
func TestSettingsNamed(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	try := func(want string, args ...string) {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, getenv, &out, &errOut); code != exitConfig {
			t.Errorf("%v: exit %d, want %d\n%s", args, code, exitConfig, errOut.String())
		}
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("%v: %q, want it to name %q", args, errOut.String(), want)
		}
	}
	try("pass --curator or set CURIA_CURATORS or CURIA_CURATOR", "status")
	env["CURIA_CURATOR"] = "127.0.0.1:1"
	try("pass --ca or set CURIA_CACERT", "nodes", "list")
	env["CURIA_CACERT"] = filepath.Join(dir, "ca.crt")
	try("pass --cert or set CURIA_ADMIN_CERT", "config", "get")
	try("pass --key or set CURIA_ADMIN_KEY", "--cert", "x.crt", "config", "get")
	env["CURIA_ADMIN_CERT"], env["CURIA_ADMIN_KEY"] = filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key")
	try("no cluster name: pass --cluster or set CURIA_CLUSTER", "audit", "tail")
	env["CURIA_CLUSTER"] = "curia"
	try("admin credentials: read TLS file", "snapshot", "list")
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"bogus"}, {"nodes", "get"}, {"nodes", "list", "--bogus"}, {"status", "-o", "xml"},
		{"config", "set", "nope=1"}, {"audit", "tail", "-n", "0"}, {"nodes", "roles", "set", "node-x"},
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, func(string) string { return "" }, &out, &errOut); code != exitUsage {
			t.Errorf("%v: exit %d, want %d: %s", args, code, exitUsage, errOut.String())
		}
	}
}

// TestEveryCommandHasAnExample: every command's --help shows an example.
func TestEveryCommandHasAnExample(t *testing.T) {
	root, _ := newRoot(func(string) string { return "" }, io.Discard, io.Discard)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Name() != "help" && c.Name() != "completion" && c.Example == "" {
			t.Errorf("%s has no example", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	var out bytes.Buffer
	if code := run(context.Background(), []string{"completion", "bash"}, func(string) string { return "" }, &out, io.Discard); code != 0 || !strings.Contains(out.String(), "__start_curiactl") {
		t.Errorf("completion bash: exit %d\n%.200s", code, out.String())
	}
}

func TestSaveChecksSizeAndHash(t *testing.T) {
	data := []byte("etcd snapshot bytes")
	sum := sha256.Sum256(data)
	meta := &curatorv1.SnapshotMetadata{Name: "snapshot-x", Size: int64(len(data)), Sha256: hex.EncodeToString(sum[:])}
	chunks := [][]byte{data[5:10], data[10:]}
	recv := func() (*curatorv1.GetSnapshotResponse, error) {
		if len(chunks) == 0 {
			return nil, io.EOF
		}
		c := chunks[0]
		chunks = chunks[1:]
		return &curatorv1.GetSnapshotResponse{Chunk: c}, nil
	}
	h := sha256.New()
	var b bytes.Buffer
	n, err := copyChunks(io.MultiWriter(&b, h), data[:5], recv)
	if err != nil || n != int64(len(data)) || !bytes.Equal(b.Bytes(), data) {
		t.Fatalf("copyChunks: %d %v %q", n, err, b.Bytes())
	}
	if err := verify(meta, n, h); err != nil {
		t.Fatal(err)
	}
	if err := verify(meta, n-1, h); err == nil || !strings.Contains(err.Error(), "metadata says") {
		t.Errorf("short: %v", err)
	}
	bad := sha256.New()
	bad.Write([]byte("other"))
	if err := verify(meta, n, bad); err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("bad hash: %v", err)
	}
}
