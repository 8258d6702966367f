//go:build e2e

package local_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
)

// checkComposeRecovery loses a majority of the compose cluster's voters
// for good (the etcd leader's node and another voter's: containers
// removed, consensus volumes deleted) and follows docs/operating/recovery.md: the recovery
// command says what it would do and names the survivor, does it with
// --confirm, the lost nodes come back empty and rejoin as learners, and
// the control plane is back at 3 voters with every node's record and the
// cluster configuration as before; the report, copied out of the init
// container as the compose file says, names the survivor. agree waits
// until roles and membership agree, with 3 voters and every node UP.
func checkComposeRecovery(t *testing.T, project string, env []string, m curatorv1.ManagementClient, creds *rpc.Credentials, agree func() map[string]bool) {
	// As docs/operating/recovery.md says, with a shorter --settle than its
	// 10 s default.
	recoverCmd, err := composeRecoverCommands(readDocs(t))
	if err != nil {
		t.Fatal(err)
	}
	composeRecoverCmd := append(recoverCmd, "--settle", "5s")
	t.Logf("docker compose %s", strings.Join(composeRecoverCmd, " "))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	run := func(args ...string) (string, int) {
		t.Helper()
		out, code, err := exited(composeCmd(ctx, env, args...).CombinedOutput())
		if err != nil {
			t.Fatalf("compose %v: %v\n%s", args, err, out)
		}
		return out, code
	}
	must := func(args ...string) string {
		t.Helper()
		out, code := run(args...)
		if code != 0 {
			t.Fatalf("compose %v: exit %d\n%s", args, code, out)
		}
		return out
	}

	// What the cluster holds before the loss: the nodes' records, the
	// configuration, and a snapshot (the report compares with the newest).
	before := nodeRecords(ctx, t, m)
	cfg, err := m.GetClusterConfig(ctx, &curatorv1.GetClusterConfigRequest{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := m.TakeSnapshot(ctx, &curatorv1.TakeSnapshotRequest{Reason: "e2e: before the compose cluster loses two voters"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := m.GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	host := func(id string) string { return before[id].GetStatus().GetAddress() }
	var leader string
	var followers []string
	for _, mem := range st.Members {
		switch {
		case mem.Learner:
			t.Fatalf("member %v is a learner", mem)
		case mem.Leader:
			leader = host(mem.NodeId)
		default:
			followers = append(followers, host(mem.NodeId))
		}
	}
	slices.Sort(followers)
	if leader == "" || len(followers) != 2 {
		t.Fatalf("leader %q, followers %v: want a leader and 2 followers", leader, followers)
	}
	survivor, lost := followers[0], []string{leader, followers[1]}
	slices.Sort(lost)
	lostIDs := map[string]bool{}
	for id := range before {
		if slices.Contains(lost, host(id)) {
			lostIDs[id] = true
		}
	}

	port := strings.TrimSpace(must("port", survivor, "7100"))
	cc, err := rpc.Dial(port, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindConsensus}})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cons := consensusv1.NewConsensusClient(cc)
	old, err := cons.Status(ctx, &consensusv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}

	// The loss: the machines and their disks are gone.
	var services []string
	for _, n := range lost {
		services = append(services, n, n+"-consensus", n+"-roleserve")
	}
	lostAt := time.Now()
	must(append([]string{"kill"}, services...)...)
	must(append([]string{"rm", "-f"}, services...)...)
	for _, n := range lost {
		if b, err := exec.CommandContext(ctx, "docker", "volume", "rm", project+"_"+n+"-consensus").CombinedOutput(); err != nil {
			t.Fatalf("docker volume rm: %v\n%s", err, b)
		}
	}
	t.Logf("voters: %s (the etcd leader) and %s lost with their consensus volumes, %s survives", lost[0], lost[1], survivor)

	// Without consent it says what it would do, and does nothing.
	var plan string
	proctest.Eventually(t, time.Minute, func() error {
		out, code := run(composeRecoverCmd...)
		if code != 2 {
			return fmt.Errorf("exit %d, want 2 (plan only):\n%s", code, out)
		}
		plan = out
		return nil
	})
	if !strings.Contains(plan, "the most up-to-date survivor is "+survivor+":") || !strings.Contains(plan, "--confirm "+survivor) {
		t.Fatalf("the plan does not name %s:\n%s", survivor, plan)
	}
	t.Logf("plan (%v after the loss):\n%s", time.Since(lostAt).Round(100*time.Millisecond), plan)

	// With consent, in the background: it waits for 3 voters, which needs
	// a lost node back, and they come back once the survivor is a new
	// cluster, as replaced machines would.
	type result struct {
		out  string
		code int
	}
	done := make(chan result, 1)
	confirmAt := time.Now()
	go func() {
		out, code, err := exited(composeCmd(ctx, env, append(slices.Clone(composeRecoverCmd), "--confirm", survivor, "--reason", "e2e: two voters lost with their data")...).CombinedOutput())
		if err != nil {
			out += err.Error()
		}
		done <- result{out, code}
	}()
	proctest.Eventually(t, 2*time.Minute, func() error {
		select {
		case r := <-done:
			t.Fatalf("curia-local recover --confirm %s ended (exit %d) before the survivor was a new cluster:\n%s", survivor, r.code, r.out)
		default:
		}
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		st, err := cons.Status(sctx, &consensusv1.StatusRequest{})
		if err != nil {
			return err
		}
		if st.ClusterId == old.ClusterId {
			return errors.New("not recovered yet")
		}
		return nil
	})
	t.Logf("%s is a new cluster %v after --confirm; the lost nodes come back empty", survivor, time.Since(confirmAt).Round(100*time.Millisecond))
	must(append([]string{"up", "-d", "--no-deps"}, services...)...)

	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatalf("curia-local recover --confirm %s did not end: %v", survivor, ctx.Err())
	}
	took := time.Since(confirmAt)
	t.Logf("curia-local recover --confirm %s:\n%s", survivor, r.out)
	if r.code != 0 {
		t.Fatalf("curia-local recover --confirm %s: exit %d", survivor, r.code)
	}
	t.Logf("--confirm → 3 healthy voters: %v (the loss → 3 voters: %v)", took.Round(100*time.Millisecond), time.Since(lostAt).Round(100*time.Millisecond))

	// Roles and membership agree again, with every node's record and the
	// configuration as they were.
	agree()
	after := nodeRecords(ctx, t, m)
	if !maps.EqualFunc(before, after, func(a, b *curatorv1.Node) bool { return nodeRecord(a) == nodeRecord(b) }) {
		t.Errorf("nodes before the loss:\n%v\nafter the recovery:\n%v", nodeRecordList(before), nodeRecordList(after))
	}
	cfgAfter, err := m.GetClusterConfig(ctx, &curatorv1.GetClusterConfigRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(cfg.GetConfig(), cfgAfter.GetConfig()) {
		t.Errorf("cluster configuration before the loss %v, after the recovery %v", cfg.GetConfig(), cfgAfter.GetConfig())
	}

	// The report, out of the init container's /state volume as the compose
	// file says (the --rm container that wrote it is gone).
	file := regexp.MustCompile(`report in (/state/recovery-\S+\.json)`).FindStringSubmatch(r.out)
	if file == nil {
		t.Fatalf("curia-local recover names no report:\n%s", r.out)
	}
	ids := strings.Fields(must("ps", "-a", "-q", "init"))
	if len(ids) == 0 {
		t.Fatal("no init container")
	}
	dir := t.TempDir()
	if b, err := exec.CommandContext(ctx, "docker", "cp", ids[0]+":"+file[1], dir).CombinedOutput(); err != nil {
		t.Fatalf("docker cp the report: %v\n%s", err, b)
	}
	b, err := os.ReadFile(filepath.Join(dir, filepath.Base(file[1])))
	if err != nil {
		t.Fatal(err)
	}
	var rep recoveryReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	dropped := map[string]bool{}
	for _, d := range rep.Consensus.DroppedMembers {
		dropped[d.NodeID] = true
	}
	compared := slices.ContainsFunc(rep.LostRevisions, func(l string) bool { return strings.Contains(l, snap.GetSnapshot().GetName()) })
	if rep.Chosen != survivor || rep.Voters != 3 || !maps.Equal(dropped, lostIDs) || !compared {
		t.Errorf("report: chosen %s, %d voters, dropped %v, lost revisions %q; want %s, 3, %v (%v), a comparison with snapshot %s",
			rep.Chosen, rep.Voters, dropped, rep.LostRevisions, survivor, lostIDs, lost, snap.GetSnapshot().GetName())
	}
	t.Logf("report %s: chosen %s, re-added %v, 3 voters %s after it began", file[1], rep.Chosen, rep.Readded, rep.VotersAfter)
}

// exited is a command's output and exit code, as CombinedOutput returned
// them; err only when it did not run to an exit (code -1).
func exited(b []byte, err error) (string, int, error) {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(b), 0, nil
	case errors.As(err, &ee):
		return string(b), ee.ExitCode(), nil
	}
	return string(b), -1, err
}

// nodeRecords is every node (GetNodes) by id.
func nodeRecords(ctx context.Context, t *testing.T, m curatorv1.ManagementClient) map[string]*curatorv1.Node {
	t.Helper()
	stream, err := m.GetNodes(ctx, &curatorv1.GetNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*curatorv1.Node{}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range resp.Nodes {
			out[n.GetId()] = n
		}
	}
}

// nodeRecord is what a recovery must keep of a node: what was written for
// it, not its roles, health or status, which the recovery changes.
func nodeRecord(n *curatorv1.Node) string {
	labels := slices.Sorted(maps.Keys(n.GetLabels()))
	for i, k := range labels {
		labels[i] = k + "=" + n.GetLabels()[k]
	}
	return fmt.Sprintf("%s %s %x %s [%s]", n.GetId(), n.GetStatus().GetAddress(), n.GetPublicKey(), n.GetState(), strings.Join(labels, " "))
}

func nodeRecordList(ns map[string]*curatorv1.Node) string {
	var out []string
	for _, n := range ns {
		out = append(out, nodeRecord(n))
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}
