//go:build e2e

package local_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
)

// recoverSubnet is the recovery test's cluster's, apart from TestE2E's.
const recoverSubnet = "127.0.98"

// host is the loopback address of node-i (1-based) of the recovery cluster.
func host(i int) string { return fmt.Sprintf("%s.%d", recoverSubnet, 10+i) }

// nodeIndex is i of node-i.
func nodeIndex(name string) int {
	i, err := strconv.Atoi(strings.TrimPrefix(name, "node-"))
	if err != nil {
		panic("not a node name: " + name)
	}
	return i
}

// etcdAsCurator opens an etcd client with the curators' certificate.
func (c *cluster) etcdAsCurator(endpoints ...string) *clientv3.Client {
	t := c.t
	creds, err := rpc.LoadCredentials("curia", rpc.TLSFiles{
		CA:   c.env["CURIA_CACERT"],
		Cert: filepath.Join(c.state, "secrets", "curator", "tls.crt"),
		Key:  filepath.Join(c.state, "secrets", "curator", "tls.key"),
	})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: rpc.ClientTLSConfig(creds, []pki.Kind{pki.KindMember}), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// consensusOf is node's consensus API, as the admin.
func (c *cluster) consensusOf(name string) consensusv1.ConsensusClient {
	return consensusv1.NewConsensusClient(c.conn(host(nodeIndex(name))+":7100", pki.KindConsensus))
}

// recoverCmd runs curia-local recover with args and returns its output
// and exit code.
func (c *cluster) recoverCmd(args ...string) (string, int) {
	cmd := exec.Command(filepath.Join(c.bin, "curia-local"), append(append([]string{"recover"}, c.layout...), args...)...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	c.t.Fatalf("curia-local recover: %v\n%s", err, out)
	return "", -1
}

// TestRecovery: quorum loss on a 3-voter process cluster. A healthy cluster
// is refused; with the etcd leader's node wiped and another voter's frozen,
// the survivor's data becomes the cluster and the control plane grows back
// to 3 voters hands-off with every acknowledged write; the frozen voter
// thaws with its old data and is wiped, not let back. Then every voter's
// data is lost and a snapshot restored.
func TestRecovery(t *testing.T) {
	t.Parallel() // a cluster of its own, on its own loopback subnet
	c := startOn(t, recoverSubnet, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	var voters []string // node names
	for id := range c.voters() {
		voters = append(voters, c.names[id])
	}
	slices.Sort(voters)
	if len(voters) != 3 {
		t.Fatalf("voters %v, want 3", voters)
	}
	// The etcd leader dies with the other voter: the survivor is a follower.
	leader := c.names[c.leader()]
	survivor := voters[slices.IndexFunc(voters, func(v string) bool { return v != leader })]
	var lost []string
	for _, v := range voters {
		if v != survivor {
			lost = append(lost, v)
		}
	}
	t.Logf("voters %v, leader %s: %s survives, %v are lost", voters, leader, survivor, lost)

	var clientURLs []string
	for _, v := range voters {
		clientURLs = append(clientURLs, "https://"+host(nodeIndex(v))+":2379")
	}
	cli := c.etcdAsCurator(clientURLs...)

	t.Run("a healthy cluster is refused", func(t *testing.T) {
		out, code := c.recoverCmd("--confirm", survivor, "--settle", "2s", "--wait", "0")
		if code != 1 || !strings.Contains(out, "a quorum is reachable") {
			t.Fatalf("curia-local recover on a healthy cluster: exit %d, want 1 and \"a quorum is reachable\":\n%s", code, out)
		}
	})

	// A partition of the majority (not a loss) is refused too: loopback
	// addresses cannot be cut apart here (every connection's source is
	// 127.0.0.1), so deploy/faults' TestRecoveryRefusedInPartition does it
	// in network namespaces.

	// Traffic, then the loss. Writes stop, and the survivor applies what
	// the leader acknowledged, before the kill: what the survivor never
	// received is lost by definition (the report says how much may be).
	acked := writeBatch(ctx, cli, "/e2e/recovery/a/", 200)
	leaderStatus, err := c.consensusOf(leader).Status(ctx, &consensusv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	proctest.Eventually(t, 30*time.Second, func() error {
		st, err := c.consensusOf(survivor).Status(ctx, &consensusv1.StatusRequest{})
		if err != nil {
			return err
		}
		if st.RaftIndex < leaderStatus.RaftIndex {
			return fmt.Errorf("%s applied %d, the leader %d", survivor, st.RaftIndex, leaderStatus.RaftIndex)
		}
		return nil
	})
	// The leader's node loses its disk: wiped and killed, the supervisor
	// restarts an empty process. The other lost voter is frozen with its
	// data, as a machine that is off, and comes back after the recovery.
	frozen := lost[slices.IndexFunc(lost, func(n string) bool { return n != leader })]
	frozenSt, err := c.consensusOf(frozen).Status(ctx, &consensusv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	lostAt := time.Now()
	if err := os.RemoveAll(filepath.Join(c.state, "data", leader, "consensus")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(c.pid(leader+"-consensus"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	frozenPID := c.pid(frozen + "-consensus")
	if err := syscall.Kill(frozenPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(frozenPID, syscall.SIGCONT) })
	t.Logf("%s wiped and killed, %s frozen with its data (member %x); %d writes acknowledged", leader, frozen, frozenSt.MemberId, len(acked))

	// Without consent it says what it would do, and does nothing.
	var plan string
	proctest.Eventually(t, time.Minute, func() error {
		out, code := c.recoverCmd()
		if code != 2 {
			return fmt.Errorf("exit %d, want 2 (plan only):\n%s", code, out)
		}
		plan = out
		return nil
	})
	if !strings.Contains(plan, "the most up-to-date survivor is "+survivor) || !strings.Contains(plan, "--confirm "+survivor) {
		t.Fatalf("the plan does not name %s:\n%s", survivor, plan)
	}
	t.Logf("plan:\n%s", plan)

	// The frozen member thaws once the survivor is a new cluster: its old
	// data cannot rejoin (another cluster id), and its agent wipes it
	// (its node lost ConsensusMember: a role without a member).
	type result struct {
		out  string
		code int
	}
	done := make(chan result, 1)
	go func() {
		out, code := c.recoverCmd("--confirm", survivor, "--reason", "e2e: two voters lost", "--wait", "5m")
		done <- result{out, code}
	}()
	proctest.Eventually(t, 2*time.Minute, func() error {
		st, err := c.consensusOf(survivor).Status(ctx, &consensusv1.StatusRequest{})
		if err != nil {
			return err
		}
		if st.ClusterId == frozenSt.ClusterId {
			return errors.New("not recovered yet")
		}
		return nil
	})
	if err := syscall.Kill(frozenPID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	r := <-done
	out, code := r.out, r.code
	t.Logf("curia-local recover:\n%s", out)
	if code != 0 {
		t.Fatalf("curia-local recover --confirm %s: exit %d", survivor, code)
	}
	took := time.Since(lostAt)
	t.Logf("majority gone → 3 healthy voters: %v (recover command and regrowth)", took.Round(100*time.Millisecond))

	rep := readReport(t, c, 1)
	var dropped []string
	for _, d := range rep.Consensus.DroppedMembers {
		dropped = append(dropped, c.names[d.NodeID])
	}
	slices.Sort(dropped)
	if rep.Chosen != survivor || rep.Voters != 3 || len(rep.Readded) != 2 || !slices.Equal(dropped, lost) || len(rep.LostRevisions) == 0 {
		t.Errorf("report: chosen %s, %d voters, re-added %v, dropped %v, lost revisions %q; want %s, 3, two nodes, %v, an account",
			rep.Chosen, rep.Voters, rep.Readded, dropped, rep.LostRevisions, survivor, lost)
	}

	// The thawed old member is gone: wiped by its agent, or a new member
	// since; the cluster never lists its old id.
	proctest.Eventually(t, 3*time.Minute, func() error {
		st, err := c.consensusOf(frozen).Status(ctx, &consensusv1.StatusRequest{})
		if err != nil {
			return err
		}
		if st.MemberId == frozenSt.MemberId {
			return fmt.Errorf("%s still holds old member %x (%s)", frozen, st.MemberId, st.State)
		}
		return nil
	})
	for _, m := range c.consensusStatus().Members {
		if m.MemberId == frozenSt.MemberId {
			t.Errorf("the cluster lists the old member %x of %s again", m.MemberId, frozen)
		}
	}

	// Every acknowledged write is there, and the cluster agrees.
	c.eventuallyAgree()
	after := c.etcdAsCurator(c.voterClientURLs()...)
	if missing := missingWrites(ctx, t, after, "/e2e/recovery/a/", acked); missing > 0 {
		t.Errorf("%d of %d acknowledged writes are missing after the recovery", missing, len(acked))
	}
	recovered := slices.ContainsFunc(auditEvents(t, c), func(ev *auditv1.Event) bool {
		return ev.Action == auditv1.AuditAction_AUDIT_ACTION_CLUSTER_RECOVER && ev.NodeId == c.ids[survivor]
	})
	if !recovered {
		t.Error("no CLUSTER_RECOVER event in the audit log")
	}

	// Worse: every voter's etcd data is lost (their consensus identities
	// stay). A snapshot the curators took is restored on one of them;
	// what was written after it is gone, and the report says so.
	t.Run("from a snapshot, every voter's data lost", func(t *testing.T) {
		before := writeBatch(ctx, after, "/e2e/recovery/b/", 50)
		snap, err := c.mgmt().TakeSnapshot(ctx, &curatorv1.TakeSnapshotRequest{Reason: "e2e: before every voter's data is lost"})
		if err != nil {
			t.Fatal(err)
		}
		later := writeBatch(ctx, after, "/e2e/recovery/c/", 20)
		var voters []string
		for id := range c.voters() {
			voters = append(voters, c.names[id])
		}
		slices.Sort(voters)
		lostAt := time.Now()
		for _, name := range voters {
			dir := filepath.Join(c.state, "data", name, "consensus")
			for _, p := range []string{"etcd", "state.json"} {
				if err := os.RemoveAll(filepath.Join(dir, p)); err != nil {
					t.Fatal(err)
				}
			}
			if err := syscall.Kill(c.pid(name+"-consensus"), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		target := voters[0]
		file := filepath.Join(c.state, "snapshots", snap.GetSnapshot().GetName()+".db")
		t.Logf("wiped the etcd data of %v; restoring %s (revision %d) on %s", voters, snap.GetSnapshot().GetName(), snap.GetSnapshot().GetRevision(), target)
		out, code := c.recoverCmd("--snapshot", file, "--confirm", target, "--reason", "e2e: every voter lost", "--wait", "5m")
		t.Logf("curia-local recover:\n%s", out)
		if code != 0 {
			t.Fatalf("curia-local recover --snapshot: exit %d", code)
		}
		t.Logf("every voter's data gone → 3 healthy voters from the snapshot: %v", time.Since(lostAt).Round(100*time.Millisecond))
		rep := readReport(t, c, 2)
		if rep.Chosen != target || rep.Voters != 3 || rep.Consensus.Source != "snapshot "+snap.GetSnapshot().GetName() ||
			!slices.ContainsFunc(rep.LostRevisions, func(l string) bool { return strings.Contains(l, "every write after it is lost") }) {
			t.Errorf("report: chosen %s, %d voters, source %q, lost revisions %q; want %s, 3, the snapshot, every write after it lost",
				rep.Chosen, rep.Voters, rep.Consensus.Source, rep.LostRevisions, target)
		}
		c.eventuallyAgree()
		restored := c.etcdAsCurator(c.voterClientURLs()...)
		for prefix, want := range map[string]map[string]string{"/e2e/recovery/a/": acked, "/e2e/recovery/b/": before} {
			if missing := missingWrites(ctx, t, restored, prefix, want); missing > 0 {
				t.Errorf("%d of %d writes under %s (before the snapshot) are missing", missing, len(want), prefix)
			}
		}
		if missing := missingWrites(ctx, t, restored, "/e2e/recovery/c/", later); missing != len(later) {
			t.Errorf("%d of %d writes after the snapshot are there: the cluster is not the snapshot's", len(later)-missing, len(later))
		}
	})
}

// voterClientURLs are the etcd client URLs of the voters.
func (c *cluster) voterClientURLs() []string {
	var urls []string
	for id := range c.voters() {
		urls = append(urls, "https://"+host(nodeIndex(c.names[id]))+":2379")
	}
	return urls
}

// writeBatch writes n keys under prefix and returns those acknowledged.
func writeBatch(ctx context.Context, cli *clientv3.Client, prefix string, n int) map[string]string {
	acked := map[string]string{}
	for i := range n {
		k, v := fmt.Sprintf("%s%03d", prefix, i), fmt.Sprint(time.Now().UnixNano())
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := cli.Put(wctx, k, v); err == nil {
			acked[k] = v
		}
		cancel()
	}
	return acked
}

// missingWrites counts the writes of want not found under prefix.
func missingWrites(ctx context.Context, t *testing.T, cli *clientv3.Client, prefix string, want map[string]string) int {
	t.Helper()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range resp.Kvs {
		got[string(kv.Key)] = string(kv.Value)
	}
	missing := 0
	for k, v := range want {
		if got[k] != v {
			missing++
		}
	}
	return missing
}

// recoveryReport is what the test reads of curia-local's report.
type recoveryReport struct {
	Chosen        string   `json:"chosen"`
	Readded       []string `json:"readded"`
	Voters        int      `json:"voters"`
	VotersAfter   string   `json:"voters_after"`
	LostRevisions []string `json:"lost_revisions"`
	Consensus     struct {
		Source         string `json:"source"`
		DroppedMembers []struct {
			NodeID string `json:"nodeId"`
		} `json:"droppedMembers"`
	} `json:"consensus"`
}

// readReport reads the newest of the want reports in the state directory.
func readReport(t *testing.T, c *cluster, want int) recoveryReport {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(c.state, "recovery-*.json"))
	slices.Sort(files)
	if len(files) != want {
		t.Fatalf("recovery reports %v, want %d", files, want)
	}
	var rep recoveryReport
	b, err := os.ReadFile(files[len(files)-1])
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}
