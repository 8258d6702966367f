// Package auditlog is the curator's side of the audit log
// (keys.AuditPrefix, curia.audit.v1.Event): the event its leader writes in
// the same transaction as each change it makes, WatchAuditLog's backlog and
// stream, and the retention that bounds the log.
//
// It gets the etcd client, the replica's leadership (its fence, and writes
// guarded by its term) and its name; nothing else of the curator.
package auditlog

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/audit"
	"curia.dev/platform/fence"
	"curia.dev/platform/keys"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
)

// Leadership is this replica's leadership.
type Leadership interface {
	// Ours is the leader key and term while this replica leads.
	Ours() (key string, term int64, ok bool)
	// Fence is the leader's fence, [leader key @ term]; rpcerr.NotLeader
	// when this replica does not lead.
	Fence() (fence.Fence, error)
	// Txn runs ops in a transaction guarded by this replica's term, plus
	// cmps: a lost term is rpcerr.NotLeader, failed cmps rpcerr.Conflict.
	Txn(ctx context.Context, cmps []clientv3.Cmp, ops ...clientv3.Op) (*clientv3.TxnResponse, error)
}

// Log is one curator replica's audit log.
type Log struct {
	etcd *clientv3.Client
	lead Leadership
	// recordedBy names this replica in the events it writes.
	recordedBy string
	retention  Retention
	log        *slog.Logger
}

// New returns the audit log of the replica name.
func New(etcd *clientv3.Client, lead Leadership, name string, retention Retention, log *slog.Logger) *Log {
	return &Log{etcd: etcd, lead: lead, recordedBy: "curator/" + name, retention: retention, log: log}
}

// Event is the event of a change the curator leader makes for the caller
// of ctx, under its own fence.
func (l *Log) Event(ctx context.Context, action auditv1.AuditAction, nodeID, reason string) *auditv1.Event {
	f, _ := l.lead.Fence()
	p, _ := rpc.PrincipalFromContext(ctx)
	return &auditv1.Event{
		Actor:      p.String(),
		RecordedBy: l.recordedBy,
		Action:     action,
		NodeId:     nodeID,
		Fence:      f.Strings(),
		Reason:     reason,
	}
}

// Op is the write of Event's event, for the transaction of the change.
func (l *Log) Op(ctx context.Context, action auditv1.AuditAction, nodeID, reason string) clientv3.Op {
	return audit.Put(l.Event(ctx, action, nodeID, reason))
}

// Record writes an event of its own, for what changes nothing in etcd (a
// snapshot, a defragmentation): under the leader's term, the reason cut to
// maxReason bytes.
func (l *Log) Record(ctx context.Context, action auditv1.AuditAction, reason string) error {
	_, err := l.lead.Txn(ctx, nil, l.Op(ctx, action, "", audit.Truncate(reason, maxReason)))
	return err
}

// maxReason bounds the reason of an event Record writes.
const maxReason = 2048

// Roles is which roles r holds, as the audit log records them.
func Roles(r *curatorv1.Roles) *auditv1.Roles {
	return &auditv1.Roles{
		ConsensusMember:      r.GetConsensusMember() != nil,
		KubernetesController: r.GetKubernetesController() != nil,
		KubernetesWorker:     r.GetKubernetesWorker() != nil,
	}
}

// WatchAuditLog backlog: how many past events by default, and at most.
const (
	backlogDefault = 100
	backlogMax     = 10000
)

// Watch is Management/WatchAuditLog: the last backlog events in the order
// they were committed, newest last, then — unless no_follow — every new
// event, from the revision right after the read, so that nothing is missed
// or sent twice. With start_revision it resumes a stream that broke: every
// event after that revision, then new ones.
func (l *Log) Watch(req *curatorv1.WatchAuditLogRequest, stream curatorv1.Management_WatchAuditLogServer) error {
	ctx := stream.Context()
	backlog := req.GetBacklog()
	// backlog and start_revision >= 0, and start_revision without backlog
	// or no_follow: the request's contract.
	switch {
	case backlog == 0:
		backlog = backlogDefault
	case backlog > backlogMax:
		backlog = backlogMax // "at most": the newest backlogMax
	}
	send := func(kv *mvccpb.KeyValue) error {
		ev := &auditv1.Event{}
		if err := proto.Unmarshal(kv.Value, ev); err != nil {
			l.log.Warn("unreadable audit event", "key", string(kv.Key), "err", err)
			return nil
		}
		return stream.Send(&curatorv1.WatchAuditLogResponse{Event: ev, Revision: kv.ModRevision})
	}

	from := req.GetStartRevision() + 1
	if req.GetStartRevision() == 0 {
		// The newest events by commit order. (etcd sorts the whole range
		// to find them: fine for a log of membership and role changes,
		// bounded by the retention.)
		resp, err := l.etcd.Get(ctx, keys.AuditPrefix, clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend), clientv3.WithLimit(backlog))
		if err != nil {
			return fmt.Errorf("%w: read audit log: %v", rpcerr.Unavailable, err)
		}
		for i := len(resp.Kvs) - 1; i >= 0; i-- {
			if err := send(resp.Kvs[i]); err != nil {
				return err
			}
		}
		if req.GetNoFollow() {
			return nil
		}
		from = resp.Header.Revision + 1
	}

	wctx := clientv3.WithRequireLeader(ctx)
	for wr := range l.etcd.Watch(wctx, keys.AuditPrefix, clientv3.WithPrefix(), clientv3.WithRev(from)) {
		if wr.CompactRevision != 0 {
			return fmt.Errorf("%w: events after revision %d are compacted away (etcd keeps about an hour; the oldest left is at %d): watch again without start_revision", rpcerr.OutOfRange, from-1, wr.CompactRevision)
		}
		if err := wr.Err(); err != nil {
			return fmt.Errorf("%w: follow audit log: %v", rpcerr.Unavailable, err)
		}
		for _, ev := range wr.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			if err := send(ev.Kv); err != nil {
				return err
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fmt.Errorf("%w: the audit log watch ended; watch again", rpcerr.Unavailable)
}

// Retention bounds the audit log, so that etcd does not grow forever:
// the leader deletes events older than MaxAge and the oldest beyond
// MaxEvents, every Every.
type Retention struct {
	MaxAge    time.Duration
	MaxEvents int64
	Every     time.Duration
}

// pruneBatch bounds one deletion, so that a first prune of a long log
// is many small etcd requests rather than one huge one.
const pruneBatch = 10000

// RunRetention applies the retention while this replica leads.
func (l *Log) RunRetention(ctx context.Context) error {
	t := time.NewTicker(l.retention.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if _, _, ok := l.lead.Ours(); !ok {
			continue
		}
		n, err := l.prune(ctx, time.Now())
		switch {
		case err != nil && ctx.Err() == nil:
			l.log.Warn("prune the audit log", "err", err)
		case n > 0:
			l.log.Info("pruned the audit log", "deleted", n, "max_age", l.retention.MaxAge, "max_events", l.retention.MaxEvents)
		}
	}
}

// prune deletes what the retention no longer keeps and returns how
// many events went. Each deletion is a range ending at an event key, written
// under the leader's term (lead.Txn): a deposed leader deletes nothing.
func (l *Log) prune(ctx context.Context, now time.Time) (int64, error) {
	var deleted int64
	// Age: keys sort by time, so everything before the cutoff's key.
	resp, err := l.lead.Txn(ctx, nil, clientv3.OpDelete(keys.AuditPrefix, clientv3.WithRange(keys.Audit(now.Add(-l.retention.MaxAge), ""))))
	if err != nil {
		return 0, fmt.Errorf("delete events older than %v: %w", l.retention.MaxAge, err)
	}
	deleted += resp.Responses[0].GetResponseDeleteRange().GetDeleted()
	// Count: the oldest beyond MaxEvents, a batch at a time.
	for {
		count, err := l.etcd.Get(ctx, keys.AuditPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return deleted, fmt.Errorf("count audit events: %w", err)
		}
		excess := min(count.Count-l.retention.MaxEvents, pruneBatch)
		if excess <= 0 {
			return deleted, nil
		}
		oldest, err := l.etcd.Get(ctx, keys.AuditPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend), clientv3.WithLimit(excess))
		if err != nil {
			return deleted, fmt.Errorf("read the oldest audit events: %w", err)
		}
		if len(oldest.Kvs) == 0 {
			return deleted, nil
		}
		last := string(oldest.Kvs[len(oldest.Kvs)-1].Key)
		resp, err := l.lead.Txn(ctx, nil, clientv3.OpDelete(keys.AuditPrefix, clientv3.WithRange(last+"\x00")))
		if err != nil {
			return deleted, fmt.Errorf("delete the oldest %d audit events: %w", len(oldest.Kvs), err)
		}
		deleted += resp.Responses[0].GetResponseDeleteRange().GetDeleted()
	}
}
