package reconciler

import (
	"context"
	"testing"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	cut "curia.dev/services/curator/curatortest"
)

// TestNodeViewFollowsTheRegistry: the replica's node view, fed by a real
// curator's Watch, reaches every revision etcd reached — one that changed
// a node, one that changed a node's health only, and one that changed no
// node at all (progress) — with what the registry held at it; a pass
// waiting for a revision never gets an older view.
func TestNodeViewFollowsTheRegistry(t *testing.T) {
	c := cut.New(t, 1)
	cli := c.Etcd(c.Voters[0].ClientURL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := newBareReconciler(Config{})
	r.curator = c.Conn(c.Running(), pki.Principal{Kind: pki.KindReconciler})
	followed := make(chan struct{})
	fctx, stop := context.WithCancel(ctx)
	go func() { defer close(followed); _ = r.followNodes(fctx) }()

	// at waits for the view at rev or later and returns node id in it.
	at := func(rev int64, id string) *curatorv1.Node {
		t.Helper()
		nodes, got, ok := r.view.at(ctx, rev, 10*time.Second)
		if !ok {
			t.Fatalf("the view did not reach revision %d in 10s (it is at %d)", rev, r.view.revision())
		}
		if got < rev {
			t.Fatalf("the view answered at revision %d for %d", got, rev)
		}
		for _, n := range nodes {
			if n.GetId() == id {
				return n
			}
		}
		return nil
	}
	revision := func() int64 {
		t.Helper()
		resp, err := cli.Get(ctx, keys.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}

	id := cut.SeedNodes(t, cli, 1)[0]
	if n := at(revision(), id); n == nil {
		t.Fatalf("node %s created, but not in the view", id)
	}
	// Health: a heartbeat makes the node HEALTHY, and no record changed.
	if _, err := cli.Put(ctx, keys.Heartbeat(id), time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
		t.Fatal(err)
	}
	if n := at(revision(), id); n.GetHealth() != curatorv1.NodeHealth_NODE_HEALTH_HEALTHY {
		t.Fatalf("node %s after a heartbeat: %v in the view, want HEALTHY", id, n.GetHealth())
	}
	// Progress: a write that changes no node still brings the view to its
	// revision, without a node change to carry it.
	if _, err := cli.Put(ctx, keys.Prefix+"test/unrelated", "x"); err != nil {
		t.Fatal(err)
	}
	at(revision(), id)
	// A deletion.
	if _, err := cli.Delete(ctx, keys.Node(id)); err != nil {
		t.Fatal(err)
	}
	if n := at(revision(), id); n != nil {
		t.Fatalf("node %s deleted, but still in the view: %v", id, n)
	}
	// A new stream (a curator restart, a broken connection) resumes from
	// the view's revision: nothing is lost or repeated.
	stop()
	<-followed
	ids := cut.SeedNodes(t, cli, 3)
	followed = make(chan struct{})
	fctx, stop = context.WithCancel(ctx)
	go func() { defer close(followed); _ = r.followNodes(fctx) }()
	defer func() { stop(); <-followed }()
	rev := revision()
	for _, id := range ids {
		if n := at(rev, id); n == nil {
			t.Fatalf("node %s created while the view was not followed, missing after it resumed", id)
		}
	}
}
