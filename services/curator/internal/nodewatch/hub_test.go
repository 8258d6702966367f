package nodewatch

// Tests of the watch hub in two tiers: its bookkeeping alone (no etcd), and
// against a real etcd (a consensus process). Watch end to end through
// curator processes is the curator package's watch_test.go.

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/leaktest"
	"curia.dev/platform/proctest"
	"curia.dev/platform/records"
	"curia.dev/platform/rpcerr"
	ct "curia.dev/services/consensus/consensustest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// ---- The hub alone ----

// watchTestHub is a hub with no etcd behind it; etcd is at etcdRev.
func watchTestHub(history int, etcdRev int64) *Hub {
	h := NewHub(nil, Config{History: history}, slog.New(slog.DiscardHandler))
	h.etcdRevision = func(context.Context) (int64, error) { return etcdRev, nil }
	return h
}

// wid is a node id ending in the letter c ("a", "b", ...).
func wid(c string) string { return "node-" + strings.Repeat("0", 31) + c }

func wput(rev int64, c, version string) nodeChange {
	b, err := records.EncodeNode(&curatorv1.Node{Id: wid(c), Status: &curatorv1.NodeStatus{Version: version}})
	if err != nil {
		panic(err)
	}
	return nodeChange{rev: rev, key: keys.Node(wid(c)), value: b}
}

func wdel(rev int64, c string) nodeChange {
	return nodeChange{rev: rev, key: keys.Node(wid(c)), deleted: true}
}

// readResponses is h.read(w) with the responses alone.
func readResponses(h *Hub, w *watcher) ([]*curatorv1.WatchResponse, watchWake, bool) {
	out, wake, behind := h.read(w)
	rs := make([]*curatorv1.WatchResponse, len(out))
	for i, o := range out {
		rs[i] = o.r
	}
	return rs, wake, behind
}

// summary renders responses compactly: "snap@15[a:v2 c:v1]", "@12[a:v2 -b]";
// a node whose record does not decode is "d:unreadable".
func summary(rs []*curatorv1.WatchResponse) []string {
	out := []string{}
	for _, r := range rs {
		var parts []string
		for _, n := range r.Nodes {
			v := n.GetStatus().GetVersion()
			if n.Unreadable != "" {
				v = "unreadable"
			}
			parts = append(parts, fmt.Sprintf("%s:%s", n.Id[len(n.Id)-1:], v))
		}
		for _, d := range r.Deleted {
			parts = append(parts, "-"+d[len(d)-1:])
		}
		s := fmt.Sprintf("@%d[%s]", r.Revision, strings.Join(parts, " "))
		if r.Snapshot {
			s = "snap" + s
		}
		out = append(out, s)
	}
	return out
}

// TestWatchHubRead: what a watcher gets from a hub that loaded {a, b} at
// revision 10 and then saw: 11 a:v1; 12 a:v2 and b deleted (one txn); a
// progress notification to 14; 15 c:v1. The ring holds 3 batches.
func TestWatchHubRead(t *testing.T) {
	tests := map[string]struct {
		more   []nodeChange // applied after the common history
		w      watcher
		want   []string
		behind bool
	}{
		"snapshot": {
			w:    watcher{snapshot: true},
			want: []string{"snap@15[a:v2 c:v1]"},
		},
		"resume from the ring's start": {
			w:    watcher{cursor: 10},
			want: []string{"@11[a:v1]", "@12[a:v2 -b]", "@15[c:v1]"},
		},
		"resume between batches": {
			w:    watcher{cursor: 13},
			want: []string{"@15[c:v1]"},
		},
		"resume at the hub's revision": {
			w:    watcher{cursor: 15},
			want: []string{},
		},
		"resume ahead of the hub waits": {
			w:      watcher{cursor: 16},
			want:   []string{},
			behind: true,
		},
		"resume older than the ring: snapshot": {
			w:    watcher{cursor: 9},
			want: []string{"snap@15[a:v2 c:v1]"},
		},
		"evicted: resume from the old start gets a snapshot": {
			more: []nodeChange{wput(16, "a", "v3")}, // evicts 11
			w:    watcher{cursor: 10},
			want: []string{"snap@16[a:v3 c:v1]"},
		},
		"evicted: resume from the new start": {
			more: []nodeChange{wput(16, "a", "v3")},
			w:    watcher{cursor: 11},
			want: []string{"@12[a:v2 -b]", "@15[c:v1]", "@16[a:v3]"},
		},
		"one node: only its revisions": {
			w:    watcher{node: wid("a"), cursor: 10},
			want: []string{"@11[a:v1]", "@12[a:v2]"},
		},
		"one node: its deletion": {
			w:    watcher{node: wid("b"), cursor: 11},
			want: []string{"@12[-b]"},
		},
		"one node: nothing since": {
			w:    watcher{node: wid("a"), cursor: 12},
			want: []string{},
		},
		"one node: snapshot": {
			w:    watcher{node: wid("c"), snapshot: true},
			want: []string{"snap@15[c:v1]"},
		},
		"one node: snapshot of a node that is gone": {
			w:    watcher{node: wid("b"), snapshot: true},
			want: []string{"snap@15[]"},
		},
		"changes at or below the hub's revision are ignored": {
			more: []nodeChange{wput(15, "a", "again"), wput(3, "b", "old")},
			w:    watcher{cursor: 10},
			want: []string{"@11[a:v1]", "@12[a:v2 -b]", "@15[c:v1]"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := watchTestHub(3, 100)
			if err := h.install(map[string]*curatorv1.Node{
				wid("a"): {Id: wid("a"), Status: &curatorv1.NodeStatus{Version: "v0"}, Revision: 5},
				wid("b"): {Id: wid("b"), Status: &curatorv1.NodeStatus{Version: "v0"}, Revision: 6},
			}, map[string]heartbeatRecord{}, nil, 10); err != nil {
				t.Fatal(err)
			}
			h.apply([]nodeChange{wput(11, "a", "v1"), wput(12, "a", "v2"), wdel(12, "b")})
			h.progress(14)
			h.apply([]nodeChange{wput(15, "c", "v1")})
			h.apply(tc.more)

			w := tc.w
			items, _, behind := readResponses(h, &w)
			got := items
			if !slices.Equal(summary(got), tc.want) || behind != tc.behind {
				t.Fatalf("read = %q, behind %v; want %q, behind %v", summary(got), behind, tc.want, tc.behind)
			}
			for _, r := range got {
				for _, n := range r.Nodes {
					if !r.Snapshot && n.Revision != r.Revision {
						t.Errorf("node %s in the batch at %d has revision %d", n.Id, r.Revision, n.Revision)
					}
				}
			}
			if !behind && w.cursor != h.Revision() {
				t.Fatalf("cursor %d after the read, want the hub's revision %d", w.cursor, h.Revision())
			}
			// The next read has nothing new.
			if again, _, _ := readResponses(h, &w); !behind && len(again) > 0 {
				t.Fatalf("second read = %q", summary(again))
			}
		})
	}
}

// TestWatchHubReload: a new snapshot (after a compaction) restarts the
// ring; watchers behind it get a snapshot, and the revision never goes back.
func TestWatchHubReload(t *testing.T) {
	h := watchTestHub(8, 100)
	if err := h.install(map[string]*curatorv1.Node{}, map[string]heartbeatRecord{}, nil, 10); err != nil {
		t.Fatal(err)
	}
	h.apply([]nodeChange{wput(11, "a", "v1")})
	if err := h.install(map[string]*curatorv1.Node{wid("b"): {Id: wid("b")}}, map[string]heartbeatRecord{}, nil, 20); err != nil {
		t.Fatal(err)
	}
	for cursor, want := range map[int64]string{10: "snap@20[b:]", 11: "snap@20[b:]", 19: "snap@20[b:]", 20: ""} {
		w := watcher{cursor: cursor}
		got, _, _ := readResponses(h, &w)
		if strings.Join(summary(got), " ") != want {
			t.Errorf("from %d: %q, want %q", cursor, summary(got), want)
		}
	}
	if err := h.install(map[string]*curatorv1.Node{}, map[string]heartbeatRecord{}, nil, 19); err == nil || h.Revision() != 20 {
		t.Fatalf("install below the hub's revision: err %v, revision %d", err, h.Revision())
	}
}

// TestWatchSnapshotMessages: a large snapshot is split; only the last
// message carries the revision, only the first says snapshot.
func TestWatchSnapshotMessages(t *testing.T) {
	var nodes []*curatorv1.Node
	for i := range 10 {
		nodes = append(nodes, &curatorv1.Node{Id: fmt.Sprintf("node-%032x", 9-i), Labels: map[string]string{"pad": strings.Repeat("x", 100)}})
	}
	one := proto.Size(nodes[0]) + 8
	tests := map[string]struct {
		max      int
		messages int
	}{
		"fits":               {max: 10 * one, messages: 1},
		"three per message":  {max: 3 * one, messages: 4},
		"bigger than budget": {max: 1, messages: 10},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out := snapshotResponses(slices.Clone(nodes), 42, tc.max)
			if len(out) != tc.messages {
				t.Fatalf("%d messages, want %d", len(out), tc.messages)
			}
			var ids []string
			for i, r := range out {
				last := i == len(out)-1
				if r.Snapshot != (i == 0) || (r.Revision == 42) != last || (!last && r.Revision != 0) {
					t.Fatalf("message %d: snapshot %v revision %d", i, r.Snapshot, r.Revision)
				}
				for _, n := range r.Nodes {
					ids = append(ids, n.Id)
				}
			}
			if len(ids) != 10 || !slices.IsSorted(ids) {
				t.Fatalf("nodes %v", ids)
			}
		})
	}
	if out := snapshotResponses(nil, 7, 100); len(out) != 1 || !out[0].Snapshot || out[0].Revision != 7 {
		t.Fatalf("empty snapshot: %v", out)
	}
}

// TestNewWatcher: a stream starts where its request says: a snapshot
// without a start revision (at min_revision at the least), else a resume
// after it; one node or all of them.
func TestNewWatcher(t *testing.T) {
	all := &curatorv1.WatchRequest_AllNodes{AllNodes: true}
	one := &curatorv1.WatchRequest_NodeId{NodeId: wid("a")}
	tests := map[string]struct {
		req  *curatorv1.WatchRequest
		want watcher
	}{
		"all, a snapshot":          {&curatorv1.WatchRequest{Kind: all}, watcher{snapshot: true}},
		"all, a snapshot at a rev": {&curatorv1.WatchRequest{Kind: all, MinRevision: 7}, watcher{snapshot: true, minRev: 7}},
		"all, a resume":            {&curatorv1.WatchRequest{Kind: all, StartRevision: 7}, watcher{cursor: 7}},
		"one node, a snapshot":     {&curatorv1.WatchRequest{Kind: one, ProgressNotify: true}, watcher{snapshot: true, node: wid("a"), progress: true}},
		"one node, a resume":       {&curatorv1.WatchRequest{Kind: one, StartRevision: 9}, watcher{cursor: 9, node: wid("a")}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			w := newWatcher(tc.req)
			if w.cursor != tc.want.cursor || w.snapshot != tc.want.snapshot || w.minRev != tc.want.minRev || w.node != tc.want.node || w.progress != tc.want.progress {
				t.Fatalf("watcher %+v for %v, want %+v", *w, tc.req, tc.want)
			}
		})
	}
}

// watchServe runs h.serve for w in the background; responses arrive on
// the returned channel, the end on done.
func watchServe(t *testing.T, h *Hub, w *watcher) (<-chan *curatorv1.WatchResponse, <-chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan *curatorv1.WatchResponse, 100)
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		done <- h.serve(ctx, w, func(r *curatorv1.WatchResponse, _ *watchBatch) error { out <- r; return nil })
	}()
	t.Cleanup(func() { cancel(); <-finished })
	return out, done
}

func watchRecv(t *testing.T, ch <-chan *curatorv1.WatchResponse) string {
	t.Helper()
	select {
	case r := <-ch:
		return summary([]*curatorv1.WatchResponse{r})[0]
	case <-time.After(10 * time.Second):
		t.Fatal("no response within 10s")
		return ""
	}
}

// TestWatchHubServe: a stream waits for the hub's first snapshot and for
// the hub to reach its start revision; a revision etcd never reached gets
// a snapshot; the hub's end ends the stream with where to resume.
func TestWatchHubServe(t *testing.T) {
	t.Run("waits for the first snapshot", func(t *testing.T) {
		h := watchTestHub(8, 100)
		out, _ := watchServe(t, h, &watcher{snapshot: true})
		if err := h.install(map[string]*curatorv1.Node{wid("a"): {Id: wid("a")}}, map[string]heartbeatRecord{}, nil, 10); err != nil {
			t.Fatal(err)
		}
		if got := watchRecv(t, out); got != "snap@10[a:]" {
			t.Fatalf("got %s, want the snapshot", got)
		}
		h.apply([]nodeChange{wput(11, "a", "v1")})
		if got := watchRecv(t, out); got != "@11[a:v1]" {
			t.Fatalf("got %s, want @11[a:v1]", got)
		}
	})
	t.Run("waits for the hub to catch up", func(t *testing.T) {
		h := watchTestHub(8, 100) // etcd is at 100: the client's 17 is real
		if err := h.install(map[string]*curatorv1.Node{}, map[string]heartbeatRecord{}, nil, 15); err != nil {
			t.Fatal(err)
		}
		out, _ := watchServe(t, h, &watcher{cursor: 17})
		select {
		case <-h.nudge: // the stream asked for a progress notification
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting stream did not ask for progress")
		}
		h.apply([]nodeChange{wput(16, "a", "seen by the client already")})
		h.progress(18)
		h.apply([]nodeChange{wput(19, "a", "new")})
		if got := watchRecv(t, out); got != "@19[a:new]" {
			t.Fatalf("first response %s, want @19[a:new]", got)
		}
	})
	t.Run("a revision etcd never reached gets a snapshot", func(t *testing.T) {
		h := watchTestHub(8, 16)
		if err := h.install(map[string]*curatorv1.Node{wid("a"): {Id: wid("a")}}, map[string]heartbeatRecord{}, nil, 15); err != nil {
			t.Fatal(err)
		}
		out, _ := watchServe(t, h, &watcher{cursor: 17})
		if got := watchRecv(t, out); got != "snap@15[a:]" {
			t.Fatalf("got %s, want a snapshot", got)
		}
	})
	t.Run("streams share responses", func(t *testing.T) {
		// Every all_nodes stream is sent the same messages; sending
		// marshals them concurrently (run with -race).
		h := watchTestHub(8, 100)
		if err := h.install(map[string]*curatorv1.Node{wid("a"): {Id: wid("a")}}, map[string]heartbeatRecord{}, nil, 10); err != nil {
			t.Fatal(err)
		}
		const streams = 20
		outs := make([]chan *curatorv1.WatchResponse, streams)
		for i := range outs {
			outs[i] = make(chan *curatorv1.WatchResponse, 10)
			ctx, cancel := context.WithCancel(context.Background())
			finished := make(chan struct{})
			go func() {
				defer close(finished)
				err := h.serve(ctx, &watcher{cursor: 10}, func(r *curatorv1.WatchResponse, _ *watchBatch) error {
					if _, err := proto.Marshal(r); err != nil {
						return err
					}
					outs[i] <- r
					return nil
				})
				if err != nil && ctx.Err() == nil {
					t.Errorf("serve: %v", err)
				}
			}()
			t.Cleanup(func() { cancel(); <-finished })
		}
		h.apply([]nodeChange{wput(11, "a", "v1"), wput(11, "b", "v1")})
		h.apply([]nodeChange{wdel(12, "b")})
		var first []*curatorv1.WatchResponse
		for i, out := range outs {
			for k, want := range []string{"@11[a:v1 b:v1]", "@12[-b]"} {
				select {
				case got := <-out:
					if s := summary([]*curatorv1.WatchResponse{got})[0]; s != want {
						t.Fatalf("got %s, want %s", s, want)
					}
					if i == 0 {
						first = append(first, got)
					} else if got != first[k] {
						t.Fatalf("stream %d got its own copy of %s, not the shared message", i, want)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("no %s within 10s", want)
				}
			}
		}
	})
	t.Run("health comes from the heartbeats at the batch's revision", func(t *testing.T) {
		h := watchTestHub(8, 100)
		unknown := curatorv1.NodeHealth_NODE_HEALTH_UNKNOWN
		if err := h.install(map[string]*curatorv1.Node{wid("a"): {Id: wid("a"), Health: unknown}}, map[string]heartbeatRecord{}, nil, 10); err != nil {
			t.Fatal(err)
		}
		beat := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
		stamp := func(d time.Duration) []byte { return []byte(beat.Add(d).Format(time.RFC3339Nano)) }
		// health renders a node's health and last heartbeat (seconds
		// after beat, or "never"): "HEALTHY 2".
		health := func(n *curatorv1.Node) string {
			last := "never"
			if n.GetLastHeartbeat() != nil {
				last = fmt.Sprint(n.GetLastHeartbeat().AsTime().Sub(beat).Seconds())
			}
			return strings.TrimPrefix(n.GetHealth().String(), "NODE_HEALTH_") + " " + last
		}
		inView := func(c string) string {
			h.mu.RLock()
			defer h.mu.RUnlock()
			return health(h.nodes[wid(c)])
		}
		before := h.nodes[wid("a")]
		out, _ := watchServe(t, h, &watcher{node: wid("a"), cursor: 10})
		next := func(want string) {
			t.Helper()
			select {
			case r := <-out:
				if got := summary([]*curatorv1.WatchResponse{r})[0] + " " + health(nodeIn(r, wid("a"))); got != want {
					t.Fatalf("sent %s, want %s", got, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("no %s within 10s", want)
			}
		}
		// The first heartbeat makes the node HEALTHY: a change, sent.
		h.apply([]nodeChange{
			{rev: 11, key: keys.Heartbeat(wid("a")), value: stamp(0)},
			{rev: 11, key: keys.HeartbeatSeen(wid("a")), value: stamp(0)},
		})
		next("@11[a:] HEALTHY 0")
		if before.Health != unknown {
			t.Fatal("the node a stream may be sending was changed in place, not replaced")
		}
		// A later one keeps it HEALTHY: the view moves, nothing is sent.
		h.apply([]nodeChange{
			{rev: 12, key: keys.Heartbeat(wid("a")), value: stamp(2 * time.Second)},
			{rev: 12, key: keys.HeartbeatSeen(wid("a")), value: stamp(2 * time.Second)},
		})
		if got := inView("a"); got != "HEALTHY 2" {
			t.Fatalf("after a second heartbeat: %s in the view", got)
		}
		// A change of the record carries the health; a heartbeat change
		// in the same transaction counts.
		h.apply([]nodeChange{
			wput(13, "a", "v1"),
			{rev: 13, key: keys.Heartbeat(wid("a")), deleted: true},
		})
		next("@13[a:v1] HEARTBEAT_TIMEOUT 2")
		// A node created after its heartbeat keys gets them.
		h.apply([]nodeChange{{rev: 14, key: keys.HeartbeatSeen(wid("b")), value: stamp(0)}})
		h.apply([]nodeChange{wput(15, "b", "v1")})
		if got := inView("b"); got != "HEARTBEAT_TIMEOUT 0" {
			t.Fatalf("node b created after its heartbeat: %s", got)
		}
		// Both keys gone: UNKNOWN, a change.
		h.apply([]nodeChange{{rev: 16, key: keys.HeartbeatSeen(wid("a")), deleted: true}})
		next("@16[a:v1] UNKNOWN never")
		if _, ok := h.health[wid("a")]; ok {
			t.Fatal("the hub keeps a heartbeat record of a node with no heartbeat keys")
		}
	})
	t.Run("progress: a revision alone when nothing watched changed", func(t *testing.T) {
		// On the bubble's clock (testing/synctest): everything below
		// happens at one instant, but for the 50 ms the stream must
		// wait between two progress responses.
		synctest.Test(t, func(t *testing.T) {
			h := watchTestHub(8, 100)
			if err := h.install(map[string]*curatorv1.Node{wid("a"): {Id: wid("a")}}, map[string]heartbeatRecord{}, nil, 10); err != nil {
				t.Fatal(err)
			}
			quiet, _ := watchServe(t, h, &watcher{node: wid("a"), cursor: 10})
			// Sent up to 10 already: no progress is due before the hub
			// moves. (Without sent, a stream that resumes at 10 is sent
			// progress at 10 at once, and whether that or 11 came first
			// was a race between its goroutine and the apply below: CI
			// once got @10.)
			progress, _ := watchServe(t, h, &watcher{node: wid("a"), cursor: 10, sent: 10, progress: true})
			other := func(rev int64) []nodeChange {
				return []nodeChange{{rev: rev, key: keys.Prefix + "audit/x", value: []byte("x")}}
			}
			begun := time.Now()
			h.apply(other(11)) // no node changed
			if got := watchRecv(t, progress); got != "@11[]" {
				t.Fatalf("progress stream got %s, want progress at 11", got)
			}
			// Within the interval, moves are coalesced into one later
			// response at the newest revision; a change comes at once.
			h.apply(other(12))
			h.apply(other(13))
			h.apply([]nodeChange{wput(14, "a", "v1")})
			h.apply(other(15))
			for _, want := range []string{"@14[a:v1]", "@15[]"} {
				if got := watchRecv(t, progress); got != want {
					t.Fatalf("progress stream got %s, want %s", got, want)
				}
			}
			if took := time.Since(begun); took != watchProgressInterval {
				t.Fatalf("the second progress came after %v, want %v", took, watchProgressInterval)
			}
			if got := watchRecv(t, quiet); got != "@14[a:v1]" {
				t.Fatalf("a stream without progress got %s, want only the change", got)
			}
			synctest.Wait()
			select {
			case r := <-quiet:
				t.Fatalf("a stream without progress got %s", summary([]*curatorv1.WatchResponse{r}))
			case r := <-progress:
				t.Fatalf("the progress stream got %s with nothing new", summary([]*curatorv1.WatchResponse{r}))
			default:
			}
		})
	})
	t.Run("the hub's end ends the stream", func(t *testing.T) {
		h := watchTestHub(8, 100)
		if err := h.install(map[string]*curatorv1.Node{}, map[string]heartbeatRecord{}, nil, 15); err != nil {
			t.Fatal(err)
		}
		out, done := watchServe(t, h, &watcher{snapshot: true})
		watchRecv(t, out)
		h.stopOnce.Do(func() { close(h.stopped) })
		select {
		case err := <-done:
			st := status.Convert(rpcerr.ToStatus(context.Background(), nil, "test", err))
			if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "start_revision=15") {
				t.Fatalf("stream ended with %v", st)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("stream still runs")
		}
	})
}

// minRevisionWatcher is an admin's all_nodes watcher asking for a snapshot
// at least at min.
func minRevisionWatcher(t *testing.T, min int64) *watcher {
	t.Helper()
	return newWatcher(&curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_AllNodes{AllNodes: true}, MinRevision: min})
}

// watchRefused waits for a stream that must fail before it sent anything,
// and returns how it failed.
func watchRefused(t *testing.T, out <-chan *curatorv1.WatchResponse, done <-chan error) *status.Status {
	t.Helper()
	select {
	case r := <-out:
		t.Fatalf("sent %s, want no response", summary([]*curatorv1.WatchResponse{r})[0])
	case err := <-done:
		return status.Convert(rpcerr.ToStatus(context.Background(), nil, "test", err))
	case <-time.After(30 * time.Second):
		t.Fatal("the stream neither answered nor failed within 30s")
	}
	return nil
}

// TestWatchHubMinRevision: a snapshot asked for with min_revision M is
// never older than M. Here the hub lags: it follows no etcd and is moved
// by hand. A stream behind M asks etcd for progress and sends nothing
// until the hub reaches M; a hub that does not get there within the bound
// refuses the stream, saying where it is.
func TestWatchHubMinRevision(t *testing.T) {
	// lagging is a hub at revision 10 holding node a; etcd is at etcdRev.
	lagging := func(t *testing.T, etcdRev int64) *Hub {
		h := watchTestHub(8, etcdRev)
		if err := h.install(map[string]*curatorv1.Node{wid("a"): {Id: wid("a"), Revision: 5}}, map[string]heartbeatRecord{}, nil, 10); err != nil {
			t.Fatal(err)
		}
		return h
	}
	t.Run("the hub has reached it", func(t *testing.T) {
		for _, min := range []int64{5, 10} {
			out, _ := watchServe(t, lagging(t, 20), minRevisionWatcher(t, min))
			if got := watchRecv(t, out); got != "snap@10[a:]" {
				t.Fatalf("min_revision %d: got %s, want snap@10[a:]", min, got)
			}
		}
	})
	t.Run("waits for the hub to reach it", func(t *testing.T) {
		h := lagging(t, 12)
		h.minRevisionWait = time.Minute // the test moves the hub
		out, done := watchServe(t, h, minRevisionWatcher(t, 12))
		select {
		case <-h.nudge: // the stream asked for a progress notification
		case r := <-out:
			t.Fatalf("sent %s from a view at revision 10, below min_revision 12", summary([]*curatorv1.WatchResponse{r})[0])
		case err := <-done:
			t.Fatalf("stream ended: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("the stream neither asked for progress nor answered")
		}
		h.apply([]nodeChange{wput(11, "b", "v1")}) // still behind
		h.apply([]nodeChange{wput(12, "c", "v1")})
		if got := watchRecv(t, out); got != "snap@12[a: b:v1 c:v1]" {
			t.Fatalf("first response %s, want the snapshot at 12 with c, created at 12", got)
		}
		h.apply([]nodeChange{wput(13, "a", "v1")})
		if got := watchRecv(t, out); got != "@13[a:v1]" {
			t.Fatalf("then %s, want @13[a:v1]", got)
		}
	})
	t.Run("refused after the bound", func(t *testing.T) {
		// On the bubble's clock (testing/synctest): the real bound, not
		// before it, at no cost.
		synctest.Test(t, func(t *testing.T) {
			h := lagging(t, 12)
			begun := time.Now()
			out, done := watchServe(t, h, minRevisionWatcher(t, 12))
			st := watchRefused(t, out, done)
			if waited := time.Since(begun); waited < watchMinRevisionWait {
				t.Fatalf("refused after %v, before the bound %v", waited, watchMinRevisionWait)
			}
			for _, says := range []string{"at revision 10", "min_revision 12", "any replica"} {
				if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), says) {
					t.Fatalf("stream ended with %v, want Unavailable saying %q", st, says)
				}
			}
		})
	})
	t.Run("above etcd's revision", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := lagging(t, 11)
			out, done := watchServe(t, h, minRevisionWatcher(t, 50))
			st := watchRefused(t, out, done)
			for _, says := range []string{"min_revision 50", "etcd itself is at revision 11"} {
				if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), says) {
					t.Fatalf("stream ended with %v, want Unavailable saying %q", st, says)
				}
			}
		})
	})
	t.Run("the bound covers the first load", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := watchTestHub(8, 12) // never loads
			begun := time.Now()
			out, done := watchServe(t, h, minRevisionWatcher(t, 12))
			if st := watchRefused(t, out, done); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "min_revision 12") {
				t.Fatalf("stream ended with %v, want Unavailable", st)
			}
			if waited := time.Since(begun); waited < watchMinRevisionWait {
				t.Fatalf("refused after %v, before the bound %v", waited, watchMinRevisionWait)
			}
		})
	})
}

// ---- The hub against a real etcd ----

// TestWatchHubEtcd runs the hub on a real etcd: it follows node writes,
// catches up to a revision that changed no node (progress notifications),
// and after its watch's start revision was compacted it loads a new
// snapshot, which watchers behind it get.
func TestWatchHubEtcd(t *testing.T) {
	cc := ct.NewCluster(t)
	voters, _ := cc.Voters(1)
	cli := cc.Etcd(voters[0].ClientURL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h := NewHub(cli, Config{}, slog.New(slog.DiscardHandler))
	put := func(c, version string) int64 {
		t.Helper()
		v := wput(0, c, version)
		resp, err := cli.Put(ctx, v.key, string(v.value))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	start := func() (stop func()) {
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- h.Run(rctx) }()
		return func() {
			rcancel()
			if err := <-done; err != nil {
				t.Errorf("hub: %v", err)
			}
		}
	}
	// waitRev waits until the hub is complete up to rev.
	waitRev := func(rev int64) {
		t.Helper()
		proctest.Eventually(t, 30*time.Second, func() error {
			if got := h.Revision(); got < rev {
				h.requestProgress()
				return fmt.Errorf("hub at revision %d, want %d", got, rev)
			}
			return nil
		})
	}

	put("a", "v0")
	stop := start()
	w := &watcher{snapshot: true}
	waitRev(put("a", "v1"))
	got, _, _ := readResponses(h, w)
	if s := summary(got); len(s) != 1 || !strings.HasPrefix(s[0], "snap@") || !strings.HasSuffix(s[0], "[a:v1]") {
		t.Fatalf("first read %q", s)
	}
	r2 := put("b", "v1")
	del, err := cli.Delete(ctx, keys.Node(wid("a")))
	if err != nil {
		t.Fatal(err)
	}
	r3 := del.Header.Revision
	waitRev(r3)
	got, _, _ = readResponses(h, w)
	if s, want := summary(got), []string{fmt.Sprintf("@%d[b:v1]", r2), fmt.Sprintf("@%d[-a]", r3)}; !slices.Equal(s, want) {
		t.Fatalf("updates %q, want %q", s, want)
	}

	// A revision that changed no node: the hub reaches it through progress
	// notifications alone.
	other, err := cli.Put(ctx, keys.Prefix+"test/not-a-node", "x")
	if err != nil {
		t.Fatal(err)
	}
	waitRev(other.Header.Revision)
	stop()

	// While the hub is away, nodes change and etcd compacts past the
	// revision the hub would watch from.
	behind := h.Revision()
	put("c", "v1")
	last := put("b", "v2")
	if _, err := cli.Compact(ctx, last, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	stop = start()
	defer stop()
	waitRev(last)
	w = &watcher{cursor: behind}
	got, _, _ = readResponses(h, w)
	if s := summary(got); len(s) != 1 || s[0] != fmt.Sprintf("snap@%d[b:v2 c:v1]", h.Revision()) {
		t.Fatalf("after the compaction %q, want a snapshot of b:v2 c:v1", s)
	}

	// etcd goes away and comes back: the hub watches again from where it
	// was, and a watcher gets each change once.
	voters[0].Kill()
	voters[0].Start()
	proctest.Eventually(t, time.Minute, func() error {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		defer pcancel()
		_, err := cli.Get(pctx, keys.NodesPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err
	})
	r4 := put("c", "v2")
	r5 := put("b", "v3")
	waitRev(r5)
	got, _, _ = readResponses(h, w)
	if s, want := summary(got), []string{fmt.Sprintf("@%d[c:v2]", r4), fmt.Sprintf("@%d[b:v3]", r5)}; !slices.Equal(s, want) {
		t.Fatalf("after etcd restarted %q, want %q", s, want)
	}
}

// TestWatchHubEtcdMinRevision: on a real etcd, a hub that lags (it loaded
// its view and does not follow etcd yet) does not serve that view to a
// stream asking for a snapshot at a newer revision: the stream waits until
// the hub follows etcd up to it, and then gets the node created there. A
// hub that stays behind, or a revision etcd has not reached, fails the
// stream after the bound.
func TestWatchHubEtcdMinRevision(t *testing.T) {
	cc := ct.NewCluster(t)
	voters, _ := cc.Voters(1)
	cli := cc.Etcd(voters[0].ClientURL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	put := func(c, version string) int64 {
		t.Helper()
		v := wput(0, c, version)
		resp, err := cli.Put(ctx, v.key, string(v.value))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	// lagging is a hub that loaded the nodes and follows nothing.
	lagging := func() *Hub {
		t.Helper()
		h := NewHub(cli, Config{}, slog.New(slog.DiscardHandler))
		if err := h.load(ctx); err != nil {
			t.Fatal(err)
		}
		return h
	}

	put("a", "v0")
	h := lagging()
	h.minRevisionWait = time.Minute // the test decides when the hub follows
	loaded := h.Revision()
	rb := put("b", "v1")
	out, done := watchServe(t, h, minRevisionWatcher(t, rb))
	select {
	case <-h.nudge:
	case r := <-out:
		t.Fatalf("sent %s from the hub's view at %d, below min_revision %d", summary([]*curatorv1.WatchResponse{r})[0], loaded, rb)
	case err := <-done:
		t.Fatalf("stream ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the stream neither asked for progress nor answered")
	}
	// The hub starts following etcd: it catches up, the snapshot follows.
	rctx, rcancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- h.Run(rctx) }()
	defer func() {
		rcancel()
		if err := <-stopped; err != nil {
			t.Errorf("hub: %v", err)
		}
	}()
	select {
	case r := <-out:
		if !r.Snapshot || r.Revision < rb || nodeIn(r, wid("b")).GetStatus().GetVersion() != "v1" || nodeIn(r, wid("a")) == nil {
			t.Fatalf("got %s, want a snapshot at %d or later with a and b:v1", summary([]*curatorv1.WatchResponse{r})[0], rb)
		}
	case err := <-done:
		t.Fatalf("stream ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no snapshot within 30s of the hub following etcd")
	}

	t.Run("a hub that stays behind", func(t *testing.T) {
		held := lagging()
		held.minRevisionWait = 500 * time.Millisecond
		rc := put("c", "v1")
		out, done := watchServe(t, held, minRevisionWatcher(t, rc))
		st := watchRefused(t, out, done)
		for _, says := range []string{fmt.Sprintf("at revision %d", held.Revision()), fmt.Sprintf("min_revision %d", rc)} {
			if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), says) {
				t.Fatalf("stream ended with %v, want Unavailable saying %q", st, says)
			}
		}
	})
	t.Run("a revision etcd has not reached", func(t *testing.T) {
		h.minRevisionWait = 500 * time.Millisecond
		now := put("a", "v1")
		out, done := watchServe(t, h, minRevisionWatcher(t, now+1000))
		st := watchRefused(t, out, done)
		if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), fmt.Sprintf("min_revision %d", now+1000)) || !strings.Contains(st.Message(), "etcd itself is at revision") {
			t.Fatalf("stream ended with %v, want Unavailable saying etcd is behind min_revision", st)
		}
	})
}

// errorCount counts the error records logged through it.
type errorCount struct{ n atomic.Int32 }

func (c *errorCount) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (c *errorCount) Handle(context.Context, slog.Record) error    { c.n.Add(1); return nil }
func (c *errorCount) WithAttrs([]slog.Attr) slog.Handler           { return c }
func (c *errorCount) WithGroup(string) slog.Handler                { return c }

// TestWatchHubEtcdUnreadable: a node record that does not decode, or that
// holds another node, is a node that exists: the hub shows it (id from the
// key, its revision, why it is unreadable) in snapshots and batches, never
// leaves it out; its deletion is a normal delete. Each unreadable revision
// is logged once, also across reloads.
func TestWatchHubEtcdUnreadable(t *testing.T) {
	cc := ct.NewCluster(t)
	voters, _ := cc.Voters(1)
	cli := cc.Etcd(voters[0].ClientURL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	errs := &errorCount{}
	h := NewHub(cli, Config{}, slog.New(errs))
	putRaw := func(c string, value []byte) int64 {
		t.Helper()
		resp, err := cli.Put(ctx, keys.Node(wid(c)), string(value))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	put := func(c, version string) int64 { t.Helper(); return putRaw(c, wput(0, c, version).value) }
	garbage := []byte("not a node record")
	unreadable := func(r *curatorv1.WatchResponse, c string, rev int64, says string) {
		t.Helper()
		n := nodeIn(r, wid(c))
		if n == nil || n.Revision != rev || !strings.Contains(n.Unreadable, says) {
			t.Fatalf("node %s in %v: want it at revision %d, unreadable saying %q", c, r, rev, says)
		}
	}

	put("a", "v0")
	rd := putRaw("d", garbage)
	re := putRaw("e", wput(0, "a", "v0").value) // node a's record under e's key
	// Loaded twice: a reload does not log the same records again.
	for range 2 {
		if err := h.load(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w := &watcher{snapshot: true}
	got, _, _ := readResponses(h, w)
	if s := summary(got); len(s) != 1 || s[0] != fmt.Sprintf("snap@%d[a:v0 d:unreadable e:unreadable]", h.Revision()) {
		t.Fatalf("snapshot %q, want a:v0 and d, e unreadable", s)
	}
	snap := got[0]
	unreadable(snap, "d", rd, "decode")
	unreadable(snap, "e", re, wid("a"))
	if n := errs.n.Load(); n != 2 {
		t.Fatalf("%d errors logged for two unreadable records, loaded twice; want 2", n)
	}
	// Health comes from heartbeats, which an unreadable node may still send.
	if n := nodeIn(snap, wid("d")); n.GetHealth() != curatorv1.NodeHealth_NODE_HEALTH_UNKNOWN || n.GetUnreadable() == "" {
		t.Fatalf("unreadable node d: %v", n)
	}

	rctx, rcancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- h.Run(rctx) }()
	defer func() {
		rcancel()
		if err := <-stopped; err != nil {
			t.Errorf("hub: %v", err)
		}
	}()
	waitRev := func(rev int64) {
		t.Helper()
		proctest.Eventually(t, 30*time.Second, func() error {
			if got := h.Revision(); got < rev {
				h.requestProgress()
				return fmt.Errorf("hub at revision %d, want %d", got, rev)
			}
			return nil
		})
	}
	rf := putRaw("f", garbage)    // a new unreadable node
	rd2 := put("d", "v1")         // d is readable again
	rf2 := putRaw("f", []byte{0}) // f unreadable at a new revision
	del, err := cli.Delete(ctx, keys.Node(wid("e")))
	if err != nil {
		t.Fatal(err)
	}
	rde := del.Header.Revision
	waitRev(rde)
	got, _, _ = readResponses(h, w)
	want := []string{fmt.Sprintf("@%d[f:unreadable]", rf), fmt.Sprintf("@%d[d:v1]", rd2), fmt.Sprintf("@%d[f:unreadable]", rf2), fmt.Sprintf("@%d[-e]", rde)}
	if s := summary(got); !slices.Equal(s, want) {
		t.Fatalf("batches %q, want %q", s, want)
	}
	unreadable(got[0], "f", rf, "decode")
	unreadable(got[2], "f", rf2, "decode")
	if n := errs.n.Load(); n != 4 {
		t.Fatalf("%d errors logged, want 4 (d, e, and f at two revisions)", n)
	}
	got, _, _ = readResponses(h, &watcher{snapshot: true})
	if s := summary(got); len(s) != 1 || s[0] != fmt.Sprintf("snap@%d[a:v0 d:v1 f:unreadable]", h.Revision()) {
		t.Fatalf("snapshot %q", s)
	}
}

// TestWatchHubNodesAtSortedIDs: nodesAt answers every node in id order,
// with the hub's current nodes, whether it sorts or uses the ids it kept:
// a node that comes or goes (a put of a new id, a delete, a new snapshot)
// sorts again; a change of a node under its id keeps the ids but answers
// the new node.
func TestWatchHubNodesAtSortedIDs(t *testing.T) {
	h := watchTestHub(8, 10)
	if err := h.install(map[string]*curatorv1.Node{wid("c"): {Id: wid("c")}, wid("a"): {Id: wid("a")}}, map[string]heartbeatRecord{}, nil, 10); err != nil {
		t.Fatal(err)
	}
	at := func() string {
		t.Helper()
		nodes, _, err := h.NodesAt(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, n := range nodes {
			out = append(out, n.Id[len(n.Id)-1:]+":"+n.GetStatus().GetVersion())
		}
		return strings.Join(out, " ")
	}
	steps := []struct {
		change []nodeChange
		want   string
	}{
		{nil, "a: c:"}, // sorted, ids kept
		{nil, "a: c:"}, // from the kept ids
		{[]nodeChange{wput(11, "a", "v1")}, "a:v1 c:"},      // same ids, new node
		{[]nodeChange{wput(12, "b", "v1")}, "a:v1 b:v1 c:"}, // a new id
		{[]nodeChange{wdel(13, "a")}, "b:v1 c:"},            // a deleted id
		{[]nodeChange{wdel(14, "x")}, "b:v1 c:"},            // deleting none
		{[]nodeChange{wput(15, "0", "v1")}, "0:v1 b:v1 c:"}, // first in order
	}
	for i, s := range steps {
		h.apply(s.change)
		if got := at(); got != s.want {
			t.Fatalf("step %d: nodesAt %q, want %q", i, got, s.want)
		}
		if got := at(); got != s.want { // again, from the kept ids
			t.Fatalf("step %d, again: nodesAt %q, want %q", i, got, s.want)
		}
	}
	if err := h.install(map[string]*curatorv1.Node{wid("d"): {Id: wid("d")}}, map[string]heartbeatRecord{}, nil, 20); err != nil {
		t.Fatal(err)
	}
	if got := at(); got != "d:" {
		t.Fatalf("after a new snapshot: nodesAt %q, want %q", got, "d:")
	}
}

// TestWatchHubNodesAtConcurrent: reads that sort and keep ids race with
// nodes coming and going (for go test -race); every read is sorted, and
// has every node created before it began that is never deleted.
func TestWatchHubNodesAtConcurrent(t *testing.T) {
	h := watchTestHub(64, 10)
	if err := h.install(map[string]*curatorv1.Node{wid("a"): {Id: wid("a")}}, map[string]heartbeatRecord{}, nil, 10); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				nodes, _, err := h.NodesAt(ctx, 0)
				if err != nil {
					return
				}
				if !slices.IsSortedFunc(nodes, func(a, b *curatorv1.Node) int { return strings.Compare(a.Id, b.Id) }) || nodes[0].Id != wid("a") {
					t.Errorf("nodesAt: not sorted, or without node a: %d nodes", len(nodes))
					return
				}
			}
		})
	}
	for i := range 300 {
		c := fmt.Sprintf("b%03d", i)
		h.apply([]nodeChange{wput(int64(11+2*i), c, "v1")})
		if i%3 == 0 {
			h.apply([]nodeChange{wdel(int64(12+2*i), c)})
		} else {
			h.apply([]nodeChange{wput(int64(12+2*i), "a", fmt.Sprint(i))})
		}
	}
	cancel()
	wg.Wait()
	nodes, _, err := h.NodesAt(context.Background(), 0)
	if err != nil || len(nodes) != 201 {
		t.Fatalf("after the changes: %d nodes, %v; want 201", len(nodes), err)
	}
}

func nodeIn(r *curatorv1.WatchResponse, id string) *curatorv1.Node {
	for _, n := range r.Nodes {
		if n.Id == id {
			return n
		}
	}
	return nil
}
