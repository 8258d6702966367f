// Package nodewatch is what every curator replica knows of the nodes as
// they change, and what the leader knows of their heartbeats:
//
//   - the watch hub (Hub): one etcd watch per replica over the node records
//     and the heartbeat shards, fanned out to every Watch stream the
//     replica serves, and the view GetNodes, ListNodes and the consensus
//     status answer from (NodesAt, CurrentNodes);
//   - the heartbeat tracker (Tracker): the leader's record of every node's
//     beats, in memory, written to etcd in shards; the hub derives each
//     node's health from them, so the leader decides and every replica
//     serves the decision.
//
// The two meet in etcd and in one lookup: the tracker asks the hub whether
// a node exists (Tracking.Registered), so that it drops the beats of
// deleted nodes. The hub gets the etcd client; the tracker the client and
// the leadership's term-guarded Txn. The Curator RPCs (Watch, Heartbeat)
// stay the curator's: it checks who calls, then hands the stream over.
//
// Files: hub.go (the hub, the Watch stream's contract), beats.go (the
// tracker, the shards' format, health from them).
package nodewatch

// The watch hub: one etcd watch per replica, fanned out to every Watch
// stream the replica serves, and the view GetNodes answers from.
//
//	etcd ── one Watch(/curia/, from rev+1, require leader) ──▶ Hub.Run
//	                                                             │ apply, under mu
//	                                  ┌──────────────────────────▼───────────────────────┐
//	                                  │ nodes  every node at rev, its health filled in   │
//	                                  │        from the heartbeat shards at rev          │
//	                                  │ ring   one batch per node-changing revision,     │
//	                                  │        every change in (oldest, rev]             │
//	                                  │ changed  closed and replaced on every advance    │
//	                                  └──────────────────────────┬───────────────────────┘
//	                                      read(cursor) under RLock│ (no I/O under the lock)
//	              ┌────────────────────────┬─────────────────────┴────┐
//	           stream 1                 stream 2        …          stream N
//	           cursor, node filter      cursor                     cursor
//
// Each stream owns only a cursor (the revision it has been sent up to) and
// reads the ring itself, so the hub never waits for a stream and a stream
// costs no buffer of its own: the ring is the one buffer all streams share.
// A stream whose cursor falls behind the ring's oldest revision (a slow
// consumer, or a client resuming from an old revision) is resynced in-band
// with a snapshot (snapshot=true: the client replaces its view) instead of
// being closed: it would have to reconnect for the same snapshot anyway.
//
// Revisions are etcd revisions, identical on every replica, so a client may
// resume on any replica with the revision of the last response it saw;
// Watch is therefore served by whichever replica the client reached
// (the curator's localMethods), not forwarded to the leader.
//
// Wire contract of a stream (curia.curator.v1.WatchResponse):
//   - start_revision 0, or a revision the ring no longer holds (or one etcd
//     never reached): first a snapshot, snapshot=true, revision = the hub's
//     revision. A snapshot larger than watchMaxMessageBytes comes in several
//     messages: the first has snapshot=true, the following ones add nodes,
//     and all but the last carry revision 0 ("not at a revision yet: resume
//     from 0"); the last carries the snapshot's revision.
//   - start_revision 0 with min_revision M > 0: the snapshot's revision is
//     at least M, never older. A replica whose hub is behind M asks etcd for
//     progress and waits up to watchMinRevisionWait (its first load
//     included), then fails the stream UNAVAILABLE before sending anything
//     (retry, any replica) — also when etcd itself has not reached M.
//     min_revision < 0, or with start_revision > 0, is INVALID_ARGUMENT.
//   - then one response per etcd revision that changed a watched node, in
//     order, each exactly once: nodes put, ids deleted. A node_id watcher
//     gets only the revisions that changed its node.
//   - start_revision R > 0 within the ring: no snapshot, every change after
//     R. A replica whose hub has not reached R yet waits until it has.
//   - every record under nodes/<id> is a node, in snapshots and batches
//     alike: one that does not decode, or that holds another node, comes as
//     {id: <id>, revision, unreadable: why} — it exists, and must never look
//     deleted (the reconciler removes the etcd member of a node that does
//     not exist). Only a delete of the key is a deletion.
//   - every node carries its health and last heartbeat as of the
//     response's revision, from the leader's heartbeat shards
//     (beats.go). A change of health is sent; a shard write that only
//     moves a node's last heartbeat sends nothing: the node's next change,
//     or a snapshot, shows it.

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/backoff"
	"curia.dev/platform/keys"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
	"curia.dev/platform/run"
	"curia.dev/services/curator/internal/nodestore"
)

const (
	// defaultWatchHistory is how many node-changing revisions the hub keeps
	// for resuming watchers by default: minutes of churn in a cluster of
	// thousands of nodes, at a few hundred bytes a batch.
	defaultWatchHistory = 4096
	// watchMaxMessageBytes bounds one snapshot message, well under gRPC's
	// default 4 MiB receive limit.
	watchMaxMessageBytes = 2 << 20
	// watchProgressInterval is the least time between two progress
	// responses to a stream (WatchRequest.progress_notify).
	watchProgressInterval = 50 * time.Millisecond
	// watchNudgeInterval is how often a stream waiting for the hub to reach
	// its start revision or min_revision asks etcd for a progress
	// notification.
	watchNudgeInterval = 200 * time.Millisecond
	// watchMinRevisionWait bounds how long a stream waits for the hub to
	// reach its min_revision before it is refused. A healthy hub gets there
	// within a progress round trip; one that does not in this long lags or
	// is cut off from etcd, and the client does better on another replica
	// than waiting here.
	watchMinRevisionWait = 5 * time.Second
	// watchEtcdRevisionTimeout bounds the read of etcd's revision that
	// tells a refused client whether etcd itself is behind its
	// min_revision: the refusal must not hang on an etcd that is away.
	watchEtcdRevisionTimeout = time.Second
	// watchBackoffMin and watchBackoffMax bound the wait before the hub
	// watches etcd again after an error.
	watchBackoffMin = 100 * time.Millisecond
	watchBackoffMax = 5 * time.Second
)

// Config sizes the watch hub.
type Config struct {
	// History is how many recent node-changing revisions the hub keeps, so
	// that watchers resume without a snapshot (0: defaultWatchHistory).
	History int
}

// AddFlags registers the watch hub's flags.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	if c.History <= 0 {
		c.History = defaultWatchHistory
	}
	fs.Var((*positiveInt)(&c.History), "watch-history", "node-changing revisions each replica keeps for resuming Watch streams; older resumes get a snapshot")
}

// positiveInt is an int flag that refuses values below 1.
type positiveInt int

func (p *positiveInt) String() string { return strconv.Itoa(int(*p)) }

func (p *positiveInt) Set(s string) error {
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		return fmt.Errorf("%q is not a positive integer", s)
	}
	*p = positiveInt(v)
	return nil
}

// watchBatch is what one etcd revision changed among the nodes.
type watchBatch struct {
	rev int64
	// all is the batch as an all_nodes watcher gets it. It is shared by
	// every stream and never changed.
	all *curatorv1.WatchResponse

	// encoded is all marshalled, by the first stream that sends it, for
	// every other (encode).
	encodeOnce sync.Once
	encoded    *rpc.Encoded
	encodeErr  error
}

// encode is the batch's all, marshalled once for every stream that sends
// it: a change watched by a thousand all_nodes streams costs one marshal,
// not a thousand.
func (b *watchBatch) encode() (*rpc.Encoded, error) {
	b.encodeOnce.Do(func() { b.encoded, b.encodeErr = rpc.Encode(b.all) })
	return b.encoded, b.encodeErr
}

// forNode is the batch as a watcher of node id gets it; nil if the
// Revision did not touch that node.
func (b *watchBatch) forNode(id string) *curatorv1.WatchResponse {
	if id == "" {
		return b.all
	}
	for _, n := range b.all.Nodes {
		if n.Id == id {
			return &curatorv1.WatchResponse{Nodes: []*curatorv1.Node{n}, Revision: b.rev}
		}
	}
	if slices.Contains(b.all.Deleted, id) {
		return &curatorv1.WatchResponse{Deleted: []string{id}, Revision: b.rev}
	}
	return nil
}

// batchRing is a fixed-size ring of batches in revision order.
type batchRing struct {
	buf   []*watchBatch
	start int // index of the oldest batch
	n     int
}

func newBatchRing(size int) batchRing { return batchRing{buf: make([]*watchBatch, size)} }

// push appends b and returns the batch it evicted, if the ring was full.
func (r *batchRing) push(b *watchBatch) (evicted *watchBatch) {
	if r.n == len(r.buf) {
		evicted = r.buf[r.start]
		r.buf[r.start] = b
		r.start = (r.start + 1) % len(r.buf)
		return evicted
	}
	r.buf[(r.start+r.n)%len(r.buf)] = b
	r.n++
	return nil
}

// at returns the i-th oldest batch.
func (r *batchRing) at(i int) *watchBatch { return r.buf[(r.start+i)%len(r.buf)] }

// after returns the index of the first batch with a revision above rev.
func (r *batchRing) after(rev int64) int {
	lo, hi := 0, r.n
	for lo < hi {
		mid := (lo + hi) / 2
		if r.at(mid).rev <= rev {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

func (r *batchRing) reset() {
	clear(r.buf)
	r.start, r.n = 0, 0
}

// Hub holds this replica's view of the nodes, kept current by one etcd
// watch, and serves every Watch stream from it.
type Hub struct {
	etcd *clientv3.Client
	log  *slog.Logger

	mu sync.RWMutex
	// ready is set by the first snapshot.
	ready bool
	// rev is the revision the hub's view is complete up to: every change
	// of a node at or below rev is applied. It only grows.
	rev int64
	// oldest is the revision from which ring holds every change: all
	// changes in (oldest, rev] are in the ring.
	oldest int64
	// nodes is every node at rev, with its health and last heartbeat
	// (from health) filled in. A node in it is never changed: a change
	// of its heartbeats replaces it with a copy, so that streams may send
	// it outside the lock.
	nodes map[string]*curatorv1.Node
	// ids is the ids of nodes, sorted, for the reads that answer nodes in
	// id order (nodesAt): kept from one read to the next while no node
	// comes or goes (a heartbeat replaces a node under its id), nil when
	// one did since. idsGen counts those changes: a read that sorted
	// outside the lock keeps its ids only if none happened meanwhile.
	ids    []string
	idsGen uint64
	// health is every node's heartbeats at rev: its line in a shard, and
	// the per-node keys of older curators.
	health map[string]heartbeatRecord
	// shards is the ids of every heartbeat shard at rev, by key: what a
	// new value of the shard no longer holds.
	shards map[string][]string
	ring   batchRing
	// changed is closed and replaced whenever a batch joins the ring or a
	// snapshot is installed: what wakes streams that are up to date.
	// advanced is closed and replaced whenever rev moves at all (every
	// write of curia's): what wakes those waiting for a revision.
	changed, advanced chan struct{}

	// nudge asks the watch loop for a progress notification: a stream
	// waits for the hub to reach its start revision.
	nudge chan struct{}
	// stopped is closed when run returns.
	stopped  chan struct{}
	stopOnce sync.Once

	// unreadable is the revision at which each unreadable node record (by
	// key) was logged, so that a reload does not log it again. Only decode
	// and the watch loop (load, apply) use it, one at a time.
	unreadable map[string]int64

	// etcdRevision reads etcd's current revision (a linearizable read).
	etcdRevision func(context.Context) (int64, error)
	// minRevisionWait is watchMinRevisionWait (tests shorten it).
	minRevisionWait time.Duration
	// OnLoad, if set, is called after every snapshot load (the service's
	// readiness: the hub can answer).
	OnLoad func()
}

func NewHub(etcd *clientv3.Client, cfg Config, log *slog.Logger) *Hub {
	history := cfg.History
	if history <= 0 {
		history = defaultWatchHistory
	}
	h := &Hub{
		etcd:    etcd,
		log:     log.With("part", "watch"),
		nodes:   map[string]*curatorv1.Node{},
		health:  map[string]heartbeatRecord{},
		shards:  map[string][]string{},
		ring:    newBatchRing(history),
		changed: make(chan struct{}),

		advanced: make(chan struct{}),
		nudge:    make(chan struct{}, 1),
		stopped:  make(chan struct{}),

		unreadable:      map[string]int64{},
		minRevisionWait: watchMinRevisionWait,
	}
	h.etcdRevision = func(ctx context.Context) (int64, error) {
		// Any key's read says; this one never exists, so it reads nothing.
		resp, err := etcd.Get(ctx, keys.Prefix)
		if err != nil {
			return 0, fmt.Errorf("read etcd's revision: %w", err)
		}
		return resp.Header.Revision, nil
	}
	return h
}

// run keeps the hub current until ctx ends: it loads a snapshot, follows
// etcd from there, and on errors watches again from where it stopped (or,
// when etcd compacted that revision away, loads a new snapshot).
func (h *Hub) Run(ctx context.Context) error {
	defer h.stopOnce.Do(func() { close(h.stopped) })
	bo := backoff.New(watchBackoffMin, watchBackoffMax)
	h.mu.RLock()
	resnapshot := !h.ready // else carry on from the view we have
	h.mu.RUnlock()
	for ctx.Err() == nil {
		if resnapshot {
			if err := h.load(ctx); err != nil {
				wait := bo.Next()
				if ctx.Err() == nil {
					h.log.Warn("load nodes for the watch hub", "err", err, "retry_in", wait)
				}
				run.Sleep(ctx, wait)
				continue
			}
			resnapshot = false
		}
		progressed, err := h.follow(ctx)
		if ctx.Err() != nil {
			break
		}
		if progressed {
			bo.Reset()
		}
		var compacted *watchCompacted
		if errors.As(err, &compacted) {
			h.log.Warn("node watch fell behind etcd's compaction; reloading a snapshot", "revision", h.Revision(), "compact_revision", compacted.rev)
			resnapshot = true
			continue
		}
		wait := bo.Next()
		h.log.Warn("node watch ended; watching again", "err", err, "revision", h.Revision(), "retry_in", wait)
		run.Sleep(ctx, wait)
	}
	return nil
}

// watchCompacted reports that the watch's start revision was compacted.
type watchCompacted struct{ rev int64 }

func (e *watchCompacted) Error() string {
	return fmt.Sprintf("etcd compacted revisions up to %d", e.rev)
}

// load reads every node and its heartbeats at one revision and makes them
// the hub's view. The ring restarts there: streams behind it get a
// snapshot.
func (h *Hub) load(ctx context.Context) error {
	nodes := map[string]*curatorv1.Node{}
	rev, err := nodestore.ScanRange(ctx, h.etcd, keys.NodesPrefix, 0, func(kv *mvccpb.KeyValue) error {
		n := h.decode(string(kv.Key), kv.Value, kv.ModRevision)
		nodes[n.Id] = n
		return nil
	})
	if err != nil {
		return err
	}
	health := map[string]heartbeatRecord{}
	for _, prefix := range []string{keys.HeartbeatsPrefix, keys.HeartbeatsSeenPrefix} {
		_, err := nodestore.ScanRange(ctx, h.etcd, prefix, rev, func(kv *mvccpb.KeyValue) error {
			id := strings.TrimPrefix(string(kv.Key), prefix)
			health[id] = health[id].with(string(kv.Key), kv.Value, false)
			return nil
		})
		if err != nil {
			return err
		}
	}
	shards := map[string][]string{}
	_, err = nodestore.ScanRange(ctx, h.etcd, keys.HeartbeatShardsPrefix, rev, func(kv *mvccpb.KeyValue) error {
		shardInto(health, shards, string(kv.Key), kv.Value, false)
		return nil
	})
	if err != nil {
		return err
	}
	for id, n := range nodes {
		health[id].decorate(n)
	}
	// Forget the unreadable records deleted while the hub was away.
	for key := range h.unreadable {
		if _, ok := nodes[strings.TrimPrefix(key, keys.NodesPrefix)]; !ok {
			delete(h.unreadable, key)
		}
	}
	return h.install(nodes, health, shards, rev)
}

// install makes nodes (decorated) and health at rev the hub's view. The
// ring restarts there: streams behind rev get a snapshot.
func (h *Hub) install(nodes map[string]*curatorv1.Node, health map[string]heartbeatRecord, shards map[string][]string, rev int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if rev < h.rev {
		// etcd's revision went back (restored without --bump-revision?):
		// serving it would break every watcher's resume. Wait for etcd to
		// pass the revision already served.
		return fmt.Errorf("etcd is at revision %d, below the %d this replica served already; waiting for etcd to pass it", rev, h.rev)
	}
	if shards == nil {
		shards = map[string][]string{}
	}
	h.nodes, h.health, h.shards, h.rev, h.oldest, h.ready = nodes, health, shards, rev, rev, true
	h.idsChangedLocked()
	h.ring.reset()
	h.advanceLocked(true)
	h.log.Info("watch hub loaded nodes", "revision", rev, "nodes", len(nodes))
	if h.OnLoad != nil {
		h.OnLoad()
	}
	return nil
}

// decode reads the node record stored under key at rev. A record that
// does not decode, or that holds another node, must neither stop every
// watcher nor be left out: a node left out looks deleted, and the
// reconciler removes the etcd member of a node that does not exist. It
// becomes a node with only what the key says — its id, its revision — and
// why nothing else is known; it is logged once per revision.
func (h *Hub) decode(key string, value []byte, rev int64) *curatorv1.Node {
	id := strings.TrimPrefix(key, keys.NodesPrefix)
	n, err := nodestore.Decode(value, rev)
	switch {
	case err != nil:
		return h.unreadableNode(key, id, rev, fmt.Sprintf("the stored record does not decode (%v); the node exists, nothing else about it is known", err))
	case n.Id != id:
		return h.unreadableNode(key, id, rev, fmt.Sprintf("the stored record holds node %q, not %s; the node exists, nothing else about it is known", n.Id, id))
	}
	delete(h.unreadable, key)
	return n
}

// unreadableNode is the node stored under key at rev whose record cannot
// be read, for why.
func (h *Hub) unreadableNode(key, id string, rev int64, why string) *curatorv1.Node {
	if h.unreadable[key] != rev {
		h.unreadable[key] = rev
		h.log.Error("unreadable node record; watchers see the node with only its id", "key", key, "node", id, "revision", rev, "reason", why)
	}
	return &curatorv1.Node{Id: id, Revision: rev, Unreadable: why}
}

// follow watches etcd from the hub's revision on and applies what it sees,
// until the watch fails or ctx ends. It reports whether it applied anything.
//
// It watches every key of curia's, not only the nodes and heartbeats it
// keeps: every write of curia's then moves the hub's revision at once, so
// that a read that must be at least at etcd's current revision (GetNodes)
// seldom waits for a progress notification. The other keys' events are
// few and small (audit records, membership records, leases).
func (h *Hub) follow(ctx context.Context) (progressed bool, err error) {
	// A stream of our own (the metadata keys clientv3's gRPC watch
	// streams), so that progress requests concern this watch only; and
	// require an etcd leader, so that a member cut off from its cluster
	// ends the watch instead of going silent.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(metadata.AppendToOutgoingContext(ctx, "curia-watch", "nodes")))
	defer cancel()
	from := h.Revision() + 1
	wch := h.etcd.Watch(wctx, keys.Prefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithProgressNotify())
	h.log.Debug("watching nodes", "from", from)
	for {
		select {
		case <-ctx.Done():
			return progressed, nil
		case <-h.nudge:
			if err := h.etcd.RequestProgress(wctx); err != nil {
				h.log.Debug("request watch progress", "err", err)
			}
		case wr, ok := <-wch:
			if !ok {
				return progressed, fmt.Errorf("etcd closed the node watch")
			}
			if wr.CompactRevision != 0 {
				return progressed, &watchCompacted{rev: wr.CompactRevision}
			}
			if err := wr.Err(); err != nil {
				return progressed, fmt.Errorf("node watch: %w", err)
			}
			switch {
			case len(wr.Events) > 0:
				changes := make([]nodeChange, len(wr.Events))
				for i, ev := range wr.Events {
					changes[i] = nodeChange{rev: ev.Kv.ModRevision, key: string(ev.Kv.Key), value: ev.Kv.Value, deleted: ev.Type == clientv3.EventTypeDelete}
				}
				h.apply(changes)
				progressed = true
			case wr.IsProgressNotify():
				// etcd sends these only once every event up to the
				// header's revision was delivered.
				if h.progress(wr.Header.Revision) {
					progressed = true
				}
			}
		}
	}
}

// nodeChange is one event of the hub's watch: of a node record, a
// heartbeat key, or any other key of curia's (which only moves the
// revision).
type nodeChange struct {
	rev     int64 // the event's revision (a delete's too)
	key     string
	value   []byte
	deleted bool
}

// apply adds changes (in revision order) to the view, and to the ring one
// batch per revision that changed a node record.
func (h *Hub) apply(changes []nodeChange) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := 0; i < len(changes); {
		rev := changes[i].rev
		j := i
		for j < len(changes) && changes[j].rev == rev {
			j++
		}
		group := changes[i:j]
		i = j
		if rev <= h.rev {
			// Applied already (cannot happen with a watch from rev+1;
			// guard the monotonic revision anyway).
			continue
		}
		// Heartbeats first, so that a node written in the same
		// transaction is decorated with them.
		var healthChanged []string
		for _, c := range group {
			if strings.HasPrefix(c.key, keys.HeartbeatShardsPrefix) {
				healthChanged = append(healthChanged, h.applyShard(c)...)
			} else if id := heartbeatNode(c.key); id != "" && h.applyHeartbeat(id, c) {
				healthChanged = append(healthChanged, id)
			}
		}
		resp := &curatorv1.WatchResponse{Revision: rev}
		for _, c := range group {
			id, ok := strings.CutPrefix(c.key, keys.NodesPrefix)
			switch {
			case !ok:
			case c.deleted:
				if _, ok := h.nodes[id]; ok {
					delete(h.nodes, id)
					h.idsChangedLocked()
				}
				delete(h.unreadable, c.key)
				resp.Deleted = append(resp.Deleted, id)
			default:
				n := h.decode(c.key, c.value, c.rev)
				h.health[n.Id].decorate(n)
				if _, ok := h.nodes[n.Id]; !ok {
					h.idsChangedLocked()
				}
				h.nodes[n.Id] = n
				resp.Nodes = append(resp.Nodes, n)
			}
		}
		for _, id := range healthChanged {
			n, ok := h.nodes[id]
			if ok && !slices.Contains(resp.Nodes, n) {
				resp.Nodes = append(resp.Nodes, n)
			}
		}
		h.rev = rev
		batch := len(resp.Nodes) > 0 || len(resp.Deleted) > 0
		if batch {
			if evicted := h.ring.push(&watchBatch{rev: rev, all: resp}); evicted != nil {
				h.oldest = evicted.rev
			}
		}
		h.advanceLocked(batch)
	}
}

// applyHeartbeat records a change c of one of node id's heartbeat keys; the
// node, if it exists, is replaced by a copy with its new health (streams
// may be sending the old one). It reports whether the node's health
// changed (HEALTHY, HEARTBEAT_TIMEOUT, UNKNOWN), which watchers are sent;
// a heartbeat that keeps a node healthy only moves its last heartbeat,
// which they see with its next change or snapshot.
func (h *Hub) applyHeartbeat(id string, c nodeChange) (healthChanged bool) {
	r := h.health[id].with(c.key, c.value, c.deleted)
	if r.empty() {
		delete(h.health, id)
	} else {
		h.health[id] = r
	}
	return h.redecorate(id, r)
}

// redecorate replaces node id, if it exists, by a copy with its health
// from r (streams may be sending the old one) when that changes its health
// or last heartbeat. It reports whether the health changed.
func (h *Hub) redecorate(id string, r heartbeatRecord) (healthChanged bool) {
	n, ok := h.nodes[id]
	if !ok {
		return false
	}
	next := proto.CloneOf(n)
	r.decorate(next)
	if next.Health == n.Health && proto.Equal(next.LastHeartbeat, n.LastHeartbeat) {
		return false
	}
	h.nodes[id] = next
	return next.Health != n.Health
}

// applyShard records a change c of a heartbeat shard, and returns the
// nodes whose health it changed. The leader rewrites a shard every
// heartbeat timeout / 2; a node whose health stays and only its last
// heartbeat moves is replaced, not sent.
func (h *Hub) applyShard(c nodeChange) (healthChanged []string) {
	for _, id := range shardInto(h.health, h.shards, c.key, c.value, c.deleted) {
		if h.redecorate(id, h.health[id]) {
			healthChanged = append(healthChanged, id)
		}
	}
	return healthChanged
}

// shardInto applies the value of shard key (or its deletion) to health and
// shards, and returns the ids whose record it touched.
func shardInto(health map[string]heartbeatRecord, shards map[string][]string, key string, value []byte, deleted bool) []string {
	var entries []shardEntry
	if !deleted {
		entries = parseShard(value)
	}
	ids := make([]string, 0, len(entries))
	seen := make(map[string]struct{}, len(entries))
	for _, e := range entries {
		r := health[e.id]
		r.shard, r.shardLast, r.shardTimedOut = key, e.last, e.timedOut
		health[e.id] = r
		ids = append(ids, e.id)
		seen[e.id] = struct{}{}
	}
	touched := ids
	for _, id := range shards[key] {
		if _, ok := seen[id]; ok {
			continue
		}
		r, ok := health[id]
		if !ok || r.shard != key {
			continue // moved to another shard
		}
		r.shard, r.shardLast, r.shardTimedOut = "", time.Time{}, false
		if r.empty() {
			delete(health, id)
		} else {
			health[id] = r
		}
		touched = append(touched, id)
	}
	if deleted || len(ids) == 0 {
		delete(shards, key)
	} else {
		shards[key] = ids[:len(ids):len(ids)]
	}
	return touched
}

// Exists says whether node id exists as the hub sees it; true until the
// hub has loaded.
func (h *Hub) Exists(id string) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	_, ok := h.nodes[id]
	return ok || !h.ready
}

// progress moves the hub to rev when etcd said every change up to it was
// delivered. It reports whether the revision moved.
func (h *Hub) progress(rev int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if rev <= h.rev {
		return false
	}
	h.rev = rev
	h.advanceLocked(false)
	return true
}

// advanceLocked wakes those waiting for the hub to move; changed says
// whether streams that are up to date have something new (a batch, a
// snapshot).
func (h *Hub) advanceLocked(changed bool) {
	close(h.advanced)
	h.advanced = make(chan struct{})
	if changed {
		close(h.changed)
		h.changed = make(chan struct{})
	}
}

// Revision is the revision the hub's view is complete up to.
func (h *Hub) Revision() int64 {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.rev
}

// Nodes calls f with every node of the hub's view, under its read lock
// (f must not block or change the node); false if the hub has not loaded
// yet.
func (h *Hub) Nodes(f func(*curatorv1.Node)) (ready bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if !h.ready {
		return false
	}
	for _, n := range h.nodes {
		f(n)
	}
	return true
}

// requestProgress asks the watch loop to ask etcd for a progress
// notification (coalesced: one pending request at a time).
func (h *Hub) requestProgress() {
	select {
	case h.nudge <- struct{}{}:
	default:
	}
}

// watcher is one Watch stream's position.
type watcher struct {
	// node is the watched node; "" watches all of them.
	node string
	// cursor is the revision the stream has been sent everything up to.
	cursor int64
	// snapshot asks for a snapshot at the next read.
	snapshot bool
	// minRev is the revision that snapshot must be at least at (the
	// request's min_revision); 0: any.
	minRev int64
	// progress asks for progress responses (the request's
	// progress_notify); sent is the last revision the stream was sent, and
	// progressed when it was last sent progress.
	progress   bool
	sent       int64
	progressed time.Time
}

// watchWake are the hub's channels a stream waits on, as of a read:
// changed when the stream may have something new, advanced when the hub
// moved at all.
type watchWake struct{ changed, advanced <-chan struct{} }

// watchSend sends r on a stream. shared is the batch r is the all_nodes
// response of, which every all_nodes stream sends (watchBatch.encode); nil
// for a response of this stream's own.
type watchSend func(r *curatorv1.WatchResponse, shared *watchBatch) error

// watchOut is one response read for a stream: r, and the batch it is
// shared from, if it is.
type watchOut struct {
	r      *curatorv1.WatchResponse
	shared *watchBatch
}

// read returns what w has not been sent yet and advances its cursor; and
// the channels that say when there may be more. behind means the hub has
// not reached w's cursor, or the revision its snapshot must be at, yet.
func (h *Hub) read(w *watcher) (out []watchOut, wake watchWake, behind bool) {
	h.mu.RLock()
	wake = watchWake{changed: h.changed, advanced: h.advanced}
	if !h.ready {
		h.mu.RUnlock()
		return nil, wake, true
	}
	if w.snapshot || w.cursor < h.oldest {
		if h.rev < w.minRev {
			// An older snapshot would show the client nodes deleted
			// since that still existed at minRev, or none of those
			// created up to it: wait.
			h.mu.RUnlock()
			return nil, wake, true
		}
		var nodes []*curatorv1.Node
		if w.node != "" {
			if n, ok := h.nodes[w.node]; ok {
				nodes = append(nodes, n)
			}
		} else {
			nodes = make([]*curatorv1.Node, 0, len(h.nodes))
			for _, n := range h.nodes {
				nodes = append(nodes, n)
			}
		}
		rev := h.rev
		h.mu.RUnlock()
		w.cursor, w.snapshot = rev, false
		for _, r := range snapshotResponses(nodes, rev, watchMaxMessageBytes) {
			out = append(out, watchOut{r: r})
		}
		return out, wake, false
	}
	if w.cursor > h.rev {
		h.mu.RUnlock()
		return nil, wake, true
	}
	for i := h.ring.after(w.cursor); i < h.ring.n; i++ {
		b := h.ring.at(i)
		switch r := b.forNode(w.node); {
		case r == b.all:
			out = append(out, watchOut{r: r, shared: b})
		case r != nil:
			out = append(out, watchOut{r: r})
		}
	}
	w.cursor = h.rev
	h.mu.RUnlock()
	return out, wake, false
}

// snapshotResponses is a snapshot of nodes at rev, sorted by id, in
// messages of at most maxBytes (a single node larger than that gets a
// message of its own). Only the last message carries rev: a client that
// stops half-way resumes from 0, a fresh snapshot.
func snapshotResponses(nodes []*curatorv1.Node, rev int64, maxBytes int) []*curatorv1.WatchResponse {
	slices.SortFunc(nodes, func(a, b *curatorv1.Node) int { return cmp.Compare(a.Id, b.Id) })
	out := []*curatorv1.WatchResponse{{Snapshot: true}}
	size := 0
	for _, n := range nodes {
		s := proto.Size(n) + 8 // the field's tag and length
		cur := out[len(out)-1]
		if len(cur.Nodes) > 0 && size+s > maxBytes {
			cur = &curatorv1.WatchResponse{}
			out = append(out, cur)
			size = 0
		}
		cur.Nodes = append(cur.Nodes, n)
		size += s
	}
	out[len(out)-1].Revision = rev
	return out
}

// serve sends w what the hub has, and then every change, until ctx ends,
// sending fails or the hub stops.
func (h *Hub) serve(ctx context.Context, w *watcher, send watchSend) error {
	// A snapshot that must reach a revision waits for it a bounded time,
	// the hub's first load included; a client waiting on a lagging replica
	// is better off on another one.
	var deadline <-chan time.Time
	if w.snapshot && w.minRev > 0 {
		t := time.NewTimer(h.minRevisionWait)
		defer t.Stop()
		deadline = t.C
	}
	done := ctx.Done()
	// Wait for the hub's first snapshot.
	for {
		h.mu.RLock()
		ready, changed := h.ready, h.changed
		h.mu.RUnlock()
		if ready {
			break
		}
		if err := h.wait(ctx, done, w, changed, nil, deadline); err != nil {
			return err
		}
	}
	if !w.snapshot && w.cursor > h.Revision() {
		// The hub is behind the client (this replica just started, or it
		// trails the replica the client came from) — or the client's
		// revision is from an etcd history this one never reached. The
		// first catches up; the second can only be answered with a
		// snapshot.
		rev, err := h.etcdRevision(ctx)
		if err != nil {
			return fmt.Errorf("%w: %v", rpcerr.Unavailable, err)
		}
		if w.cursor > rev {
			h.log.Info("watch resumes from a revision etcd never reached; sending a snapshot", "start_revision", w.cursor, "etcd_revision", rev)
			w.snapshot = true
		}
	}
	for {
		out, wake, behind := h.read(w)
		for _, o := range out {
			if err := send(o.r, o.shared); err != nil {
				return err
			}
			if o.r.Revision != 0 {
				w.sent = o.r.Revision
			}
		}
		if !w.snapshot {
			deadline = nil // the snapshot is sent: min_revision is met
		}
		// What to wait for: the hub to reach the stream (asking etcd for
		// progress now and then); the time to send progress; any move of
		// the hub, for a stream that asked for progress; else a change.
		var timer *time.Timer
		var fire <-chan time.Time
		until := wake.changed
		switch pending := w.progress && !behind && w.cursor > w.sent; {
		case behind:
			h.requestProgress()
			timer = time.NewTimer(watchNudgeInterval)
			fire, until = timer.C, wake.advanced
		case pending && time.Since(w.progressed) >= watchProgressInterval:
			if err := send(&curatorv1.WatchResponse{Revision: w.cursor}, nil); err != nil {
				return err
			}
			w.sent, w.progressed = w.cursor, time.Now()
			until = wake.advanced
		case pending:
			timer = time.NewTimer(watchProgressInterval - time.Since(w.progressed))
			fire = timer.C
		case w.progress:
			until = wake.advanced
		}
		err := h.wait(ctx, done, w, until, fire, deadline)
		if timer != nil {
			timer.Stop()
		}
		if err != nil {
			return err
		}
	}
}

// wait blocks until changed is closed or nudge fires; it fails when ctx
// ends (done is its Done, looked up once per stream: a stream's context
// sits under a dozen values, and a change wakes every stream), the hub
// stops, or deadline (for w's min_revision) fires.
func (h *Hub) wait(ctx context.Context, done <-chan struct{}, w *watcher, changed <-chan struct{}, nudge, deadline <-chan time.Time) error {
	select {
	case <-done:
		return ctx.Err()
	case <-h.stopped:
		return fmt.Errorf("%w: this curator replica is shutting down; watch again (any replica) with start_revision=%d", rpcerr.Unavailable, w.cursor)
	case <-deadline:
		return h.behindMinRevision(ctx, w)
	case <-changed:
	case <-nudge:
	}
	return nil
}

// behindMinRevision is the refusal of w, whose min_revision the hub did
// not reach in time. It says whether etcd itself is behind it (a
// min_revision from elsewhere: retrying will not help) when etcd answers
// quickly.
func (h *Hub) behindMinRevision(ctx context.Context, w *watcher) error {
	rev := h.Revision()
	h.log.Warn("watch refused: the hub did not reach min_revision in time", "revision", rev, "min_revision", w.minRev, "waited", h.minRevisionWait)
	rctx, cancel := context.WithTimeout(ctx, watchEtcdRevisionTimeout)
	defer cancel()
	if etcdRev, err := h.etcdRevision(rctx); err == nil && etcdRev < w.minRev {
		return fmt.Errorf("%w: min_revision %d is ahead of etcd: etcd itself is at revision %d (this replica's view of the nodes is at revision %d); pass a revision this cluster returned, e.g. ListMembersResponse.revision, and retry (any replica)", rpcerr.Unavailable, w.minRev, etcdRev, rev)
	}
	return fmt.Errorf("%w: this replica's view of the nodes is at revision %d, behind the requested min_revision %d after waiting %s; retry, on any replica", rpcerr.Unavailable, rev, w.minRev, h.minRevisionWait)
}

// NodesAt returns every node, with its health, at the hub's revision once
// that is at least minRev, sorted by id; and that revision. The nodes are
// the hub's own: read them, never change them. A hub that does not reach
// minRev within minRevisionWait (a first load included) refuses
// UNAVAILABLE: this replica lags or is cut off from etcd.
func (h *Hub) NodesAt(ctx context.Context, minRev int64) ([]*curatorv1.Node, int64, error) {
	deadline := time.NewTimer(h.minRevisionWait)
	defer deadline.Stop()
	for {
		h.mu.RLock()
		ready, rev, advanced := h.ready, h.rev, h.advanced
		if ready && rev >= minRev {
			nodes := make([]*curatorv1.Node, 0, len(h.nodes))
			if h.ids != nil {
				for _, id := range h.ids {
					nodes = append(nodes, h.nodes[id])
				}
				h.mu.RUnlock()
				return nodes, rev, nil
			}
			for _, n := range h.nodes {
				nodes = append(nodes, n)
			}
			gen := h.idsGen
			h.mu.RUnlock()
			slices.SortFunc(nodes, func(a, b *curatorv1.Node) int { return cmp.Compare(a.Id, b.Id) })
			ids := make([]string, len(nodes))
			for i, n := range nodes {
				ids[i] = n.Id
			}
			h.mu.Lock()
			if h.idsGen == gen {
				h.ids = ids
			}
			h.mu.Unlock()
			return nodes, rev, nil
		}
		h.mu.RUnlock()
		h.requestProgress()
		nudge := time.NewTimer(watchNudgeInterval)
		select {
		case <-ctx.Done():
			nudge.Stop()
			return nil, 0, ctx.Err()
		case <-h.stopped:
			nudge.Stop()
			return nil, 0, fmt.Errorf("%w: this curator replica is shutting down; retry (any replica)", rpcerr.Unavailable)
		case <-deadline.C:
			nudge.Stop()
			return nil, 0, fmt.Errorf("%w: this replica's view of the nodes is at revision %d, behind etcd's %d after waiting %s; retry, on any replica", rpcerr.Unavailable, rev, minRev, h.minRevisionWait)
		case <-advanced:
		case <-nudge.C:
		}
		nudge.Stop()
	}
}

// idsChangedLocked notes that a node came or went: ids must be sorted
// again. h.mu is held for writing.
func (h *Hub) idsChangedLocked() {
	h.ids = nil
	h.idsGen++
}

// CurrentNodes is nodesAt etcd's current revision: every node as of a
// moment within the call (a linearizable read).
func (h *Hub) CurrentNodes(ctx context.Context) ([]*curatorv1.Node, error) {
	rev, err := h.etcdRevision(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", rpcerr.Unavailable, err)
	}
	nodes, _, err := h.NodesAt(ctx, rev)
	return nodes, err
}

// Watch serves one Watch stream from the hub (see the top of this file):
// the Curator service's Watch, which every replica serves itself.
func (h *Hub) Watch(req *curatorv1.WatchRequest, stream curatorv1.Curator_WatchServer) error {
	return h.serve(stream.Context(), newWatcher(req), func(r *curatorv1.WatchResponse, shared *watchBatch) error {
		if shared == nil {
			return stream.Send(r)
		}
		e, err := shared.encode()
		if err != nil {
			return fmt.Errorf("encode the changes at revision %d: %w", shared.rev, err)
		}
		return stream.SendMsg(e)
	})
}

// newWatcher decides what a WatchRequest watches. Who may watch what (a
// node only itself) is the policy's watchesItself; the request's shape
// (one of node_id and all_nodes=true, revisions not negative, min_revision
// only for a snapshot) is its contract. Both are checked before the
// handler runs.
func newWatcher(req *curatorv1.WatchRequest) *watcher {
	return &watcher{cursor: req.GetStartRevision(), snapshot: req.GetStartRevision() == 0, minRev: req.GetMinRevision(), node: req.GetNodeId(), progress: req.GetProgressNotify()}
}
