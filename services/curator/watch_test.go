package curator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
	cut "curia.dev/services/curator/curatortest"
)

// Watch end to end through curator processes (curatortest). The watch
// hub's own tests (its bookkeeping alone, and against a real etcd) are
// internal/nodewatch's.

func watchCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// watchStream is a Watch call; every Recv has the deadline of its context.
type watchStream struct {
	t      *testing.T
	stream curatorv1.Curator_WatchClient
	cancel context.CancelFunc
}

func openWatch(t *testing.T, cl curatorv1.CuratorClient, req *curatorv1.WatchRequest) *watchStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	stream, err := cl.Watch(ctx, req)
	if err != nil {
		cancel()
		t.Fatalf("watch %v: %v", req, err)
	}
	t.Cleanup(cancel)
	return &watchStream{t: t, stream: stream, cancel: cancel}
}

func (w *watchStream) next() *curatorv1.WatchResponse {
	w.t.Helper()
	r, err := w.stream.Recv()
	if err != nil {
		w.t.Fatalf("watch: %v", err)
	}
	return r
}

// until reads responses until one satisfies done, and returns them all.
func (w *watchStream) until(done func(*curatorv1.WatchResponse) bool) []*curatorv1.WatchResponse {
	w.t.Helper()
	var out []*curatorv1.WatchResponse
	for {
		r := w.next()
		out = append(out, r)
		if done(r) {
			return out
		}
	}
}

func (w *watchStream) close() { w.cancel() }

// watchErr is how a Watch call that should fail fails.
func watchErr(t *testing.T, cl curatorv1.CuratorClient, req *curatorv1.WatchRequest) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := cl.Watch(ctx, req)
	if err != nil {
		return err
	}
	_, err = stream.Recv()
	return err
}

func allNodes(from int64) *curatorv1.WatchRequest {
	return &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_AllNodes{AllNodes: true}, StartRevision: from}
}

func oneNode(id string, from int64) *curatorv1.WatchRequest {
	return &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_NodeId{NodeId: id}, StartRevision: from}
}

func nodeIn(r *curatorv1.WatchResponse, id string) *curatorv1.Node {
	for _, n := range r.Nodes {
		if n.Id == id {
			return n
		}
	}
	return nil
}

// setVersion has node a report version v (through cl, a replica),
// retrying while leadership moves. The write is idempotent.
func setVersion(t *testing.T, a *cut.Agent, cl curatorv1.CuratorClient, v string) {
	t.Helper()
	proctest.Eventually(t, time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := cl.UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: &curatorv1.NodeStatus{Address: "127.0.0.1", Version: v}})
		if status.Code(err) == codes.Unavailable {
			return err
		}
		if err != nil {
			t.Fatalf("update status of %s to %s: %v", a.ID, v, err)
		}
		return nil
	})
}

func otherCurator(c *cut.Cluster, cur *cut.Curator) *cut.Curator {
	for _, o := range c.Curators {
		if o != cur {
			return o
		}
	}
	return nil
}

// TestWatchAllNodes: an admin watching all nodes on a follower gets a
// snapshot, then a new node's NEW → STANDBY → UP, each at its own revision,
// and its deletion.
func TestWatchAllNodes(t *testing.T) {
	c := cut.New(t, 2)
	ctx := watchCtx(t)
	follower := otherCurator(c, c.Leader())
	w := openWatch(t, curatorv1.NewCuratorClient(c.Conn(follower, cut.Admin)), allNodes(0))

	snap := w.next()
	boot := nodeIn(snap, c.Voters[0].ID)
	if !snap.Snapshot || snap.Revision == 0 || len(snap.Nodes) != 1 || boot == nil || boot.State != curatorv1.NodeState_NODE_STATE_UP {
		t.Fatalf("snapshot %v", snap)
	}
	if boot.Revision == 0 || boot.Revision > snap.Revision {
		t.Fatalf("bootstrap node at revision %d in a snapshot at %d", boot.Revision, snap.Revision)
	}
	if boot.Health == curatorv1.NodeHealth_NODE_HEALTH_UNSPECIFIED {
		t.Fatalf("bootstrap node without its computed health: %v", boot)
	}

	a := c.NewAgent()
	a.Enrol(ctx)
	var states []curatorv1.NodeState
	last := snap.Revision
	for _, r := range w.until(func(r *curatorv1.WatchResponse) bool {
		n := nodeIn(r, a.ID)
		return n != nil && n.State == curatorv1.NodeState_NODE_STATE_UP
	}) {
		if r.Snapshot || r.Revision <= last {
			t.Fatalf("response at %d (snapshot %v) after %d", r.Revision, r.Snapshot, last)
		}
		last = r.Revision
		if n := nodeIn(r, a.ID); n != nil {
			if n.Revision != r.Revision {
				t.Fatalf("node at revision %d in a batch at %d", n.Revision, r.Revision)
			}
			states = append(states, n.State)
		}
	}
	want := []curatorv1.NodeState{curatorv1.NodeState_NODE_STATE_NEW, curatorv1.NodeState_NODE_STATE_STANDBY, curatorv1.NodeState_NODE_STATE_UP}
	if !slices.Equal(states, want) {
		t.Fatalf("states %v, want %v", states, want)
	}

	if _, err := c.Management().DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: a.ID, SafetyBypassNotDecommissioned: true}); err != nil {
		t.Fatal(err)
	}
	r := w.next()
	if !slices.Equal(r.Deleted, []string{a.ID}) || len(r.Nodes) != 0 || r.Revision <= last {
		t.Fatalf("after the delete: %v", r)
	}

	// A snapshot at least as new as the delete (as the reconciler asks for
	// one as new as its member list) does not have the node.
	fresh := openWatch(t, curatorv1.NewCuratorClient(c.Conn(follower, cut.Admin)), &curatorv1.WatchRequest{Kind: allNodes(0).Kind, MinRevision: r.Revision})
	if snap := fresh.next(); !snap.Snapshot || snap.Revision < r.Revision || nodeIn(snap, a.ID) != nil || nodeIn(snap, c.Voters[0].ID) == nil {
		t.Fatalf("snapshot with min_revision %d: %v", r.Revision, snap)
	}
}

// TestWatchNodeItself: a node watches itself and nothing else; it sees
// only its own changes, also when it resumes.
func TestWatchNodeItself(t *testing.T) {
	c := cut.New(t, 1)
	ctx := watchCtx(t)
	cur := c.Running()
	a, b := c.NewAgent(), c.NewAgent()
	a.Enrol(ctx)
	b.Enrol(ctx)
	acl, bcl := a.Curator(cur), b.Curator(cur)

	t.Run("refused", func(t *testing.T) {
		err := watchErr(t, acl, oneNode(b.ID, 0))
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "may watch only itself") {
			t.Fatalf("watch another node: %v", err)
		}
		err = watchErr(t, acl, allNodes(0))
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "node_id="+a.ID) {
			t.Fatalf("node watches all: %v", err)
		}
		admin := curatorv1.NewCuratorClient(c.Conn(cur, cut.Admin))
		minRev := func(req *curatorv1.WatchRequest, min int64) *curatorv1.WatchRequest {
			req.MinRevision = min
			return req
		}
		for _, req := range []*curatorv1.WatchRequest{oneNode("node-1234", 0), {}, allNodes(-1), minRev(allNodes(0), -1), minRev(allNodes(5), 5)} {
			if err := watchErr(t, admin, req); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("watch %v: %v, want InvalidArgument", req, err)
			}
		}
	})

	w := openWatch(t, acl, oneNode(a.ID, 0))
	snap := w.next()
	if !snap.Snapshot || len(snap.Nodes) != 1 || snap.Nodes[0].Id != a.ID || snap.Nodes[0].State != curatorv1.NodeState_NODE_STATE_UP {
		t.Fatalf("snapshot %v", snap)
	}
	setVersion(t, b, bcl, "b1")
	setVersion(t, a, acl, "a1")
	r := w.next()
	if r.Snapshot || len(r.Nodes) != 1 || r.Nodes[0].Id != a.ID || r.Nodes[0].GetStatus().GetVersion() != "a1" {
		t.Fatalf("first change %v, want a's a1 only", r)
	}
	w.close()

	setVersion(t, b, bcl, "b2")
	setVersion(t, a, acl, "a2")
	setVersion(t, b, bcl, "b3")
	setVersion(t, a, acl, "a3")
	w = openWatch(t, acl, oneNode(a.ID, r.Revision))
	var got []string
	for _, r := range w.until(func(r *curatorv1.WatchResponse) bool { return nodeIn(r, a.ID).GetStatus().GetVersion() == "a3" }) {
		if r.Snapshot || len(r.Nodes) != 1 || len(r.Deleted) != 0 {
			t.Fatalf("resumed: %v", r)
		}
		got = append(got, nodeIn(r, a.ID).GetStatus().GetVersion())
	}
	if !slices.Equal(got, []string{"a2", "a3"}) {
		t.Fatalf("resumed with %v, want [a2 a3]", got)
	}
}

// watchLog is what a client made of a watch across streams: every
// non-snapshot revision it took, and the versions node id reported.
type watchLog struct {
	id       string
	last     int64
	versions []string
}

// take reads w until node id reports version until, checks that
// revisions only grow across everything taken, and notes the versions.
func (l *watchLog) take(t *testing.T, w *watchStream, until string) {
	t.Helper()
	for _, r := range w.until(func(r *curatorv1.WatchResponse) bool { return nodeIn(r, l.id).GetStatus().GetVersion() == until }) {
		if r.Snapshot {
			t.Fatalf("snapshot at %d when resuming from %d", r.Revision, l.last)
		}
		if r.Revision <= l.last {
			t.Fatalf("revision %d after %d: a duplicate or out of order", r.Revision, l.last)
		}
		l.last = r.Revision
		if n := nodeIn(r, l.id); n != nil {
			l.versions = append(l.versions, n.GetStatus().GetVersion())
		}
	}
}

// TestWatchResume: a client that resumes with the revision of the last
// response it read, on the other replica — also after the leader it
// watched was killed — sees every change once, in order.
func TestWatchResume(t *testing.T) {
	c := cut.New(t, 2)
	ctx := watchCtx(t)
	a := c.NewAgent()
	a.Enrol(ctx)
	admin := func(cur *cut.Curator) curatorv1.CuratorClient {
		return curatorv1.NewCuratorClient(c.Conn(cur, cut.Admin))
	}
	leader := c.Leader()
	follower := otherCurator(c, leader)
	write := func(cur *cut.Curator, from, to int) {
		cl := a.Curator(cur)
		for i := from; i <= to; i++ {
			setVersion(t, a, cl, fmt.Sprintf("v%d", i))
		}
	}
	want := func(n int) []string {
		var out []string
		for i := 1; i <= n; i++ {
			out = append(out, fmt.Sprintf("v%d", i))
		}
		return out
	}

	// On the follower: a snapshot, then v1..v3 of which the client reads
	// up to v2 before it goes.
	// The follower's hub may not have seen the enrolment yet: a snapshot
	// is at its revision (no min_revision here).
	var w *watchStream
	var snap *curatorv1.WatchResponse
	proctest.Eventually(t, 10*time.Second, func() error {
		w = openWatch(t, admin(follower), allNodes(0))
		if snap = w.next(); !snap.Snapshot || nodeIn(snap, a.ID) == nil {
			w.close()
			return fmt.Errorf("snapshot %v without %s", snap, a.ID)
		}
		return nil
	})
	log := &watchLog{id: a.ID, last: snap.Revision}
	write(leader, 1, 3)
	log.take(t, w, "v2")
	w.close()
	write(leader, 4, 6)

	t.Run("other replica", func(t *testing.T) {
		w := openWatch(t, admin(leader), allNodes(log.last))
		log.take(t, w, "v6")
		if !slices.Equal(log.versions, want(6)) {
			t.Fatalf("versions %v, want %v", log.versions, want(6))
		}
		write(leader, 7, 8)
		log.take(t, w, "v7") // v8 may have arrived; the client did not read it
		w.close()
	})

	t.Run("after the leader was killed", func(t *testing.T) {
		leader.Kill()
		next := c.Leader()
		if next != follower {
			t.Fatalf("%s leads, want %s", next.Name, follower.Name)
		}
		write(next, 9, 10)
		w := openWatch(t, admin(next), allNodes(log.last))
		log.take(t, w, "v10")
		if !slices.Equal(log.versions, want(10)) {
			t.Fatalf("versions %v, want %v", log.versions, want(10))
		}
	})
}

// TestWatchResumeTooOld: a resume from a revision the ring no longer holds
// gets a snapshot; one from inside the ring gets exactly what followed.
func TestWatchResumeTooOld(t *testing.T) {
	c := cut.New(t, 1, "--watch-history", "4")
	ctx := watchCtx(t)
	cur := c.Running()
	a := c.NewAgent()
	a.Enrol(ctx)
	cl := curatorv1.NewCuratorClient(c.Conn(cur, cut.Admin))
	acl := a.Curator(cur)

	w := openWatch(t, cl, allNodes(0))
	start := w.next().Revision
	revs := map[string]int64{}
	for i := 1; i <= 6; i++ {
		v := fmt.Sprintf("v%d", i)
		setVersion(t, a, acl, v)
		for _, r := range w.until(func(r *curatorv1.WatchResponse) bool { return nodeIn(r, a.ID).GetStatus().GetVersion() == v }) {
			revs[v] = r.Revision
		}
	}
	w.close()

	// The ring holds v3..v6: from v2's revision every change is there.
	w = openWatch(t, cl, allNodes(revs["v2"]))
	var got []string
	for _, r := range w.until(func(r *curatorv1.WatchResponse) bool { return r.Revision == revs["v6"] }) {
		if r.Snapshot {
			t.Fatalf("snapshot resuming from inside the ring: %v", r)
		}
		got = append(got, nodeIn(r, a.ID).GetStatus().GetVersion())
	}
	if !slices.Equal(got, []string{"v3", "v4", "v5", "v6"}) {
		t.Fatalf("resumed from v2 with %v", got)
	}
	w.close()

	for name, from := range map[string]int64{"before the ring": revs["v1"], "the first snapshot's": start} {
		t.Run(name, func(t *testing.T) {
			w := openWatch(t, cl, allNodes(from))
			r := w.next()
			if n := nodeIn(r, a.ID); !r.Snapshot || r.Revision < revs["v6"] || n.GetStatus().GetVersion() != "v6" || len(r.Nodes) != 2 {
				t.Fatalf("resume from %d: %v, want a snapshot with v6", from, r)
			}
			w.close()
		})
	}
}

// TestWatchRequestRules: a node (enrolling or not) watches only itself;
// requests are checked (the stream a valid one starts: internal/nodewatch's
// TestNewWatcher).
func TestWatchRequestRules(t *testing.T) {
	self, other := "node-"+strings.Repeat("0", 31)+"a", "node-"+strings.Repeat("0", 31)+"b"
	node := pki.Principal{Kind: pki.KindNode, Name: self}
	enrolling := pki.Principal{Kind: pki.KindEnrolling, Name: self}
	admin := pki.Principal{Kind: pki.KindAdmin, Name: "ops"}
	one := func(id string) *curatorv1.WatchRequest {
		return &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_NodeId{NodeId: id}}
	}
	all := &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_AllNodes{AllNodes: true}}
	tests := map[string]struct {
		who  pki.Principal
		req  *curatorv1.WatchRequest
		code codes.Code
		says string
	}{
		"node watches itself":       {who: node, req: one(self)},
		"node watches another":      {who: node, req: one(other), code: codes.PermissionDenied, says: "may watch only itself"},
		"node watches all":          {who: node, req: all, code: codes.PermissionDenied, says: "set node_id=" + self},
		"admin watches a node":      {who: admin, req: one(other)},
		"admin watches all":         {who: admin, req: all},
		"reconciler watches all":    {who: pki.Principal{Kind: pki.KindReconciler}, req: all},
		"invalid node id":           {who: admin, req: one("node-1"), code: codes.InvalidArgument, says: "node-<32 hex digits>"},
		"node with invalid id":      {who: node, req: one("nope"), code: codes.PermissionDenied, says: "may watch only itself"},
		"node, all_nodes false":     {who: node, req: &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_AllNodes{}}, code: codes.PermissionDenied, says: "may watch only itself"},
		"neither":                   {who: admin, req: &curatorv1.WatchRequest{}, code: codes.InvalidArgument, says: "kind: exactly one field is required in oneof"},
		"all_nodes false":           {who: admin, req: &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_AllNodes{}}, code: codes.InvalidArgument, says: "all_nodes: must equal true"},
		"negative start revision":   {who: admin, req: &curatorv1.WatchRequest{Kind: all.Kind, StartRevision: -1}, code: codes.InvalidArgument, says: "start_revision"},
		"snapshot at a revision":    {who: admin, req: &curatorv1.WatchRequest{Kind: all.Kind, MinRevision: 7}},
		"negative min revision":     {who: admin, req: &curatorv1.WatchRequest{Kind: all.Kind, MinRevision: -1}, code: codes.InvalidArgument, says: "min_revision: must be greater than or equal to 0"},
		"min revision on a resume":  {who: admin, req: &curatorv1.WatchRequest{Kind: all.Kind, StartRevision: 7, MinRevision: 7}, code: codes.InvalidArgument, says: "a resume"},
		"node snapshot at a rev":    {who: node, req: &curatorv1.WatchRequest{Kind: one(self).Kind, MinRevision: 7}},
		"resume asks no snapshot":   {who: admin, req: &curatorv1.WatchRequest{Kind: all.Kind, StartRevision: 7}},
		"node resumes itself":       {who: node, req: &curatorv1.WatchRequest{Kind: one(self).Kind, StartRevision: 7}},
		"node resumes another one":  {who: node, req: &curatorv1.WatchRequest{Kind: one(other).Kind, StartRevision: 7}, code: codes.PermissionDenied},
		"enrolling watches itself":  {who: enrolling, req: one(self)},
		"enrolling watches another": {who: enrolling, req: one(other), code: codes.PermissionDenied, says: "may watch only itself"},
		"enrolling watches all":     {who: enrolling, req: all, code: codes.PermissionDenied, says: "set node_id=" + self},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			// As the server does: the policy's check on who asks, the
			// request's contract, then the handler.
			err := policy()["/curia.curator.v1.Curator/Watch"].Check(context.Background(), tc.who, tc.req)
			if err == nil {
				err = rpc.ValidateRequest(tc.req)
			}
			st := status.Convert(toStatus(err))
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.says) {
				t.Fatalf("got %v, want %v saying %q", st, tc.code, tc.says)
			}
		})
	}
}
