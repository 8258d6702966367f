package curator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"curia.dev/platform/proctest"
	"curia.dev/platform/rpcerr"
	ct "curia.dev/services/consensus/consensustest"
)

// TestElectionSessionOwnClient: the election session renews its lease on
// a client of its own, so that a serving client that cannot get through
// (here: closed, the extreme of a connection queued up behind heartbeat
// load) leaves the leader leading. With the session on the serving
// client, the lease is never renewed again and this fails.
func TestElectionSessionOwnClient(t *testing.T) {
	cc := ct.NewCluster(t)
	voters, fixture := cc.Voters(1)
	fixture.Resign() // the fixture's leader key: ours campaigns behind it
	serving := cc.Etcd(voters[0].ClientURL)
	session := cc.Etcd(voters[0].ClientURL)
	observer := cc.Etcd(voters[0].ClientURL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	led := make(chan int64, 1)
	l := newLeadership(serving, session, nil, slog.New(slog.DiscardHandler), leaderValue{Name: "a"}, 6*time.Second,
		func(_ context.Context, term int64) { led <- term })
	done := make(chan error, 1)
	go func() { done <- l.campaign(ctx, func() {}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("campaign: %v", err)
		}
	}()
	select {
	case <-led:
	case <-ctx.Done():
		t.Fatal("never led")
	}
	l.mu.Lock()
	lease := l.session.Lease()
	l.mu.Unlock()

	if err := serving.Close(); err != nil {
		t.Fatal(err)
	}
	ttl := func() (int64, error) {
		resp, err := observer.TimeToLive(ctx, lease)
		if err != nil {
			return 0, err
		}
		if resp.TTL <= 0 {
			return 0, fmt.Errorf("session lease %x expired", lease)
		}
		return resp.TTL, nil
	}
	// The lease is renewed after the serving client went: its remaining
	// time goes down and then up again, and the replica still leads.
	first, err := ttl()
	if err != nil {
		t.Fatal(err)
	}
	lowest := first
	proctest.Eventually(t, 10*time.Second, func() error {
		cur, err := ttl()
		if err != nil {
			return err
		}
		if cur > lowest {
			return nil
		}
		lowest = min(lowest, cur)
		return fmt.Errorf("session lease at %ds, not renewed since %ds", cur, first)
	})
	if _, _, ok := l.Ours(); !ok {
		t.Fatal("stepped down although the session lives")
	}
}

// TestTxnRefusedAfterTermLost: a replica that still believes it leads
// after its term ended (its leader key gone and another in its place,
// before it noticed: a frozen process, a lost session) writes nothing, and
// learns that it lost. The guard is the write's own comparison of the
// leader key's create revision with the term; the check of ours() before
// it cannot see this, and with the guard off (no-term-guard) the write
// lands.
func TestTxnRefusedAfterTermLost(t *testing.T) {
	cc := ct.NewCluster(t)
	voters, _ := cc.Voters(1)
	cli := cc.Etcd(voters[0].ClientURL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const key = "/curia/test-term/leader"
	won, err := cli.Put(ctx, key, "a")
	if err != nil {
		t.Fatal(err)
	}
	l := newLeadership(cli, cli, nil, slog.New(slog.DiscardHandler), leaderValue{Name: "a"}, 6*time.Second, nil)
	l.mu.Lock()
	l.key, l.term = key, won.Header.Revision // leads: the key's create revision is its term
	l.mu.Unlock()
	if _, err := l.Txn(ctx, nil, clientv3.OpPut("/curia/test-term/during", "x")); err != nil {
		t.Fatalf("a write during the term: %v", err)
	}

	// The term ends behind its back: the key goes, a successor's comes.
	if _, err := cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, key, "b"); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := l.Ours(); !ok {
		t.Fatal("the replica noticed by itself; the test needs it not to")
	}
	_, err = l.Txn(ctx, nil, clientv3.OpPut("/curia/test-term/after", "x"))
	if !errors.Is(err, rpcerr.NotLeader) {
		t.Fatalf("a write after the term: %v, want NotLeader", err)
	}
	resp, err := cli.Get(ctx, "/curia/test-term/after")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Fatalf("the write of an ended term landed: %s", resp.Kvs[0].Value)
	}
}
