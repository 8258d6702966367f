package reconciler_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/fence"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	ct "curia.dev/services/consensus/consensustest"
	cut "curia.dev/services/curator/curatortest"
)

// concurrencyFloor is the voter floor the automated actors plan with.
const concurrencyFloor = 2

// TestConcurrentActors: in every round, the curator (through
// UpdateNodeRoles), a reconciler holding the lease, a second reconciler
// with the same, stolen fence and a deposed reconciler with a released
// lease each plan one membership change from their own fresh member list
// and send it, at about the same time, through a consensus service of
// their own choosing. Nodes are killed and restarted on the way (a voter
// only while the other voters keep a quorum). After every round: quorum
// holds, the voter floor (once reached) holds, no change is left pending; the deposed actor never gets anything accepted;
// every applied change has exactly one audited intent. At the end the real
// reconciler aligns roles with membership. CURIA_SEED and CURIA_ROUNDS
// change the seed (1) and the number of rounds (100; 20 with -short).
func TestConcurrentActors(t *testing.T) {
	seed, rounds := uint64(1), 100
	if testing.Short() {
		rounds = 20
	}
	if v, err := strconv.ParseUint(os.Getenv("CURIA_SEED"), 10, 64); err == nil {
		seed = v
	}
	if v, err := strconv.Atoi(os.Getenv("CURIA_ROUNDS")); err == nil {
		rounds = v
	}
	t.Logf("seed %d, %d rounds", seed, rounds)
	rng := rand.New(rand.NewPCG(seed, seed))

	c := cut.New(t, 1)
	ctx := ctxT(t)
	pool := []*ct.Node{c.Voters[0]}
	for range 3 {
		a, n := c.NewConsensusAgent()
		a.Enrol(ctx)
		if _, err := a.Curator(c.Running()).UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: cut.VoterStatus(n)}); err != nil {
			t.Fatal(err)
		}
		pool = append(pool, n)
	}
	leases := curatorv1.NewLeasesClient(c.Conn(c.Leader(), pki.Principal{Kind: pki.KindReconciler}))
	acquire := func(holder string) *curatorv1.Lease {
		resp, err := leases.Acquire(ctx, &curatorv1.AcquireRequest{Name: "reconciler", Holder: holder, TtlSeconds: 60})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Lease
	}
	deposed := acquire("deposed/1")
	if _, err := leases.Release(ctx, &curatorv1.ReleaseRequest{Lease: deposed}); err != nil {
		t.Fatal(err)
	}
	lease := acquire("reconciler/test")

	// Every change stays in flight a while after its fenced start, so that
	// other actors read and act inside that window.
	for _, n := range pool {
		n.Delay("after-commit", 25*time.Millisecond)
	}
	w := &world{t: t, c: c, pool: pool}
	actors := []*actor{
		{name: "curator"},
		{name: "reconciler", fence: fence.FromProto(lease.Fence)},
		{name: "stolen", fence: fence.FromProto(lease.Fence)},
		{name: "deposed", fence: fence.FromProto(deposed.Fence)},
	}
	var down *ct.Node
	reached := false
	for round := range rounds {
		// Faults: a node's process down for a stretch of rounds.
		switch {
		case down == nil && round%25 == 10:
			// A fault the cluster can tolerate: a voter only while the
			// others keep a quorum (two voters survive no failure, and
			// no membership protocol can help that).
			down = w.victim(rng)
			if down != nil {
				down.Kill()
			}
		case down != nil && round%25 == 20:
			down.Start()
			down = nil
		}
		// Each actor reads its member list and sends its call at once,
		// the actors a few milliseconds apart: some read while another's
		// change is in flight.
		var wg sync.WaitGroup
		for _, a := range actors {
			own := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
			jitter := time.Duration(own.IntN(20)) * time.Millisecond
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(jitter) // a schedule, not a wait for a condition
				a.record(w.plan(a, own)())
			}()
		}
		wg.Wait()

		members := w.settle(round)
		voters := 0
		for _, m := range members.Members {
			if !m.Learner {
				voters++
			}
		}
		reached = reached || voters >= concurrencyFloor
		if reached && voters < concurrencyFloor {
			t.Fatalf("round %d: %d voters, below the floor of %d: %v", round, voters, concurrencyFloor, members.Members)
		}
		w.quorum(round, members)
		w.duty(members, lease)
	}
	if down != nil {
		down.Start()
	}
	for _, a := range actors {
		t.Logf("%s: %d accepted, %d refused, %d planned nothing", a.name, a.accepted, a.refused, a.idle)
	}
	if actors[3].accepted != 0 {
		t.Fatalf("the deposed reconciler got %d calls accepted", actors[3].accepted)
	}
	if actors[1].accepted+actors[2].accepted == 0 {
		t.Fatal("no reconciler-side change was accepted: the rounds tested nothing")
	}
	w.auditExplained()

	// The real reconciler aligns roles with membership.
	if _, err := leases.Release(ctx, &curatorv1.ReleaseRequest{Lease: lease}); err != nil {
		t.Fatal(err)
	}
	startReconciler(t, c, "reconciler-0")
	proctest.Eventually(t, 2*time.Minute, func() error {
		members := w.list()
		w.duty(members, nil)
		st, err := stateOf(t, c, members)
		if err != nil {
			return err
		}
		for id, s := range st {
			if s.cm != s.member || (s.kc && !s.cm) {
				return fmt.Errorf("node %s: role %v, etcd member %v (state %v)", id, s.cm, s.member, st)
			}
		}
		return nil
	})
}

// actor is one party changing membership.
type actor struct {
	name  string
	fence fence.Fence // the reconciler-side actors' lease fence

	mu                      sync.Mutex
	accepted, refused, idle int
}

// errIdle: the actor found nothing to do this round.
var errIdle = fmt.Errorf("nothing to do")

func (a *actor) record(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case err == nil:
		a.accepted++
	case errors.Is(err, errIdle):
		a.idle++
	default:
		a.refused++
	}
}

// world is the cluster the actors share.
type world struct {
	t    *testing.T
	c    *cut.Cluster
	pool []*ct.Node
}

// victim picks a node other than the bootstrap node whose loss the voters
// tolerate, or nil when there is none.
func (w *world) victim(rng *rand.Rand) *ct.Node {
	voters := map[string]bool{}
	for _, m := range w.list().Members {
		if !m.Learner {
			voters[m.NodeId] = true
		}
	}
	var ok []*ct.Node
	for _, n := range w.pool[1:] {
		if !voters[n.ID] || len(voters)-1 >= len(voters)/2+1 {
			ok = append(ok, n)
		}
	}
	if len(ok) == 0 {
		return nil
	}
	return ok[rng.IntN(len(ok))]
}

// running is a node whose consensus API and member run, picked at random.
func (w *world) pick(rng *rand.Rand) *ct.Node {
	for range 3 * len(w.pool) {
		n := w.pool[rng.IntN(len(w.pool))]
		if n.Running() {
			return n
		}
	}
	return w.pool[0]
}

func (w *world) list() *consensusv1.ListMembersResponse {
	w.t.Helper()
	var out *consensusv1.ListMembersResponse
	proctest.Eventually(w.t, time.Minute, func() error {
		var errs []error
		for _, n := range w.pool {
			if !n.Running() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := n.Curator().ListMembers(ctx, &consensusv1.ListMembersRequest{})
			cancel()
			if err == nil {
				out = resp
				return nil
			}
			errs = append(errs, err)
		}
		return fmt.Errorf("quorum lost? no consensus service lists members: %v", errs)
	})
	return out
}

// plan reads a member list through one consensus service and returns the
// actor's call, to be sent through another one.
func (w *world) plan(a *actor, rng *rand.Rand) func() error {
	via, to := w.pick(rng), w.pick(rng)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	members, err := via.Curator().ListMembers(ctx, &consensusv1.ListMembersRequest{})
	cancel()
	if err != nil || members.Pending != nil {
		return func() error { return errIdle }
	}
	byNode := map[string]*consensusv1.Member{}
	voters := 0
	for _, m := range members.Members {
		byNode[m.NodeId] = m
		if !m.Learner {
			voters++
		}
	}
	var outside, learners, voterNodes []string
	for i, n := range w.pool {
		switch m := byNode[n.ID]; {
		case m == nil:
			outside = append(outside, n.ID)
		case m.Learner:
			learners = append(learners, n.ID)
		case i > 0:
			// Not the bootstrap node's: the curator reaches etcd only
			// through it (its --etcd), and would be cut off.
			voterNodes = append(voterNodes, n.ID)
		}
	}
	r := rng.Float64()
	target := func(ids []string) string { return ids[rng.IntN(len(ids))] }
	f := a.fence.WithEpoch(members.MembershipEpoch).Proto()
	cl := to.Consensus(pki.Principal{Kind: pki.KindReconciler})
	call := func(f func(context.Context) error) func() error {
		return func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := f(ctx)
			if code := status.Code(err); code == codes.Internal || code == codes.Unknown {
				w.t.Errorf("%s: %v", a.name, err)
			}
			return err
		}
	}
	if a.name == "curator" {
		// An operator adding control-plane nodes (adds never cross the
		// floor; automation's removals are what the floor bounds).
		if len(outside) == 0 || len(learners) > 0 {
			return func() error { return errIdle }
		}
		id := target(outside)
		m := curatorv1.NewManagementClient(w.c.Conn(w.c.Running(), cut.Admin))
		return call(func(ctx context.Context) error {
			_, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: id, ConsensusMember: new(true), Reason: "concurrency test"})
			return err
		})
	}
	switch {
	case len(learners) > 0 && byNode[learners[0]].CaughtUp && r < 0.5:
		id := byNode[learners[0]].Id
		return call(func(ctx context.Context) error {
			_, err := cl.PromoteMember(ctx, &consensusv1.PromoteMemberRequest{MemberId: id, Fence: f})
			return err
		})
	case len(voterNodes) > 0 && voters-1 >= concurrencyFloor && r < 0.6:
		id := target(voterNodes)
		return call(func(ctx context.Context) error {
			_, err := cl.RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: id}, Fence: f})
			return err
		})
	case len(learners) > 0 && r < 0.8:
		id := target(learners)
		return call(func(ctx context.Context) error {
			_, err := cl.RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: id}, Fence: f})
			return err
		})
	case len(outside) > 0 && len(learners) == 0:
		n := w.node(target(outside))
		return call(func(ctx context.Context) error {
			_, err := cl.AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: n.ID, PeerUrl: n.PeerURL, Fence: f})
			return err
		})
	}
	return func() error { return errIdle }
}

func (w *world) node(id string) *ct.Node {
	for _, n := range w.pool {
		if n.ID == id {
			return n
		}
	}
	w.t.Fatalf("no node %s", id)
	return nil
}

// settle waits until no change is pending (a dead recorder's is resolved
// by another process) and returns the member list.
func (w *world) settle(round int) *consensusv1.ListMembersResponse {
	w.t.Helper()
	var members *consensusv1.ListMembersResponse
	proctest.Eventually(w.t, time.Minute, func() error {
		members = w.list()
		if members.Pending != nil {
			return fmt.Errorf("round %d: change still pending: %v", round, members.Pending)
		}
		return nil
	})
	return members
}

// quorum checks that a linearizable write goes through the voters.
func (w *world) quorum(round int, members *consensusv1.ListMembersResponse) {
	w.t.Helper()
	var eps []string
	for _, m := range members.Members {
		if !m.Learner {
			eps = append(eps, m.ClientUrls...)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := w.c.Etcd(eps...).Put(ctx, "/test/quorum", strconv.Itoa(round)); err != nil {
		w.t.Fatalf("round %d: quorum lost: %v (members %v)", round, err, members.Members)
	}
}

// duty is what the nodes' agents would do: start a learner's member, and
// wipe the data of a member that was removed.
func (w *world) duty(members *consensusv1.ListMembersResponse, lease *curatorv1.Lease) {
	byNode := map[string]*consensusv1.Member{}
	for _, m := range members.Members {
		byNode[m.NodeId] = m
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range w.pool {
		if !n.Running() {
			continue
		}
		st, err := n.Self().Status(ctx, &consensusv1.StatusRequest{})
		if err != nil {
			continue
		}
		m := byNode[n.ID]
		idle := st.State == consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE
		// A call that fails is made again next round, as an agent would.
		switch {
		case m == nil && !idle:
			_, _ = n.Self().Leave(ctx, &consensusv1.LeaveRequest{})
		case m != nil && m.Learner && !m.Started && idle:
			join := w.joinParameters(ctx, n, lease, members.MembershipEpoch)
			if join != nil {
				_, _ = n.Self().Start(ctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: join}})
			}
		}
	}
}

// joinParameters of a node that is a member: from its role, else from an
// idempotent AddNode under the test's lease.
func (w *world) joinParameters(ctx context.Context, n *ct.Node, lease *curatorv1.Lease, epoch int64) *consensusv1.JoinParameters {
	st, err := stateOf(w.t, w.c, w.list())
	if err == nil && st[n.ID].cm {
		if join := node(w.t, w.c, n.ID).Roles.GetConsensusMember().GetJoin(); join != nil {
			return join
		}
	}
	if lease == nil {
		return nil
	}
	resp, err := w.pool[0].Consensus(pki.Principal{Kind: pki.KindReconciler}).AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: n.ID, PeerUrl: n.PeerURL, Fence: fence.FromProto(lease.Fence).WithEpoch(epoch).Proto()})
	if err != nil {
		return nil
	}
	return resp.Join
}

// auditExplained: every finished change has exactly one intent, and no
// change finished twice.
func (w *world) auditExplained() {
	w.t.Helper()
	intents, outcomes := map[string]int{}, map[string]int{}
	for _, ev := range audit(w.t, w.c) {
		if ev.ChangeId == "" {
			continue
		}
		if ev.Outcome == auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED {
			intents[ev.ChangeId]++
		} else {
			outcomes[ev.ChangeId]++
		}
	}
	applied := 0
	for id, n := range outcomes {
		if n != 1 || intents[id] != 1 {
			w.t.Errorf("change %s: %d intents, %d outcomes; want one of each", id, intents[id], n)
		}
		applied++
	}
	for id := range intents {
		if outcomes[id] == 0 {
			w.t.Errorf("change %s: an intent without an outcome", id)
		}
	}
	w.t.Logf("%d membership changes started and finished", applied)
}
