package curator

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"curia.dev/platform/keys"
)

// AuditRetention bounds the audit log, so that etcd does not grow forever:
// the leader deletes events older than MaxAge and the oldest beyond
// MaxEvents, every Every.
type AuditRetention struct {
	MaxAge    time.Duration
	MaxEvents int64
	Every     time.Duration
}

// auditPruneBatch bounds one deletion, so that a first prune of a long log
// is many small etcd requests rather than one huge one.
const auditPruneBatch = 10000

// pruneAuditLog applies the retention while this replica leads.
func (s *Service) pruneAuditLog(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Audit.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if _, _, ok := s.lead.Ours(); !ok {
			continue
		}
		n, err := s.pruneAudit(ctx, time.Now())
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.Warn("prune the audit log", "err", err)
		case n > 0:
			s.log.Info("pruned the audit log", "deleted", n, "max_age", s.cfg.Audit.MaxAge, "max_events", s.cfg.Audit.MaxEvents)
		}
	}
}

// pruneAudit deletes what the retention no longer keeps and returns how
// many events went. Each deletion is a range ending at an event key, written
// under the leader's term (lead.Txn): a deposed leader deletes nothing.
func (s *Service) pruneAudit(ctx context.Context, now time.Time) (int64, error) {
	var deleted int64
	// Age: keys sort by time, so everything before the cutoff's key.
	resp, err := s.lead.Txn(ctx, nil, clientv3.OpDelete(keys.AuditPrefix, clientv3.WithRange(keys.Audit(now.Add(-s.cfg.Audit.MaxAge), ""))))
	if err != nil {
		return 0, fmt.Errorf("delete events older than %v: %w", s.cfg.Audit.MaxAge, err)
	}
	deleted += resp.Responses[0].GetResponseDeleteRange().GetDeleted()
	// Count: the oldest beyond MaxEvents, a batch at a time.
	for {
		count, err := s.etcd.Get(ctx, keys.AuditPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return deleted, fmt.Errorf("count audit events: %w", err)
		}
		excess := min(count.Count-s.cfg.Audit.MaxEvents, auditPruneBatch)
		if excess <= 0 {
			return deleted, nil
		}
		oldest, err := s.etcd.Get(ctx, keys.AuditPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend), clientv3.WithLimit(excess))
		if err != nil {
			return deleted, fmt.Errorf("read the oldest audit events: %w", err)
		}
		if len(oldest.Kvs) == 0 {
			return deleted, nil
		}
		last := string(oldest.Kvs[len(oldest.Kvs)-1].Key)
		resp, err := s.lead.Txn(ctx, nil, clientv3.OpDelete(keys.AuditPrefix, clientv3.WithRange(last+"\x00")))
		if err != nil {
			return deleted, fmt.Errorf("delete the oldest %d audit events: %w", len(oldest.Kvs), err)
		}
		deleted += resp.Responses[0].GetResponseDeleteRange().GetDeleted()
	}
}
