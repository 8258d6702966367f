package fence

// Integration tests against a real, in-process etcd (DESIGN §4): fences are
// checked at the resource, so they are tested at the resource.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	fencev1 "curia.dev/gen/curia/fence/v1"
	"curia.dev/platform/etcdtest"
	"curia.dev/platform/keys"
)

// testTimeout bounds every test's etcd calls; a healthy run takes well under
// a second per test.
const testTimeout = 20 * time.Second

// startEtcd starts a single-member etcd in-process and returns a client to
// it. Both are closed when the test ends.
func startEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	clientURL := etcdtest.Start(t, "fence-test")
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{clientURL},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// leader is a won curator election: its session, election and fence.
type leader struct {
	session  *concurrency.Session
	election *concurrency.Election
	fence    Fence
}

// newSession opens a session whose lease outlives the test unless the test
// ends it; it is closed (and its lease revoked) at cleanup.
func newSession(t *testing.T, cli *clientv3.Client) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
	if err != nil {
		t.Fatalf("new session: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// campaign wins the election under keys.LeaderElection with a new session.
func campaign(ctx context.Context, t *testing.T, cli *clientv3.Client) *leader {
	t.Helper()
	s := newSession(t, cli)
	e := concurrency.NewElection(s, keys.LeaderElection)
	if err := e.Campaign(ctx, "curator-test"); err != nil {
		t.Fatalf("campaign: %v", err)
	}
	return &leader{session: s, election: e, fence: electionFence(e)}
}

func electionFence(e *concurrency.Election) Fence {
	return Fence{Conditions: []Condition{{Key: e.Key(), CreateRevision: e.Rev()}}}
}

// endSession revokes the session's lease, as a lease expiry would.
func endSession(ctx context.Context, t *testing.T, cli *clientv3.Client, s *concurrency.Session) {
	t.Helper()
	if _, err := cli.Revoke(ctx, s.Lease()); err != nil {
		t.Fatalf("revoke lease: %v", err)
	}
}

// putLease writes a named lease as the curator leader l grants it: a lease
// record naming l's key and term, bound to a new etcd lease. It returns the
// key's create revision and the etcd lease.
func putLease(ctx context.Context, t *testing.T, cli *clientv3.Client, key string, l Condition) (int64, clientv3.LeaseID) {
	t.Helper()
	return putLeaseValue(ctx, t, cli, key, leaseJSON(t, l))
}

func leaseJSON(t *testing.T, l Condition) string {
	t.Helper()
	b, err := json.Marshal(LeaseRecord{Holder: "reconciler-0/abc", Term: l.CreateRevision, LeaderKey: l.Key, TTLSeconds: 60, Granted: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func putLeaseValue(ctx context.Context, t *testing.T, cli *clientv3.Client, key, value string) (int64, clientv3.LeaseID) {
	t.Helper()
	g, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatalf("grant lease: %v", err)
	}
	t.Cleanup(func() { _, _ = cli.Revoke(context.Background(), g.ID) })
	resp, err := cli.Put(ctx, key, value, clientv3.WithLease(g.ID))
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return resp.Header.Revision, g.ID
}

// mustPut writes key and returns the revision it was written at.
func mustPut(ctx context.Context, t *testing.T, cli *clientv3.Client, key, val string) int64 {
	t.Helper()
	resp, err := cli.Put(ctx, key, val)
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return resp.Header.Revision
}

func mustReadEpoch(ctx context.Context, t *testing.T, kv clientv3.KV) int64 {
	t.Helper()
	epoch, err := ReadEpoch(ctx, kv)
	if err != nil {
		t.Fatalf("ReadEpoch: %v", err)
	}
	return epoch
}

// exists reports whether key is in etcd.
func exists(ctx context.Context, t *testing.T, kv clientv3.KV, key string) bool {
	t.Helper()
	resp, err := kv.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return resp.Count > 0
}

// checkApply checks Apply's outcome: success and the marker written when
// wantReason is empty; otherwise a *StaleError matching ErrStale whose reason
// contains wantReason, and the marker not written.
func checkApply(ctx context.Context, t *testing.T, kv clientv3.KV, resp *clientv3.TxnResponse, err error, marker, wantReason string) {
	t.Helper()
	if wantReason == "" {
		if err != nil {
			t.Fatalf("Apply: %v, want success", err)
		}
		if resp == nil || !resp.Succeeded {
			t.Fatalf("Apply returned %+v, want a succeeded txn response", resp)
		}
		if !exists(ctx, t, kv, marker) {
			t.Fatalf("Apply succeeded but %s was not written", marker)
		}
		return
	}
	if err == nil {
		t.Fatalf("Apply succeeded, want a stale fence (%q)", wantReason)
	}
	if resp != nil {
		t.Errorf("Apply returned a response with a stale fence: %+v", resp)
	}
	if !errors.Is(err, ErrStale) {
		t.Errorf("errors.Is(%v, ErrStale) = false", err)
	}
	var se *StaleError
	if !errors.As(err, &se) {
		t.Fatalf("Apply error %T (%v) is not a *StaleError", err, err)
	}
	if !strings.Contains(se.Reason, wantReason) {
		t.Errorf("stale reason %q does not contain %q", se.Reason, wantReason)
	}
	if !strings.HasPrefix(err.Error(), "stale fence: ") {
		t.Errorf("error %q does not start with %q", err, "stale fence: ")
	}
	if exists(ctx, t, kv, marker) {
		t.Errorf("stale Apply wrote %s", marker)
	}
}

func marker(name string) string { return keys.Prefix + "test/" + name }

func TestApplyConditions(t *testing.T) {
	cli := startEtcd(t)
	ctx := testContext(t)

	tests := []struct {
		name string
		// setup returns the fence to apply and the reason Apply must fail
		// with ("" for success).
		setup func(t *testing.T) (Fence, string)
	}{
		{
			name: "intact leader key",
			setup: func(t *testing.T) (Fence, string) {
				return campaign(ctx, t, cli).fence, ""
			},
		},
		{
			name: "leader lease revoked",
			setup: func(t *testing.T) (Fence, string) {
				l := campaign(ctx, t, cli)
				endSession(ctx, t, cli, l.session)
				return l.fence, l.fence.Conditions[0].Key + " no longer exists"
			},
		},
		{
			name: "leader session closed",
			setup: func(t *testing.T) (Fence, string) {
				l := campaign(ctx, t, cli)
				if err := l.session.Close(); err != nil {
					t.Fatalf("close session: %v", err)
				}
				return l.fence, l.fence.Conditions[0].Key + " no longer exists"
			},
		},
		{
			name: "leader resigned",
			setup: func(t *testing.T) (Fence, string) {
				l := campaign(ctx, t, cli)
				if err := l.election.Resign(ctx); err != nil {
					t.Fatalf("resign: %v", err)
				}
				return l.fence, l.fence.Conditions[0].Key + " no longer exists"
			},
		},
		{
			// Same session, so same lease and the same leader key, created
			// again at a later revision: a new term.
			name: "leader key re-created by a new campaign",
			setup: func(t *testing.T) (Fence, string) {
				l := campaign(ctx, t, cli)
				old := l.fence.Conditions[0]
				if err := l.election.Resign(ctx); err != nil {
					t.Fatalf("resign: %v", err)
				}
				if err := l.election.Campaign(ctx, "curator-test"); err != nil {
					t.Fatalf("campaign again: %v", err)
				}
				if l.election.Key() != old.Key || l.election.Rev() <= old.CreateRevision {
					t.Fatalf("new term %s@%d, want %s at a revision after %d", l.election.Key(), l.election.Rev(), old.Key, old.CreateRevision)
				}
				return l.fence, fmt.Sprintf("%s was created at revision %d, not %d", old.Key, l.election.Rev(), old.CreateRevision)
			},
		},
		{
			// A new session has a new lease, hence a new leader key: the
			// old term's fence names a key that is gone.
			name: "new term after the old session ended",
			setup: func(t *testing.T) (Fence, string) {
				old := campaign(ctx, t, cli)
				endSession(ctx, t, cli, old.session)
				cur := campaign(ctx, t, cli)
				if cur.fence.Conditions[0].Key == old.fence.Conditions[0].Key {
					t.Fatalf("new session campaigned on the old key %s", cur.fence.Conditions[0].Key)
				}
				return old.fence, old.fence.Conditions[0].Key + " no longer exists"
			},
		},
		{
			name: "current term after the old session ended",
			setup: func(t *testing.T) (Fence, string) {
				old := campaign(ctx, t, cli)
				endSession(ctx, t, cli, old.session)
				return campaign(ctx, t, cli).fence, ""
			},
		},
		{
			// The named lease key is fixed (leases/reconciler), so a new
			// holder re-creates the very key the old holder fenced on.
			name: "named lease re-granted to a new holder",
			setup: func(t *testing.T) (Fence, string) {
				l := campaign(ctx, t, cli)
				key := keys.Lease("reconciler-regrant")
				oldRev, oldLease := putLease(ctx, t, cli, key, l.fence.Conditions[0])
				if _, err := cli.Revoke(ctx, oldLease); err != nil {
					t.Fatalf("revoke: %v", err)
				}
				newRev, _ := putLease(ctx, t, cli, key, l.fence.Conditions[0])
				f := Fence{Conditions: []Condition{l.fence.Conditions[0], {Key: key, CreateRevision: oldRev}}}
				return f, fmt.Sprintf("%s was created at revision %d, not %d", key, newRev, oldRev)
			},
		},
		{
			name: "reconciler fence intact",
			setup: func(t *testing.T) (Fence, string) {
				l := campaign(ctx, t, cli)
				key := keys.Lease("reconciler-intact")
				rev, _ := putLease(ctx, t, cli, key, l.fence.Conditions[0])
				return Fence{Conditions: []Condition{l.fence.Conditions[0], {Key: key, CreateRevision: rev}}}, ""
			},
		},
		{
			// The reason names the condition that failed, not the first.
			name: "reconciler fence with its lease expired",
			setup: func(t *testing.T) (Fence, string) {
				l := campaign(ctx, t, cli)
				key := keys.Lease("reconciler-expired")
				rev, lease := putLease(ctx, t, cli, key, l.fence.Conditions[0])
				if _, err := cli.Revoke(ctx, lease); err != nil {
					t.Fatalf("revoke: %v", err)
				}
				return Fence{Conditions: []Condition{l.fence.Conditions[0], {Key: key, CreateRevision: rev}}}, key + " no longer exists"
			},
		},
		{
			// The lease dies with the curator term that granted it.
			name: "reconciler fence after a curator failover",
			setup: func(t *testing.T) (Fence, string) {
				l := campaign(ctx, t, cli)
				key := keys.Lease("reconciler-failover")
				rev, _ := putLease(ctx, t, cli, key, l.fence.Conditions[0])
				endSession(ctx, t, cli, l.session)
				return Fence{Conditions: []Condition{l.fence.Conditions[0], {Key: key, CreateRevision: rev}}}, l.fence.Conditions[0].Key + " no longer exists"
			},
		},
		{
			// A follower's campaign creates its key under the election
			// prefix too; it exists, but it is not the leader's.
			name: "candidate key",
			setup: func(t *testing.T) (Fence, string) {
				l := campaign(ctx, t, cli)
				s := newSession(t, cli)
				key := keys.LeaderElection + "candidate"
				resp, err := cli.Put(ctx, key, "follower", clientv3.WithLease(s.Lease()))
				if err != nil {
					t.Fatal(err)
				}
				return Fence{Conditions: []Condition{{Key: key, CreateRevision: resp.Header.Revision}}}, "is not the current leader's key (the leader is " + l.fence.Conditions[0].Key
			},
		},
		{
			// A live lease granted in another term, paired with the current
			// leader key: each condition holds, the pair does not.
			name: "lease of another term with the current leader key",
			setup: func(t *testing.T) (Fence, string) {
				old := campaign(ctx, t, cli)
				oldCond := old.fence.Conditions[0]
				key := keys.Lease("reconciler-other-term")
				rev, _ := putLease(ctx, t, cli, key, oldCond)
				endSession(ctx, t, cli, old.session)
				cur := campaign(ctx, t, cli)
				return Fence{Conditions: []Condition{cur.fence.Conditions[0], {Key: key, CreateRevision: rev}}}, fmt.Sprintf("was granted by leader key %s at term %d", oldCond.Key, oldCond.CreateRevision)
			},
		},
		{
			name: "lease key without a lease record",
			setup: func(t *testing.T) (Fence, string) {
				l := campaign(ctx, t, cli)
				key := keys.Lease("reconciler-garbage")
				rev, _ := putLeaseValue(ctx, t, cli, key, "holder")
				return Fence{Conditions: []Condition{l.fence.Conditions[0], {Key: key, CreateRevision: rev}}}, key + ": lease record"
			},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, wantReason := tt.setup(t)
			if err := f.Validate(keys.LeaderElection, keys.LeasesPrefix); err != nil {
				t.Fatalf("Validate(%s): %v", f, err)
			}
			m := marker(fmt.Sprintf("conditions/%d", i))
			resp, err := Apply(ctx, cli, f, nil, clientv3.OpPut(m, "written"))
			checkApply(ctx, t, cli, resp, err, m, wantReason)
		})
	}
}

func TestApplyRunsAllOps(t *testing.T) {
	cli := startEtcd(t)
	ctx := testContext(t)
	l := campaign(ctx, t, cli)

	a, b := marker("ops/a"), marker("ops/b")
	mustPut(ctx, t, cli, b, "to delete")
	resp, err := Apply(ctx, cli, l.fence, nil, clientv3.OpPut(a, "1"), clientv3.OpDelete(b), clientv3.OpGet(a))
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if len(resp.Responses) != 3 {
		t.Fatalf("Apply returned %d op responses, want 3", len(resp.Responses))
	}
	if kvs := resp.Responses[2].GetResponseRange().GetKvs(); len(kvs) != 1 || string(kvs[0].Value) != "1" {
		t.Errorf("get inside the fenced txn returned %v, want %s=1", kvs, a)
	}
	if !exists(ctx, t, cli, a) || exists(ctx, t, cli, b) {
		t.Errorf("after Apply: %s exists=%v (want true), %s exists=%v (want false)", a, exists(ctx, t, cli, a), b, exists(ctx, t, cli, b))
	}
}

func TestApplyErrorIsNotStale(t *testing.T) {
	cli := startEtcd(t)
	ctx := testContext(t)
	l := campaign(ctx, t, cli)

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	m := marker("canceled")
	resp, err := Apply(canceled, cli, l.fence, nil, clientv3.OpPut(m, "x"))
	if err == nil {
		t.Fatalf("Apply with a canceled context succeeded: %+v", resp)
	}
	if errors.Is(err, ErrStale) {
		t.Errorf("transport error %v matches ErrStale; a caller would give up a fence that still holds", err)
	}
	var se *StaleError
	if errors.As(err, &se) {
		t.Errorf("transport error %v is a *StaleError", err)
	}
	if exists(ctx, t, cli, m) {
		t.Errorf("failed Apply wrote %s", m)
	}
}

func TestEpoch(t *testing.T) {
	cli := startEtcd(t)
	ctx := testContext(t)
	l := campaign(ctx, t, cli)

	if got := mustReadEpoch(ctx, t, cli); got != 0 {
		t.Fatalf("ReadEpoch before any bump = %d, want 0", got)
	}

	// An epoch is checked even when the key does not exist yet.
	m := marker("epoch/before-first-bump")
	resp, err := Apply(ctx, cli, l.fence.WithEpoch(1), nil, clientv3.OpPut(m, "x"))
	checkApply(ctx, t, cli, resp, err, m, "membership epoch is 0, the caller planned at 1")

	resp, err = Apply(ctx, cli, l.fence, nil, BumpEpoch("x"))
	if err != nil {
		t.Fatalf("Apply(BumpEpoch): %v", err)
	}
	e1 := EpochAfter(resp)
	if e1 <= 0 {
		t.Fatalf("EpochAfter = %d, want positive", e1)
	}
	if got := mustReadEpoch(ctx, t, cli); got != e1 {
		t.Fatalf("ReadEpoch after bump = %d, EpochAfter = %d", got, e1)
	}
	get, err := cli.Get(ctx, keys.MembershipEpoch)
	if err != nil {
		t.Fatalf("get epoch: %v", err)
	}
	if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "x" {
		t.Errorf("epoch key holds %v, want the recorder %q", get.Kvs, "x")
	}

	// A fenced write that does not bump leaves the epoch alone; so does
	// any unrelated write.
	if _, err := Apply(ctx, cli, l.fence.WithEpoch(e1), nil, clientv3.OpPut(marker("epoch/no-bump"), "x")); err != nil {
		t.Fatalf("Apply without bump: %v", err)
	}
	mustPut(ctx, t, cli, marker("epoch/unrelated"), "x")
	if got := mustReadEpoch(ctx, t, cli); got != e1 {
		t.Fatalf("epoch moved from %d to %d without a bump", e1, got)
	}

	// The epoch only grows.
	resp, err = Apply(ctx, cli, l.fence.WithEpoch(e1), nil, BumpEpoch("y"))
	if err != nil {
		t.Fatalf("second bump: %v", err)
	}
	e2 := EpochAfter(resp)
	if e2 <= e1 {
		t.Fatalf("epoch went from %d to %d, want growth", e1, e2)
	}
	if got := mustReadEpoch(ctx, t, cli); got != e2 {
		t.Fatalf("ReadEpoch = %d, want %d", got, e2)
	}

	tests := []struct {
		name       string
		fence      Fence
		wantReason string
	}{
		{"current epoch", l.fence.WithEpoch(e2), ""},
		{"epoch from before the last bump", l.fence.WithEpoch(e1), fmt.Sprintf("membership epoch is %d, the caller planned at %d", e2, e1)},
		{"epoch from the future", l.fence.WithEpoch(e2 + 1000), fmt.Sprintf("membership epoch is %d, the caller planned at %d", e2, e2+1000)},
		{"epoch not checked", l.fence, ""},
		// The leader condition is reported before the epoch.
		{"stale leader and stale epoch", Fence{Conditions: []Condition{{Key: l.fence.Conditions[0].Key, CreateRevision: l.fence.Conditions[0].CreateRevision + 1}}, Epoch: e1}, "was created at revision"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := mustReadEpoch(ctx, t, cli)
			m := marker(fmt.Sprintf("epoch/case-%d", i))
			resp, err := Apply(ctx, cli, tt.fence, nil, clientv3.OpPut(m, "x"))
			checkApply(ctx, t, cli, resp, err, m, tt.wantReason)
			if tt.wantReason != "" && strings.Contains(tt.wantReason, "membership epoch") && !strings.Contains(err.Error(), "read members again") {
				t.Errorf("epoch reason %q does not tell the caller to read members again", err)
			}
			if after := mustReadEpoch(ctx, t, cli); after != before {
				t.Errorf("Apply without a bump moved the epoch from %d to %d", before, after)
			}
		})
	}

	// A stale bump bumps nothing.
	_, err = Apply(ctx, cli, l.fence.WithEpoch(e1), nil, BumpEpoch("stale"))
	if !errors.Is(err, ErrStale) {
		t.Fatalf("bump with a stale epoch: %v, want ErrStale", err)
	}
	if got := mustReadEpoch(ctx, t, cli); got != e2 {
		t.Fatalf("stale bump moved the epoch from %d to %d", e2, got)
	}
}

func TestApplyExtraComparisons(t *testing.T) {
	cli := startEtcd(t)
	ctx := testContext(t)
	l := campaign(ctx, t, cli)

	node := keys.Node("n1")
	oldRev := mustPut(ctx, t, cli, node, "v1")
	curRev := mustPut(ctx, t, cli, node, "v2")
	resp, err := Apply(ctx, cli, l.fence, nil, BumpEpoch("extra-test"))
	if err != nil {
		t.Fatalf("bump: %v", err)
	}
	epoch := EpochAfter(resp)

	// The record's current revision moves when a case writes it, so the
	// comparisons are built when a case runs.
	modRevIs := func(rev *int64) func() []clientv3.Cmp {
		return func() []clientv3.Cmp {
			return []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(node), "=", *rev)}
		}
	}
	current, old := modRevIs(&curRev), modRevIs(&oldRev)
	const generic = "a condition of the write no longer holds (the record changed since it was read)"
	stale := Fence{Conditions: []Condition{{Key: l.fence.Conditions[0].Key, CreateRevision: l.fence.Conditions[0].CreateRevision + 1}}}

	tests := []struct {
		name       string
		fence      Fence
		extra      func() []clientv3.Cmp
		wantReason string
	}{
		{"record unchanged", l.fence, current, ""},
		{"record unchanged, epoch current", l.fence.WithEpoch(epoch), current, ""},
		{"no extra comparisons", l.fence, func() []clientv3.Cmp { return nil }, ""},
		{"record changed since read", l.fence, old, generic},
		{"record changed since read, epoch current", l.fence.WithEpoch(epoch), old, generic},
		{"record absent", l.fence, func() []clientv3.Cmp {
			return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(keys.Node("absent")), ">", 0)}
		}, generic},
		{"several extras, one failing", l.fence, func() []clientv3.Cmp {
			return append(current(), clientv3.Compare(clientv3.Value(node), "=", "v1"))
		}, generic},
		// A broken fence or epoch is named before a failed extra comparison.
		{"stale fence and record changed", stale, old, "was created at revision"},
		{"stale epoch and record changed", l.fence.WithEpoch(epoch - 1), old, "membership epoch"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := marker(fmt.Sprintf("extra/%d", i))
			resp, err := Apply(ctx, cli, tt.fence, tt.extra(), clientv3.OpPut(m, "x"), clientv3.OpPut(node, "written"))
			checkApply(ctx, t, cli, resp, err, m, tt.wantReason)
			get, err := cli.Get(ctx, node)
			if err != nil {
				t.Fatalf("get %s: %v", node, err)
			}
			if tt.wantReason == "" {
				if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "written" {
					t.Errorf("Apply did not write %s: %v", node, get.Kvs)
				}
				// Put the record back for the next case.
				curRev = mustPut(ctx, t, cli, node, "v2")
				return
			}
			if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "v2" || get.Kvs[0].ModRevision != curRev {
				t.Errorf("stale Apply changed %s: %v", node, get.Kvs)
			}
		})
	}
}

func TestConcurrentFencedBumpsExactlyOneWins(t *testing.T) {
	cli := startEtcd(t)
	ctx := testContext(t)
	l := campaign(ctx, t, cli)
	// The epoch exists in every real cluster (the consensus service creates
	// it at bootstrap); an epoch of 0 means "not checked".
	if _, err := Apply(ctx, cli, l.fence, nil, BumpEpoch("init")); err != nil {
		t.Fatalf("initial bump: %v", err)
	}

	const (
		rounds  = 5
		workers = 8
	)
	for round := 0; round < rounds; round++ {
		e0 := mustReadEpoch(ctx, t, cli)
		f := l.fence.WithEpoch(e0)

		type result struct {
			resp *clientv3.TxnResponse
			err  error
		}
		results := make([]result, workers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				resp, err := Apply(ctx, cli, f, nil,
					BumpEpoch(fmt.Sprintf("worker-%d", w)),
					clientv3.OpPut(marker(fmt.Sprintf("race/%d/%d", round, w)), "won"))
				results[w] = result{resp, err}
			}()
		}
		close(start)
		wg.Wait()

		winner := -1
		for w, r := range results {
			switch {
			case r.err == nil:
				if winner >= 0 {
					t.Fatalf("round %d: workers %d and %d both applied with epoch %d", round, winner, w, e0)
				}
				winner = w
			case errors.Is(r.err, ErrStale):
				if !strings.Contains(r.err.Error(), "membership epoch") {
					t.Errorf("round %d, worker %d: stale reason %q does not mention the membership epoch", round, w, r.err)
				}
			default:
				t.Fatalf("round %d, worker %d: %v", round, w, r.err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no worker applied with epoch %d", round, e0)
		}
		after := mustReadEpoch(ctx, t, cli)
		if want := EpochAfter(results[winner].resp); after != want || after <= e0 {
			t.Fatalf("round %d: epoch %d after the race, want the winner's %d (> %d)", round, after, want, e0)
		}
		written, err := cli.Get(ctx, marker(fmt.Sprintf("race/%d/", round)), clientv3.WithPrefix())
		if err != nil {
			t.Fatalf("list markers: %v", err)
		}
		if len(written.Kvs) != 1 || string(written.Kvs[0].Key) != marker(fmt.Sprintf("race/%d/%d", round, winner)) {
			t.Fatalf("round %d: markers %v, want only worker %d's", round, written.Kvs, winner)
		}
	}
}

func TestValidate(t *testing.T) {
	allowed := []string{keys.LeaderElection, keys.LeasesPrefix}
	leader := Condition{Key: keys.LeaderElection + "694d7a1b2c3d4e5f", CreateRevision: 12}
	lease := Condition{Key: keys.Lease("reconciler"), CreateRevision: 40}

	tests := []struct {
		name    string
		fence   Fence
		allowed []string
		wantErr []string // substrings of the error; nil: valid
	}{
		{"leader key", Fence{Conditions: []Condition{leader}}, allowed, nil},
		{"leader and lease keys with epoch", Fence{Conditions: []Condition{leader, lease}, Epoch: 7}, allowed, nil},
		{"no conditions", Fence{}, allowed, []string{"no conditions", "leader key or lease"}},
		{"epoch only", Fence{Epoch: 3}, allowed, []string{"no conditions"}},
		{"zero revision", Fence{Conditions: []Condition{{Key: leader.Key}}}, allowed, []string{leader.Key, "create revision must be positive, got 0"}},
		{"negative revision", Fence{Conditions: []Condition{leader, {Key: lease.Key, CreateRevision: -3}}}, allowed, []string{lease.Key, "create revision must be positive, got -3"}},
		{"key outside the prefixes", Fence{Conditions: []Condition{{Key: keys.MembershipEpoch, CreateRevision: 1}}}, allowed, []string{keys.MembershipEpoch, "not a leader or lease key", "want a key under " + keys.LeaderElection + " or " + keys.LeasesPrefix}},
		{"key outside curia", Fence{Conditions: []Condition{{Key: "/other/leader/x", CreateRevision: 1}}}, allowed, []string{"not a leader or lease key"}},
		{"bare leader prefix", Fence{Conditions: []Condition{{Key: keys.LeaderElection, CreateRevision: 1}}}, allowed, []string{"not a leader or lease key"}},
		{"bare leases prefix", Fence{Conditions: []Condition{leader, {Key: keys.LeasesPrefix, CreateRevision: 1}}}, allowed, []string{keys.LeasesPrefix, "not a leader or lease key"}},
		{"lease key when only leader keys are allowed", Fence{Conditions: []Condition{leader, lease}}, []string{keys.LeaderElection}, []string{lease.Key, "want a key under " + keys.LeaderElection}},
		{"lease without its leader key", Fence{Conditions: []Condition{lease}}, allowed, []string{"a lease needs the leader key that granted it"}},
		{"two leader keys", Fence{Conditions: []Condition{leader, {Key: leader.Key + "0", CreateRevision: 13}}}, allowed, []string{"2 leader keys"}},
		{"negative epoch", Fence{Conditions: []Condition{leader}, Epoch: -1}, allowed, []string{"membership epoch must not be negative, got -1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.fence.Validate(tt.allowed...)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Validate(%s) = %v, want nil", tt.fence, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate(%s) = nil, want an error containing %q", tt.fence, tt.wantErr)
			}
			if !strings.HasPrefix(err.Error(), "fence: ") {
				t.Errorf("error %q does not start with %q", err, "fence: ")
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Validate(%s) = %q, want it to contain %q", tt.fence, err, want)
				}
			}
		})
	}
}

func TestHasKeyUnder(t *testing.T) {
	f := Fence{Conditions: []Condition{{Key: keys.LeaderElection + "abc", CreateRevision: 1}, {Key: keys.Lease("reconciler"), CreateRevision: 2}}}
	tests := []struct {
		prefix string
		want   bool
	}{
		{keys.LeaderElection, true},
		{keys.LeasesPrefix, true},
		{keys.NodesPrefix, false},
	}
	for _, tt := range tests {
		if got := f.HasKeyUnder(tt.prefix); got != tt.want {
			t.Errorf("HasKeyUnder(%q) = %v, want %v", tt.prefix, got, tt.want)
		}
	}
	if (Fence{}).HasKeyUnder(keys.LeaderElection) {
		t.Errorf("an empty fence has a key under %q", keys.LeaderElection)
	}
}

func TestProto(t *testing.T) {
	if f := FromProto(nil); len(f.Conditions) != 0 || f.Epoch != 0 {
		t.Errorf("FromProto(nil) = %+v, want an empty fence", f)
	}
	if f := FromProto(&fencev1.Fence{}); len(f.Conditions) != 0 || f.Epoch != 0 {
		t.Errorf("FromProto(empty) = %+v, want an empty fence", f)
	}
	p := &fencev1.Fence{
		Conditions:      []*fencev1.FenceCondition{{Key: keys.LeaderElection + "a", CreateRevision: 5}, {Key: keys.Lease("reconciler"), CreateRevision: 9}},
		MembershipEpoch: 17,
	}
	want := Fence{Conditions: []Condition{{Key: keys.LeaderElection + "a", CreateRevision: 5}, {Key: keys.Lease("reconciler"), CreateRevision: 9}}, Epoch: 17}
	if got := FromProto(p); !reflect.DeepEqual(got, want) {
		t.Errorf("FromProto(%v) = %+v, want %+v", p, got, want)
	}

	tests := []struct {
		name  string
		fence Fence
	}{
		{"empty", Fence{}},
		{"epoch only", Fence{Epoch: 4}},
		{"one condition", Fence{Conditions: []Condition{{Key: keys.LeaderElection + "a", CreateRevision: 5}}}},
		{"two conditions and epoch", want},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.fence.Proto()
			if p == nil {
				t.Fatalf("Proto() = nil")
			}
			if p.GetMembershipEpoch() != tt.fence.Epoch || len(p.GetConditions()) != len(tt.fence.Conditions) {
				t.Fatalf("Proto() = %v, want epoch %d and %d conditions", p, tt.fence.Epoch, len(tt.fence.Conditions))
			}
			for i, c := range p.GetConditions() {
				if c.GetKey() != tt.fence.Conditions[i].Key || c.GetCreateRevision() != tt.fence.Conditions[i].CreateRevision {
					t.Errorf("Proto() condition %d = %v, want %s", i, c, tt.fence.Conditions[i])
				}
			}
			if got := FromProto(p); !reflect.DeepEqual(got, tt.fence) {
				t.Errorf("FromProto(Proto(%+v)) = %+v", tt.fence, got)
			}
		})
	}
}

func TestWithEpochCopies(t *testing.T) {
	f := Fence{Conditions: []Condition{{Key: keys.LeaderElection + "a", CreateRevision: 5}}}
	g := f.WithEpoch(9)
	if g.Epoch != 9 || f.Epoch != 0 {
		t.Fatalf("WithEpoch(9): got epoch %d, original now %d", g.Epoch, f.Epoch)
	}
	g.Conditions[0].CreateRevision = 6
	_ = append(g.Conditions, Condition{Key: "x", CreateRevision: 1})
	if f.Conditions[0].CreateRevision != 5 || len(f.Conditions) != 1 {
		t.Errorf("changing WithEpoch's copy changed the original: %+v", f)
	}
}

func TestStrings(t *testing.T) {
	a := Condition{Key: keys.LeaderElection + "694d", CreateRevision: 12}
	b := Condition{Key: keys.Lease("reconciler"), CreateRevision: 40}
	tests := []struct {
		name  string
		fence Fence
		want  []string
	}{
		{"empty", Fence{}, []string{}},
		{"one condition", Fence{Conditions: []Condition{a}}, []string{"/curia/leader/694d@12"}},
		{"two conditions", Fence{Conditions: []Condition{a, b}}, []string{"/curia/leader/694d@12", "/curia/leases/reconciler@40"}},
		{"conditions and epoch", Fence{Conditions: []Condition{a, b}, Epoch: 57}, []string{"/curia/leader/694d@12", "/curia/leases/reconciler@40", "/curia/membership/epoch@mod57"}},
		{"epoch only", Fence{Epoch: 3}, []string{"/curia/membership/epoch@mod3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.fence.Strings()
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Strings() = %q, want %q", got, tt.want)
			}
			if s, want := tt.fence.String(), strings.Join(tt.want, ","); s != want {
				t.Errorf("String() = %q, want %q", s, want)
			}
		})
	}
	if got, want := a.String(), "/curia/leader/694d@12"; got != want {
		t.Errorf("Condition.String() = %q, want %q", got, want)
	}
}
