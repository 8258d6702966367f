package nodewatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/rpcerr"
)

// Heartbeats and health. A node keeps one Heartbeat stream open (to any
// replica; followers forward it to the leader) and sends a request at least
// every HeartbeatInterval. The curator leader keeps each node's last beat
// in memory (Tracker) and writes them to etcd in shards of up to
// heartbeatShardSize nodes:
//
//	heartbeat-shards/<n>   one line per node: "<id> <unix nanos of its last beat> <h|t>"
//	                       h: HEALTHY, t: HEARTBEAT_TIMEOUT
//
//	in a shard, h   → HEALTHY
//	in a shard, t   → HEARTBEAT_TIMEOUT
//	in none         → UNKNOWN
//
// Every replica's watch hub follows the shards and derives each node's
// health and last heartbeat from them (hub.go): the leader decides, every
// replica serves the decision.
//
// Writes. A beat costs etcd nothing. Every HeartbeatTimeout/2 the leader
// writes every shard whose nodes beat since its last write, all in one
// term-guarded transaction (split when near etcd's request limits): the
// time in etcd lags the last beat by less than HeartbeatTimeout/2, as with
// the per-node keys before. A change of health (a first beat, a beat after
// a timeout, a timeout) is written at once, its shard alone (changes that
// come while a write is under way go in the next): a write per change of
// health, none in a steady state.
//
// Timeouts. The leader times a node out exactly HeartbeatTimeout after its
// last beat (a timer per node), also after its stream ended, and writes the
// timeout's shard at once: a silent node is HEARTBEAT_TIMEOUT within the
// timeout plus one etcd transaction and the hub's watch delivery (tens of
// milliseconds), the beat's exact time as its last heartbeat.
//
// Failover. A new leader reads the shards and gives every HEALTHY node one
// full HeartbeatTimeout from then to beat again (its agent reconnects to
// the new leader) before it times it out: a failover delays the timeout of
// a node that died just before it by at most one timeout, and marks no
// beating node timed out. The leader's own election session renews on a
// client of its own (leader.go), so that heartbeat load cannot depose it.
//
// Migration. Curators before the shards kept heartbeats/<id> (bound to an
// etcd lease) and heartbeats-seen/<id> per node. A new leader reads them
// once: nodes in no shard get an entry (heartbeats/<id>: HEALTHY, with a
// timeout's grace; only heartbeats-seen/<id>: HEARTBEAT_TIMEOUT), written
// at once, and the old keys are deleted after. The hub serves them until
// then, a shard's entry first.

const (
	// heartbeatShardSize is how many nodes one shard record holds: about
	// 100 KB of text.
	heartbeatShardSize = 1000
	// heartbeatTxnOps and heartbeatTxnBytes bound one transaction of shard
	// writes: etcd's default --max-txn-ops is 128 and its request limit
	// 1.5 MiB.
	heartbeatTxnOps   = 128
	heartbeatTxnBytes = 1 << 20
	// Retry is the wait before a failed write of health changes, or a
	// failed Track, is tried again.
	Retry = 200 * time.Millisecond
)

// beatEntry is what the leader knows of one node's beats.
type beatEntry struct {
	shard    int
	last     time.Time // the last beat
	timedOut bool
	timer    *time.Timer // times the node out at last + timeout (or the grace's end)
	deadline time.Time   // when timer times the node out
}

// Tracker is one term's record of every node's beats: in memory, written
// to etcd in shards (see the top of this file).
type Tracker struct {
	etcd *clientv3.Client
	lead Leadership
	log  *slog.Logger
	// registered says whether a node is in the registry (the watch hub's
	// view).
	registered func(id string) bool

	term    int64
	timeout time.Duration
	cancel  context.CancelFunc
	// wake asks run for a write now: a health changed.
	wake chan struct{}

	mu     sync.Mutex
	nodes  map[string]*beatEntry
	shards []map[string]*beatEntry
	dirty  []bool // shards changed since their last write
	// changed are the shards with a change of health since their last
	// write: what a write at once (not the periodic one) carries.
	changed []bool
	// legacy are the per-node keys of older curators still in etcd, to
	// delete once the shards that replace them are written.
	legacy  []string
	stopped bool
}

// Leadership is this replica's curator leadership.
type Leadership interface {
	// Ours is the leader key and term this replica holds, ok false when
	// it does not lead.
	Ours() (key string, term int64, ok bool)
	// Txn runs ops in a transaction guarded by this replica's term, plus
	// cmps: a lost term is rpcerr.NotLeader.
	Txn(ctx context.Context, cmps []clientv3.Cmp, ops ...clientv3.Op) (*clientv3.TxnResponse, error)
}

// Tracking is what a term's tracker gets.
type Tracking struct {
	Etcd *clientv3.Client
	Lead Leadership
	Log  *slog.Logger
	// Registered says whether a node is in the registry (the hub's
	// Exists).
	Registered func(id string) bool
	// Term is the term this replica leads in; Timeout how long a node may
	// be silent before it is HEARTBEAT_TIMEOUT.
	Term    int64
	Timeout time.Duration
}

// Track starts the tracker of c.Term when this replica became leader: it
// reads the heartbeats etcd holds, then writes the shards until the term
// ends or ctx does (or Stop).
func Track(ctx context.Context, c Tracking) (*Tracker, error) {
	tctx, cancel := context.WithCancel(ctx)
	t := &Tracker{
		etcd: c.Etcd, lead: c.Lead, log: c.Log, registered: c.Registered,
		term: c.Term, timeout: c.Timeout, cancel: cancel, wake: make(chan struct{}, 1), nodes: map[string]*beatEntry{},
	}
	if err := t.load(tctx); err != nil {
		cancel()
		return nil, err
	}
	go t.run(tctx)
	return t, nil
}

// load reads the shards and the per-node keys of older curators. Every
// HEALTHY node gets one full timeout from now to beat again.
func (t *Tracker) load(ctx context.Context) error {
	now := time.Now()
	resp, err := t.etcd.Get(ctx, keys.HeartbeatShardsPrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("%w: read the heartbeat shards: %v", rpcerr.Unavailable, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, kv := range resp.Kvs {
		i, err := strconv.Atoi(strings.TrimPrefix(string(kv.Key), keys.HeartbeatShardsPrefix))
		if err != nil || i < 0 || i > 1<<20 {
			t.log.Warn("heartbeat shard with an unexpected key; ignored", "key", string(kv.Key))
			continue
		}
		for len(t.shards) <= i {
			t.shards = append(t.shards, map[string]*beatEntry{})
			t.dirty = append(t.dirty, false)
			t.changed = append(t.changed, false)
		}
		for _, e := range parseShard(kv.Value) {
			if _, dup := t.nodes[e.id]; dup {
				t.dirty[i] = true // written again without it
				continue
			}
			t.add(e.id, i, e.last, e.timedOut, now)
		}
	}
	// Older curators' per-node keys, read once.
	legacy := map[string]heartbeatRecord{}
	for _, prefix := range []string{keys.HeartbeatsPrefix, keys.HeartbeatsSeenPrefix} {
		lresp, err := t.etcd.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision))
		if err != nil {
			return fmt.Errorf("%w: read the per-node heartbeat keys: %v", rpcerr.Unavailable, err)
		}
		for _, kv := range lresp.Kvs {
			id := strings.TrimPrefix(string(kv.Key), prefix)
			legacy[id] = legacy[id].with(string(kv.Key), kv.Value, false)
			t.legacy = append(t.legacy, string(kv.Key))
		}
	}
	for id, r := range legacy {
		if _, ok := t.nodes[id]; ok {
			continue
		}
		last := r.seenAt
		if r.alive {
			last = maxTime(r.aliveAt, r.seenAt)
		}
		i := t.freeShard()
		t.add(id, i, last, !r.alive, now)
		t.dirty[i], t.changed[i] = true, true
	}
	if len(legacy) > 0 {
		t.log.Info("heartbeat keys of older curators moved into the shards", "nodes", len(legacy))
		t.wakeUp()
	}
	t.log.Info("heartbeats loaded", "term", t.term, "nodes", len(t.nodes), "shards", len(t.shards))
	return nil
}

// add records node id in shard i (locked). A HEALTHY node times out a
// timeout after from unless it beats.
func (t *Tracker) add(id string, i int, last time.Time, timedOut bool, from time.Time) *beatEntry {
	e := &beatEntry{shard: i, last: last, timedOut: timedOut}
	t.nodes[id] = e
	t.shards[i][id] = e
	if !timedOut {
		t.arm(id, e, from.Add(t.timeout))
	}
	return e
}

// freeShard is a shard with room for one more node (locked).
func (t *Tracker) freeShard() int {
	for i, sh := range t.shards {
		if len(sh) < heartbeatShardSize {
			return i
		}
	}
	t.shards = append(t.shards, map[string]*beatEntry{})
	t.dirty = append(t.dirty, false)
	t.changed = append(t.changed, false)
	return len(t.shards) - 1
}

// arm times node id out at deadline (locked).
func (t *Tracker) arm(id string, e *beatEntry, deadline time.Time) {
	e.deadline = deadline
	if e.timer == nil {
		e.timer = time.AfterFunc(time.Until(deadline), func() { t.expire(id) })
		return
	}
	e.timer.Reset(time.Until(deadline))
}

// Beat counts a beat of node id at now.
func (t *Tracker) Beat(id string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	e, ok := t.nodes[id]
	if !ok {
		e = t.add(id, t.freeShard(), now, true, now)
	}
	if e.timedOut {
		e.timedOut = false
		t.changed[e.shard] = true
		t.wakeUp() // a change of health: written now
	}
	e.last = now
	t.arm(id, e, now.Add(t.timeout))
	t.dirty[e.shard] = true
}

// expire times node id out if its deadline passed without a beat.
func (t *Tracker) expire(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.nodes[id]
	if t.stopped || !ok || e.timedOut || time.Now().Before(e.deadline) {
		return
	}
	e.timedOut = true
	t.dirty[e.shard], t.changed[e.shard] = true, true
	t.wakeUp()
	t.log.Info("node heartbeat timed out", "node", id, "last_heartbeat", e.last)
}

// wakeUp asks run for a write now (coalesced).
func (t *Tracker) wakeUp() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// Term is the curator term the tracker records beats for.
func (t *Tracker) Term() int64 { return t.term }

// Stop ends the tracker: its timers and its writes.
func (t *Tracker) Stop() {
	t.cancel()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	for _, e := range t.nodes {
		if e.timer != nil {
			e.timer.Stop()
		}
	}
}

// run writes the changed shards every timeout/2, and at once when a health
// changed, until the term ends.
func (t *Tracker) run(ctx context.Context) {
	defer t.Stop()
	tick := time.NewTicker(t.timeout / 2)
	defer tick.Stop()
	var retry <-chan time.Time
	for {
		periodic := false
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			periodic = true
		case <-t.wake:
		case <-retry:
		}
		retry = nil
		err := t.flush(ctx, periodic)
		switch {
		case err == nil:
		case errors.Is(err, rpcerr.NotLeader):
			t.log.Info("heartbeat writes stop: the term ended", "term", t.term)
			return
		default:
			if ctx.Err() != nil {
				return
			}
			t.log.Warn("write heartbeat shards", "term", t.term, "err", err)
			retry = time.After(Retry)
		}
		if _, term, ok := t.lead.Ours(); !ok || term != t.term {
			return
		}
	}
}

// flush writes the shards with a change of health, and when periodic
// every shard that changed at all (a beat); periodic flushes also drop
// the entries of deleted nodes that timed out. After a first successful write the
// per-node keys of older curators go.
func (t *Tracker) flush(ctx context.Context, periodic bool) error {
	t.mu.Lock()
	if periodic {
		t.pruneLocked()
	}
	var puts []shardPut
	for i, d := range t.dirty {
		if t.changed[i] || (periodic && d) {
			puts = append(puts, shardPut{i, formatShard(t.shards[i])})
			t.dirty[i], t.changed[i] = false, false
		}
	}
	legacy := t.legacy
	t.legacy = nil
	t.mu.Unlock()

	// One transaction per batch of shards that fits etcd's limits.
	var batches [][]shardPut
	size := 0
	for _, p := range puts {
		if n := len(batches); n == 0 || len(batches[n-1]) == heartbeatTxnOps || size+len(p.v) > heartbeatTxnBytes {
			batches = append(batches, nil)
			size = 0
		}
		batches[len(batches)-1] = append(batches[len(batches)-1], p)
		size += len(p.v) + 64
	}
	for k, b := range batches {
		ops := make([]clientv3.Op, 0, len(b))
		for _, p := range b {
			ops = append(ops, clientv3.OpPut(keys.HeartbeatShard(p.i), p.v))
		}
		if _, err := t.lead.Txn(ctx, nil, ops...); err != nil {
			t.redo(slices.Concat(batches[k:]...), legacy)
			return err
		}
	}
	// The shards hold every node the old keys said: they may go.
	for len(legacy) > 0 {
		k := min(len(legacy), heartbeatTxnOps)
		ops := make([]clientv3.Op, 0, k)
		for _, key := range legacy[:k] {
			ops = append(ops, clientv3.OpDelete(key))
		}
		if _, err := t.lead.Txn(ctx, nil, ops...); err != nil {
			t.redo(nil, legacy)
			return err
		}
		legacy = legacy[k:]
	}
	return nil
}

// shardPut is a shard's record, to write.
type shardPut struct {
	i int
	v string
}

// redo marks unwritten shards (puts) and keys (legacy) for the next flush.
func (t *Tracker) redo(puts []shardPut, legacy []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range puts {
		t.dirty[p.i], t.changed[p.i] = true, true
	}
	t.legacy = append(t.legacy, legacy...)
}

// pruneLocked drops the entries of timed-out nodes that no longer exist
// (deleted: ids are never reused), as the hub sees the registry.
func (t *Tracker) pruneLocked() {
	for id, e := range t.nodes {
		if e.timedOut && !t.registered(id) {
			delete(t.nodes, id)
			delete(t.shards[e.shard], id)
			t.dirty[e.shard] = true
		}
	}
}

// shardEntry is one node's line in a shard record.
type shardEntry struct {
	id       string
	last     time.Time
	timedOut bool
}

// formatShard is the record of shard sh: one line per node, sorted by id.
func formatShard(sh map[string]*beatEntry) string {
	ids := make([]string, 0, len(sh))
	for id := range sh {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var b strings.Builder
	b.Grow(len(ids) * 64)
	for _, id := range ids {
		e := sh[id]
		b.WriteString(id)
		b.WriteByte(' ')
		b.WriteString(strconv.FormatInt(e.last.UnixNano(), 10))
		if e.timedOut {
			b.WriteString(" t\n")
		} else {
			b.WriteString(" h\n")
		}
	}
	return b.String()
}

// parseShard reads a shard record; lines that do not parse are skipped
// (their nodes read as UNKNOWN until the leader writes the shard again).
func parseShard(v []byte) []shardEntry {
	var out []shardEntry
	for line := range strings.Lines(string(v)) {
		f := strings.Fields(line)
		if len(f) != 3 || (f[2] != "h" && f[2] != "t") {
			continue
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		out = append(out, shardEntry{id: f[0], last: time.Unix(0, ns), timedOut: f[2] == "t"})
	}
	return out
}

// heartbeatRecord is what etcd holds about one node's heartbeats: its line
// in a shard, and the per-node keys of older curators (heartbeats/<id>,
// alive; heartbeats-seen/<id>, seen), each with the time it holds. A time
// that does not parse is zero: the key is there, the time unknown. A
// shard's line wins over the older keys.
type heartbeatRecord struct {
	shard           string // the shard's key; "": in no shard
	shardLast       time.Time
	shardTimedOut   bool
	alive, seen     bool
	aliveAt, seenAt time.Time
}

// empty says whether etcd holds nothing of the node's heartbeats.
func (r heartbeatRecord) empty() bool { return r.shard == "" && !r.alive && !r.seen }

// with is r after a change of key (one of the node's two per-node
// heartbeat keys) to value, or its deletion.
func (r heartbeatRecord) with(key string, value []byte, deleted bool) heartbeatRecord {
	t, _ := time.Parse(time.RFC3339Nano, string(value))
	if strings.HasPrefix(key, keys.HeartbeatsSeenPrefix) {
		r.seen, r.seenAt = !deleted, t
	} else {
		r.alive, r.aliveAt = !deleted, t
	}
	return r
}

// decorate fills in the fields of n computed from its heartbeats: health
// and last heartbeat.
func (r heartbeatRecord) decorate(n *curatorv1.Node) {
	last := r.seenAt
	switch {
	case r.shard != "" && r.shardTimedOut:
		n.Health = curatorv1.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT
		last = r.shardLast
	case r.shard != "":
		n.Health = curatorv1.NodeHealth_NODE_HEALTH_HEALTHY
		last = r.shardLast
	case r.alive:
		n.Health = curatorv1.NodeHealth_NODE_HEALTH_HEALTHY
		last = maxTime(r.aliveAt, r.seenAt)
	case r.seen:
		n.Health = curatorv1.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT
	default:
		n.Health = curatorv1.NodeHealth_NODE_HEALTH_UNKNOWN
		last = time.Time{}
	}
	n.LastHeartbeat = nil
	if !last.IsZero() {
		n.LastHeartbeat = timestamppb.New(last)
	}
}

// heartbeatNode is the node whose per-node heartbeat key is key ("" for a
// key of neither prefix).
func heartbeatNode(key string) string {
	if id, ok := strings.CutPrefix(key, keys.HeartbeatsSeenPrefix); ok {
		return id
	}
	if id, ok := strings.CutPrefix(key, keys.HeartbeatsPrefix); ok {
		return id
	}
	return ""
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
