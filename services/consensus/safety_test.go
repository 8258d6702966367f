package consensus_test

// Deterministic tests of the membership protocol's safety: each stops a
// consensus process at a failpoint to land another actor's call in the
// window the mechanism closes, and fails if the mechanism is switched off.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	fencev1 "curia.dev/gen/curia/fence/v1"
	"curia.dev/platform/fence"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpcerr"
	ct "curia.dev/services/consensus/consensustest"
)

// auditLog reads every audit event straight from etcd.
func auditLog(t *testing.T, cli *clientv3.Client) []*auditv1.Event {
	t.Helper()
	resp, err := cli.Get(context.Background(), keys.AuditPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var out []*auditv1.Event
	for _, kv := range resp.Kvs {
		ev := &auditv1.Event{}
		if err := proto.Unmarshal(kv.Value, ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

// outcomes counts the finished membership changes per action and outcome.
func outcomes(events []*auditv1.Event) map[string]int {
	out := map[string]int{}
	for _, ev := range events {
		if ev.Outcome != auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED {
			out[ev.Action.String()+" "+ev.Outcome.String()]++
		}
	}
	return out
}

func memberIDs(resp *consensusv1.ListMembersResponse) map[string]bool {
	out := map[string]bool{}
	for _, m := range resp.Members {
		out[m.NodeId] = true
	}
	return out
}

// removeAsync removes node's member through via in the background; the
// result arrives on the channel.
func removeAsync(via *ct.Node, node string, f *fencev1.Fence) chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := via.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: node}, Fence: f})
		done <- err
	}()
	return done
}

func result(t *testing.T, done chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("the call did not return within a minute")
		return nil
	}
}

// TestOneChangeAtATime: voters P, X, Y, D with D down. P removes X and is
// held after its fenced start, before the etcd call. A second actor reads
// the member list in that window (the new epoch, X still listed) and asks
// another consensus process to remove Y: its quorum guard passes (3 voters
// left, 2 healthy, quorum 2), so only the cluster-wide pending change stops
// it; together the two removals would leave {P, D} without quorum.
func TestOneChangeAtATime(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	nodes, leader := c.Voters(4)
	p, x, y, d := nodes[0], nodes[1], nodes[2], nodes[3]
	d.Kill()

	release := p.Hold("after-commit")
	first := removeAsync(p, x.ID, p.Fenced(leader.Fence))
	p.Reached("after-commit")

	window := y.Members()
	if window.Pending == nil || window.Pending.Operation != consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_REMOVE || window.Pending.NodeId != x.ID {
		t.Fatalf("ListMembers in the window reports pending %v, want the removal of %s", window.Pending, x.ID)
	}
	if !memberIDs(window)[x.ID] {
		t.Fatalf("the window's member list already lacks %s: %v", x.ID, window.Members)
	}
	_, err := x.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{
		Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: y.ID},
		Fence:  leader.Fence.WithEpoch(window.MembershipEpoch).Proto(),
	})
	wantKind(t, err, rpcerr.ChangePending, "", "in flight")
	if d, ok := rpcerr.RetryDelay(err); !ok || d <= 0 {
		t.Fatalf("a change pending says no retry delay: %v", err)
	}

	release()
	if err := result(t, first); err != nil {
		t.Fatalf("the held removal: %v", err)
	}
	after := p.Members()
	if got := memberIDs(after); len(got) != 3 || got[x.ID] || !got[y.ID] {
		t.Fatalf("members after the removal of %s: %v", x.ID, after.Members)
	}
	if after.MembershipEpoch <= window.MembershipEpoch || after.Pending != nil {
		t.Fatalf("after the change: epoch %d (window %d), pending %v: want a new epoch and nothing pending", after.MembershipEpoch, window.MembershipEpoch, after.Pending)
	}
	// Quorum holds: a linearizable write goes through.
	if _, err := c.Etcd(p.ClientURL).Put(ctx, "/test/quorum", "ok"); err != nil {
		t.Fatalf("quorum lost: %v", err)
	}
	got := outcomes(auditLog(t, c.Etcd(p.ClientURL)))
	if got["AUDIT_ACTION_MEMBER_REMOVE CHANGE_OUTCOME_APPLIED"] != 1 || got["AUDIT_ACTION_MEMBER_REMOVE CHANGE_OUTCOME_NOT_APPLIED"] != 0 {
		t.Fatalf("audited removals %v, want exactly one applied", got)
	}
}

// TestPausedChangeResolvedNeverApplied: a consensus process stops for good
// after the fenced start of a removal (as a SIGSTOP or a partition there
// would): after the commit was applied but before its answer arrived
// ("committed"), or after the answer, before the etcd call
// ("after-commit"). Another process resolves the pending change from the
// member list once it has watched it for twice the call's deadline; when
// the first one wakes up, it makes no etcd call (its deadline counts from
// before it sent the commit, and the record is gone): the member stays.
// Without the recorder's deadline (no-recorder-deadline), the process held
// at "committed" starts its deadline on waking and removes the member
// after it was resolved as not applied.
func TestPausedChangeResolvedNeverApplied(t *testing.T) {
	for _, point := range []string{"committed", "after-commit"} {
		t.Run(point, func(t *testing.T) {
			c := ct.NewCluster(t)
			nodes, leader := c.Voters(3)
			a, b, victim := nodes[0], nodes[1], nodes[2]
			cli := c.Etcd(b.ClientURL)

			release := a.Hold(point)
			held := removeAsync(a, victim.ID, a.Fenced(leader.Fence))
			a.Reached(point)
			started := time.Now()

			// B resolves it on its own, from the member list: not applied.
			ct.Eventually(t, time.Minute, func() error {
				if p := b.Members().Pending; p != nil {
					return fmt.Errorf("still pending: %v", p)
				}
				return nil
			})
			t.Logf("resolved %v after the fenced start", time.Since(started).Round(100*time.Millisecond))
			var resolved *auditv1.Event
			for _, ev := range auditLog(t, cli) {
				if ev.Outcome != auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED {
					resolved = ev
				}
			}
			if resolved == nil || resolved.Outcome != auditv1.ChangeOutcome_CHANGE_OUTCOME_NOT_APPLIED || !strings.Contains(resolved.Reason, "resolved by") {
				t.Fatalf("outcome %v, want NOT_APPLIED resolved from the member list", resolved)
			}

			// A wakes up: no etcd call, an error to its caller.
			release()
			if err := result(t, held); err == nil {
				t.Fatal("the paused removal reported success")
			}
			if got := memberIDs(b.Members()); !got[victim.ID] || len(got) != 3 {
				t.Fatalf("members after the paused removal woke up: %v: the change resolved as not applied was applied", got)
			}
			if got := outcomes(auditLog(t, cli)); got["AUDIT_ACTION_MEMBER_REMOVE CHANGE_OUTCOME_APPLIED"] != 0 {
				t.Fatalf("audited outcomes %v: the woken removal was applied", got)
			}
		})
	}
}

// TestProofOfAbsence: a removal justified by the node not existing carries
// the node id, and consensus proves the absence in its fenced transaction:
// a member whose node exists (a stale view of the registry said otherwise)
// stays.
func TestProofOfAbsence(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	n1 := c.NewNode()
	c.Bootstrap(n1)
	cli := c.Etcd(n1.ClientURL)
	leader := c.Campaign(cli)
	lease := leader.GrantLease(t, "reconciler", 60)
	reconciler := n1.Consensus(pki.Principal{Kind: pki.KindReconciler})

	node := ct.NewNodeID(t)
	added, err := n1.Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: node, PeerUrl: "https://127.0.0.1:1", Fence: n1.Fenced(leader.Fence)})
	if err != nil {
		t.Fatal(err)
	}
	remove := func(absent string) error {
		_, err := reconciler.RemoveMember(ctx, &consensusv1.RemoveMemberRequest{
			Target:       &consensusv1.RemoveMemberRequest_MemberId{MemberId: added.Join.MemberId},
			Fence:        n1.Fenced(lease),
			AbsentNodeId: absent,
			Reason:       "reconciler: its node is gone",
		})
		return err
	}

	// The node exists (any record under its key).
	if _, err := cli.Put(ctx, keys.Node(node), "a node"); err != nil {
		t.Fatal(err)
	}
	wantKind(t, remove(node), rpcerr.FenceStale, fence.PartCondition, "node "+node+" exists")
	wantCode(t, remove(ct.NewNodeID(t)), codes.InvalidArgument, "not that node's")
	if !memberIDs(n1.Members())[node] {
		t.Fatal("the member of an existing node was removed")
	}

	// Gone for real: the proof holds.
	if _, err := cli.Delete(ctx, keys.Node(node)); err != nil {
		t.Fatal(err)
	}
	if err := remove(node); err != nil {
		t.Fatal(err)
	}
	if memberIDs(n1.Members())[node] {
		t.Fatal("the member of a deleted node stayed")
	}
	// The audit log says why, in the caller's words and with the proof.
	want := "remove member: reconciler: its node is gone (proven: node " + node + " does not exist)"
	var reasons []string
	for _, ev := range auditLog(t, cli) {
		if ev.Action == auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE && ev.Outcome == auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED {
			reasons = append(reasons, ev.Reason)
		}
	}
	if !slices.Contains(reasons, want) {
		t.Fatalf("removal intents say %q, want %q among them", reasons, want)
	}
}

// TestFencePairing: each condition of a fence holding is not enough; the
// leader key must be the current leader's, and a lease must have been
// granted by that leader key in its term. Automated callers must send the
// epoch of the member list they planned from.
func TestFencePairing(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	n1 := c.NewNode()
	c.Bootstrap(n1)
	cli := c.Etcd(n1.ClientURL)
	old := c.Campaign(cli)
	oldLease := old.GrantLease(t, "reconciler", 60)
	reconciler := n1.Consensus(pki.Principal{Kind: pki.KindReconciler})
	add := func(cl consensusv1.ConsensusClient, f *fencev1.Fence) error {
		_, err := cl.AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: ct.NewNodeID(t), PeerUrl: "https://127.0.0.1:1", Fence: f})
		return err
	}

	// A follower's campaign key exists, under the election prefix.
	candidate := keys.LeaderElection + "candidate"
	put, err := cli.Put(ctx, candidate, "follower")
	if err != nil {
		t.Fatal(err)
	}
	wantKind(t, add(n1.Curator(), n1.Fenced(fence.Fence{Conditions: []fence.Condition{{Key: candidate, CreateRevision: put.Header.Revision}}})), rpcerr.FenceStale, fence.PartLeader, "not the current leader's key")
	if _, err := cli.Delete(ctx, candidate); err != nil {
		t.Fatal(err)
	}

	wantCode(t, add(reconciler, oldLease.Proto()), codes.InvalidArgument, "membership_epoch is required")

	// A new term; the old term's lease record lives on until it expires.
	old.Resign()
	cur := c.Campaign(cli)
	forged := fence.Fence{Conditions: []fence.Condition{cur.Fence.Conditions[0], oldLease.Conditions[1]}}
	wantKind(t, add(reconciler, n1.Fenced(forged)), rpcerr.FenceStale, fence.PartLease, "was granted by leader key "+old.Fence.Conditions[0].Key)

	if got := len(n1.Members().Members); got != 1 {
		t.Fatalf("refused calls changed membership: %d members", got)
	}
	if err := add(reconciler, n1.Fenced(cur.GrantLease(t, "reconciler", 60))); err != nil {
		t.Fatalf("a lease of the current term: %v", err)
	}
}

// TestLeadershipMovesAfterCommit: removing the etcd leader moves leadership
// away only once the change's fenced start succeeded; a removal refused
// there leaves the leader alone.
func TestLeadershipMovesAfterCommit(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	nodes, leader := c.Voters(3)
	var lead *ct.Node
	var others []*ct.Node
	ct.Eventually(t, 10*time.Second, func() error {
		lead, others = nil, nil
		for _, n := range nodes {
			if n.Status().Leader {
				lead = n
			} else {
				others = append(others, n)
			}
		}
		if lead == nil {
			return fmt.Errorf("no etcd leader")
		}
		return nil
	})
	via, bystander := others[0], others[1]

	release := via.Hold("before-commit")
	held := removeAsync(via, lead.ID, via.Fenced(leader.Fence))
	via.Reached("before-commit")
	// Membership moves on meanwhile: the held removal's epoch is stale.
	if _, err := bystander.Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: ct.NewNodeID(t), PeerUrl: "https://127.0.0.1:1", Fence: bystander.Fenced(leader.Fence)}); err != nil {
		t.Fatal(err)
	}
	release()
	err := result(t, held)
	wantKind(t, err, rpcerr.FenceStale, fence.PartEpoch, "membership epoch")
	if !lead.Status().Leader {
		t.Fatalf("leadership moved away from %s for a removal that was refused", lead.ID)
	}
}

// TestEpochEnsured: a cluster whose epoch key was lost gets it back from
// its consensus processes (every automated change needs an epoch).
func TestEpochEnsured(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	n1 := c.NewNode()
	c.Bootstrap(n1)
	cli := c.Etcd(n1.ClientURL)
	if _, err := cli.Delete(ctx, keys.MembershipEpoch); err != nil {
		t.Fatal(err)
	}
	// The epoch is ensured when a member starts: restart the process.
	n1.Kill()
	n1.Start()
	ct.Eventually(t, 30*time.Second, func() error {
		if e := n1.Members().MembershipEpoch; e == 0 {
			return fmt.Errorf("epoch still 0")
		}
		return nil
	})
}

// TestUnreadablePendingCleared: a membership/pending record that cannot be
// read (not a change record: a bad write by hand, a damaged value) blocks
// every change as any pending record does, and says so; once no recorder
// could still be making a call (twice --max-member-call-timeout) a
// consensus process clears it, audited with outcome UNKNOWN and the live
// member list, and changes go on. Before, it blocked every membership
// change for good: nobody could read it to resolve it.
func TestUnreadablePendingCleared(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	nodes, leader := c.Voters(2)
	a, b := nodes[0], nodes[1]
	cli := c.Etcd(a.ClientURL)
	if _, err := cli.Put(ctx, keys.MembershipPending, "\xff\xff not a pending change record"); err != nil {
		t.Fatal(err)
	}
	before := a.Members()
	remove := func() error {
		_, err := a.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: b.ID}, Fence: a.Fenced(leader.Fence)})
		return err
	}
	err := remove()
	wantKind(t, err, rpcerr.ChangePending, "", "unreadable pending membership record")
	if d, ok := rpcerr.RetryDelay(err); !ok || d <= 0 {
		t.Fatalf("an unreadable pending record says no retry delay: %v", err)
	}
	if got := memberIDs(a.Members()); len(got) != 2 {
		t.Fatalf("members after the refused removal: %v", got)
	}

	ct.Eventually(t, time.Minute, func() error {
		if p := a.Members().Pending; p != nil {
			return fmt.Errorf("still pending: %v", p)
		}
		return nil
	})
	var cleared []*auditv1.Event
	for _, ev := range auditLog(t, cli) {
		if ev.Action == auditv1.AuditAction_AUDIT_ACTION_MEMBER_CHANGE_UNREADABLE {
			cleared = append(cleared, ev)
		}
	}
	if len(cleared) != 1 || cleared[0].Outcome != auditv1.ChangeOutcome_CHANGE_OUTCOME_UNKNOWN ||
		!strings.Contains(cleared[0].Reason, "live member list stands") || !strings.Contains(cleared[0].Reason, a.ID) || !strings.Contains(cleared[0].Reason, b.ID) {
		t.Fatalf("audited clearings %v: want one, outcome UNKNOWN, naming the member list", cleared)
	}
	if after := a.Members(); after.MembershipEpoch <= before.MembershipEpoch {
		t.Fatalf("epoch %d after the clearing, %d before: callers must plan from the member list again", after.MembershipEpoch, before.MembershipEpoch)
	}

	// Changes go on.
	if err := ct.RetryUnavailable(t, remove); err != nil {
		t.Fatalf("the removal after the clearing: %v", err)
	}
	if got := memberIDs(a.Members()); len(got) != 1 || !got[a.ID] {
		t.Fatalf("members after the removal: %v", got)
	}
}

// TestUnstartedOnlyKeepsAStartedLearner: the reconciler removes a learner
// that has not started in time, but starting moves no membership epoch, so
// its fence cannot tell a learner that started after the planner looked.
// With unstarted_only, consensus looks again: right before etcd's call (the
// removal is held after its fenced start while the learner starts) and
// before the fenced start (a second try). Both times the learner stays.
// Without the checks (no-unstarted-check) the started learner is removed.
func TestUnstartedOnlyKeepsAStartedLearner(t *testing.T) {
	c := ct.NewCluster(t)
	// Time to start the learner while the removal is held, within the
	// call's deadline.
	c.Flags = []string{"--member-call-timeout", "40s", "--max-member-call-timeout", "40s"}
	ctx := ctxT(t)
	nodes, leader := c.Voters(1)
	a := nodes[0]
	n := c.NewNode()
	var added *consensusv1.AddNodeResponse
	ct.Eventually(t, time.Minute, func() (err error) {
		added, err = a.Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: n.ID, PeerUrl: n.PeerURL, Fence: a.Fenced(leader.Fence)})
		if err != nil && !rpcerr.Retryable(err) {
			t.Fatal(err)
		}
		return err
	})
	id := added.Join.MemberId
	started := func() bool {
		for _, m := range a.Members().Members {
			if m.Id == id {
				return m.Started
			}
		}
		t.Fatalf("learner %x is gone: %v", id, a.Members().Members)
		return false
	}
	if started() {
		t.Fatal("the learner started before its node did")
	}
	remove := func() (*consensusv1.RemoveMemberResponse, error) {
		return a.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{
			Target: &consensusv1.RemoveMemberRequest_MemberId{MemberId: id}, Fence: a.Fenced(leader.Fence),
			UnstartedOnly: true, Reason: "the test: learner unstarted",
		})
	}

	// Held after the fenced start; the learner starts meanwhile.
	release := a.Hold("after-commit")
	held := make(chan error, 1)
	go func() { _, err := remove(); held <- err }()
	a.Reached("after-commit")
	n.InstallMemberCert()
	if _, err := n.Self().Start(ctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: added.Join}}); err != nil {
		t.Fatal(err)
	}
	ct.Eventually(t, time.Minute, func() error {
		if !started() {
			return errors.New("the learner has not published its name yet")
		}
		return nil
	})
	release()
	err := result(t, held)
	wantKind(t, err, rpcerr.FenceStale, "condition", "started as")
	if !started() {
		t.Fatal("the started learner was removed")
	}
	got := outcomes(auditLog(t, c.Etcd(a.ClientURL)))
	if got["AUDIT_ACTION_MEMBER_REMOVE CHANGE_OUTCOME_NOT_APPLIED"] != 1 || got["AUDIT_ACTION_MEMBER_REMOVE CHANGE_OUTCOME_APPLIED"] != 0 {
		t.Fatalf("audited removals %v, want one not applied", got)
	}

	// Asked again: refused before the fenced start, nothing audited.
	before := a.Members().MembershipEpoch
	_, err = remove()
	wantKind(t, err, rpcerr.FenceStale, "condition", "started as")
	if after := a.Members().MembershipEpoch; after != before || !started() {
		t.Fatalf("the second refusal moved the epoch from %d to %d, or removed the learner", before, after)
	}
}
