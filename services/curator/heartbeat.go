package curator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
)

// Heartbeats and health. A node keeps one Heartbeat stream open (to any
// replica; followers forward it to the leader) and sends a request at least
// every HeartbeatInterval. Health lives in etcd, not in the leader's memory,
// so a curator leader change forgets nothing:
//
//	heartbeats/<id>        lease of HeartbeatTimeout; value: last recorded heartbeat
//	heartbeats-seen/<id>   no lease;                  value: last recorded heartbeat
//
//	heartbeats/<id> exists          → HEALTHY
//	only heartbeats-seen/<id>       → HEARTBEAT_TIMEOUT
//	neither                         → UNKNOWN
//
// Cost. A stream grants one etcd lease and writes both keys in one
// transaction. Each later heartbeat only refreshes the lease (KeepAliveOnce:
// etcd's leader renews it in memory — no raft entry, no revision, no disk
// write). The time is written again only when the recorded one is older than
// half the timeout: about two writes per node per timeout however often it
// beats, and last_heartbeat lags the real last heartbeat by less than
// timeout/2 while the node is healthy.
//
// Expiry. The leader that takes the heartbeats expires them itself, exactly
// HeartbeatTimeout after the last one (also after the stream has ended): it
// records that heartbeat's exact time in heartbeats-seen/<id>, deletes
// heartbeats/<id> and revokes the lease. The etcd lease is the backstop for a
// leader that dies: its TTL is the timeout rounded up to a whole second (etcd
// raises it to its own minimum, 1.5 × its election timeout), so a node that
// reconnects to the next leader within it stays HEALTHY throughout, and one
// that does not is HEARTBEAT_TIMEOUT once the lease runs out.
//
// Who writes. Writes of the two keys are leader writes: s.lead.txn, guarded
// by the term and by "the node exists", so a deposed leader cannot bring back
// a deleted node's keys, and a later write takes the key only while it is
// still bound to this stream's lease (the newest stream of a node wins).
// Lease calls (grant, keep-alive, revoke) touch only the stream's own lease,
// which no other stream or key depends on once a newer stream has taken the
// key, so they need no guard.

// Heartbeat serves one node's heartbeat stream.
func (x *curatorServer) Heartbeat(stream curatorv1.Curator_HeartbeatServer) error {
	return x.s.heartbeat(stream)
}

func (s *Service) heartbeat(stream curatorv1.Curator_HeartbeatServer) error {
	ctx := stream.Context()
	p := caller(ctx)
	if p.Kind != pki.KindNode {
		return fmt.Errorf("%w: only nodes send heartbeats, not %s", errDenied, p)
	}
	_, term, ok := s.lead.ours()
	if !ok {
		return errNotLeader
	}
	n, err := s.getNode(ctx, p.Name)
	if errors.Is(err, errNotFound) {
		return fmt.Errorf("%w: node %s does not exist", errRefused, p.Name)
	}
	if err != nil {
		return err
	}
	if n.State != curatorv1.NodeState_NODE_STATE_UP {
		return fmt.Errorf("%w: node %s is %s: only UP nodes send heartbeats", errRefused, n.Id, n.State)
	}

	hb := &heartbeatStream{s: s, id: n.Id, term: term}
	defer hb.finish()

	// Recv blocks; a goroutine turns it into a channel so that the loop
	// also sees the timeout of a stream that stays open but falls silent.
	beats := make(chan struct{})
	recvErr := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				recvErr <- err
				return
			}
			select {
			case beats <- struct{}{}:
			case <-ctx.Done():
				recvErr <- ctx.Err()
				return
			}
		}
	}()

	expiry := time.NewTimer(time.Hour)
	expiry.Stop()
	defer expiry.Stop()
	resp := &curatorv1.HeartbeatResponse{IntervalMillis: s.cfg.HeartbeatInterval.Milliseconds()}
	for {
		select {
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-beats:
			if err := hb.beat(ctx, time.Now()); err != nil {
				return err
			}
			if err := stream.Send(resp); err != nil {
				return err
			}
			expiry.Reset(time.Until(hb.last.Add(s.cfg.HeartbeatTimeout)))
		case <-expiry.C:
			hb.expire(ctx)
		}
	}
}

// heartbeatStream is the state of one Heartbeat stream. Only the stream's
// handler uses it, and after the handler returns only the expiry it
// scheduled.
type heartbeatStream struct {
	s    *Service
	id   string
	term int64 // the term the stream began in

	lease    clientv3.LeaseID // 0: none (not yet, or expired)
	last     time.Time        // the last heartbeat counted
	recorded time.Time        // the time last written to etcd
}

// beat counts a heartbeat received at now.
func (h *heartbeatStream) beat(ctx context.Context, now time.Time) error {
	s := h.s
	if _, term, ok := s.lead.ours(); !ok || term != h.term {
		return fmt.Errorf("%w: curator leadership moved; send heartbeats again (any replica forwards to the leader)", errNotLeader)
	}
	// A node that beats much faster than asked gets its answers, but costs
	// etcd nothing more: the lease was refreshed a moment ago. (The key then
	// goes at most interval/4 early, never late.)
	if h.lease != 0 && now.Sub(h.last) < s.cfg.HeartbeatInterval/4 {
		return nil
	}
	if h.lease != 0 {
		_, err := s.etcd.KeepAliveOnce(ctx, h.lease)
		switch {
		case err == nil:
			h.last = now
			if now.Sub(h.recorded) < s.cfg.HeartbeatTimeout/2 {
				return nil
			}
			return h.record(ctx, now, true)
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			h.lease = 0 // expired (the node was silent too long): begin again
		default:
			return fmt.Errorf("%w: refresh the heartbeat lease of %s: %v", errUnavailable, h.id, err)
		}
	}
	ttl := int64(math.Ceil(s.cfg.HeartbeatTimeout.Seconds()))
	lease, err := s.etcd.Grant(ctx, ttl)
	if err != nil {
		return fmt.Errorf("%w: grant a heartbeat lease for %s: %v", errUnavailable, h.id, err)
	}
	h.lease, h.last = lease.ID, now
	if err := h.record(ctx, now, false); err != nil {
		h.revoke()
		return err
	}
	return nil
}

// record writes now as the node's latest heartbeat. Unless fresh (a new
// lease), only while the key is still bound to this stream's lease: another
// binding means a newer stream of the node took over.
func (h *heartbeatStream) record(ctx context.Context, now time.Time, ownedOnly bool) error {
	s := h.s
	v := now.UTC().Format(time.RFC3339Nano)
	cmps := []clientv3.Cmp{nodeExists(h.id)}
	if ownedOnly {
		cmps = append(cmps, clientv3.Compare(clientv3.LeaseValue(keys.Heartbeat(h.id)), "=", h.lease))
	}
	_, err := s.lead.txn(ctx, cmps,
		clientv3.OpPut(keys.Heartbeat(h.id), v, clientv3.WithLease(h.lease)),
		clientv3.OpPut(keys.HeartbeatSeen(h.id), v))
	if err == nil {
		h.recorded = now
		return nil
	}
	if !errors.Is(err, errConflict) {
		return err
	}
	if _, err := s.getNode(ctx, h.id); errors.Is(err, errNotFound) {
		return fmt.Errorf("%w: node %s was deleted", errRefused, h.id)
	} else if err != nil {
		return err
	}
	if !ownedOnly {
		return fmt.Errorf("record heartbeat of %s: %w", h.id, errConflict)
	}
	cur, err := s.etcd.Get(ctx, keys.Heartbeat(h.id))
	if err != nil {
		return fmt.Errorf("%w: read heartbeat of %s: %v", errUnavailable, h.id, err)
	}
	if len(cur.Kvs) > 0 {
		return fmt.Errorf("%w: a newer heartbeat stream of node %s took over", errConflict, h.id)
	}
	// Nobody holds the key (a newer stream came and went): take it back.
	return h.record(ctx, now, false)
}

// expire ends the node's health at its deadline: the exact time of the last
// heartbeat goes into heartbeats-seen/<id>, the heartbeat key and the lease
// go away. A key that a newer stream holds is left alone.
func (h *heartbeatStream) expire(ctx context.Context) {
	if h.lease == 0 {
		return
	}
	s := h.s
	_, err := s.lead.txn(ctx,
		[]clientv3.Cmp{nodeExists(h.id), clientv3.Compare(clientv3.LeaseValue(keys.Heartbeat(h.id)), "=", h.lease)},
		clientv3.OpPut(keys.HeartbeatSeen(h.id), h.last.UTC().Format(time.RFC3339Nano)),
		clientv3.OpDelete(keys.Heartbeat(h.id)))
	if err == nil {
		s.log.Info("node heartbeat timed out", "node", h.id, "last_heartbeat", h.last)
	}
	h.revoke()
}

// revoke drops the stream's lease (and a key still bound to it).
func (h *heartbeatStream) revoke() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := h.s.etcd.Revoke(ctx, h.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		h.s.log.Debug("revoke heartbeat lease", "node", h.id, "err", err)
	}
	h.lease = 0
}

// finish schedules the expiry of the stream's last heartbeat: the node stays
// HEALTHY for HeartbeatTimeout after it, in which it may come back on a new
// stream (which takes the key over, so that this expiry changes nothing).
func (h *heartbeatStream) finish() {
	if h.lease == 0 {
		return
	}
	time.AfterFunc(time.Until(h.last.Add(h.s.cfg.HeartbeatTimeout)), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h.expire(ctx)
	})
}

func nodeExists(id string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(keys.Node(id)), ">", 0)
}

// heartbeatRecord is what etcd holds about one node's heartbeats: its
// heartbeats/<id> key (alive) and its heartbeats-seen/<id> key (seen), each
// with the time it holds. A time that does not parse is zero: the key is
// there, the time unknown.
type heartbeatRecord struct {
	alive, seen     bool
	aliveAt, seenAt time.Time
}

// with is r after a change of key (one of the node's two heartbeat keys) to
// value, or its deletion.
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

// heartbeatNode is the node whose heartbeat key is key ("" for a key of
// neither heartbeat prefix).
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
