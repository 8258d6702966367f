//go:build faults

package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"curia.dev/deploy/local"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
)

// TestRecoveryRefusedInPartition: a voter cut off from every other host
// (its own namespace's iptables) has no leader, as after a quorum loss; but
// the majority still has its quorum. The recovery, asked from the
// operator's vantage (the host, which still reaches every process), finds
// the curators answering for the majority's cluster and refuses, and
// changes nothing. (The consensus process's own check cannot tell: from
// inside the minority a partition looks like a loss; curia-local recover
// is the way in.)
func TestRecoveryRefusedInPartition(t *testing.T) {
	preconditions(t)
	// Kept when the test fails: the processes' logs are in it.
	dir, err := os.MkdirTemp("", "curia-recover-partition-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	bin := filepath.Join(dir, "bin")
	binaries(t, bin)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c, stop, err := startCluster(ctx, Config{Dir: dir, Bin: bin, Subnet: "10.211.8", Name: "curiarec", VoterFloor: 1, Out: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// Three voters (the suite's cluster may come up with fewer): without
	// the leader, two keep their quorum.
	mctx, mcancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = curatorv1.NewManagementClient(c.admin).UpdateClusterConfig(mctx, &curatorv1.UpdateClusterConfigRequest{
		Config: &curatorv1.ClusterConfig{ControlPlaneSize: 3}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"control_plane_size"}}, Reason: "fault test: three voters",
	})
	mcancel()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for voters := 0; voters != 3; {
		if time.Now().After(deadline) {
			t.Fatalf("%d voters, want 3", voters)
		}
		voters = 0
		if err := c.converged(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := curatorv1.NewManagementClient(c.admin).GetConsensusStatus(sctx, &curatorv1.GetConsensusStatusRequest{})
		scancel()
		if err == nil {
			voters = int(st.GetVoters())
		}
		if voters != 3 {
			time.Sleep(500 * time.Millisecond) // a poll's interval
		}
	}
	leader, err := c.etcdLeaderHost(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.net.Isolate(leader); err != nil {
		t.Fatal(err)
	}
	var n local.Node
	for _, x := range c.lc.NodeList() {
		if x.Name == leader {
			n = x
		}
	}
	cc, err := c.conn(n.ConsensusAPI(), pki.KindConsensus)
	if err != nil {
		t.Fatal(err)
	}
	api := consensusv1.NewConsensusClient(cc)
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	before, err := waitLeaderless(wctx, api)
	wcancel()
	if err != nil {
		rules, _ := exec.Command("ip", "netns", "exec", c.net.ns(leader), "iptables", "-S").CombinedOutput()
		t.Fatalf("the isolated etcd leader %s: %v; its rules:\n%s", leader, err, rules)
	}
	_, err = c.lc.Recover(ctx, local.RecoverOptions{Confirm: leader, Settle: 3 * time.Second, Reason: "fault test: partition", Out: os.Stderr})
	if err == nil || !strings.Contains(err.Error(), "a quorum is reachable") {
		t.Fatalf("recover with the majority partitioned from %s: %v, want refused: a quorum is reachable", leader, err)
	}
	t.Log(err)
	after, err := api.Status(ctx, &consensusv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if after.ClusterId != before.ClusterId || after.MemberId != before.MemberId {
		t.Fatalf("the isolated member changed: %v, was %v", after, before)
	}
	if err := c.net.HealAll(); err != nil {
		t.Fatal(err)
	}
	if err := c.converged(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// waitLeaderless waits until the member has no leader, and returns its
// status then.
func waitLeaderless(ctx context.Context, api consensusv1.ConsensusClient) (*consensusv1.StatusResponse, error) {
	var last error
	for ctx.Err() == nil {
		st, err := api.Status(ctx, &consensusv1.StatusRequest{})
		switch {
		case err != nil:
			last = err
		case st.LeaderId == 0:
			return st, nil
		default:
			last = fmt.Errorf("still follows %x (%s, term %d)", st.LeaderId, st.State, st.RaftTerm)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil, last
}
