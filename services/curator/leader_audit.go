package curator

import (
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/rpcerr"
)

// WatchAuditLog backlog: how many past events by default, and at most.
const (
	auditBacklogDefault = 100
	auditBacklogMax     = 10000
)

// WatchAuditLog streams the audit log (keys.AuditPrefix): the last backlog
// events in the order they were committed, newest last, then — unless
// no_follow — every new event, from the revision right after the read, so
// that nothing is missed or sent twice. With start_revision it resumes a
// stream that broke: every event after that revision, then new ones.
func (x *managementServer) WatchAuditLog(req *curatorv1.WatchAuditLogRequest, stream curatorv1.Management_WatchAuditLogServer) error {
	return x.s.watchAudit(req, stream)
}

func (s *Service) watchAudit(req *curatorv1.WatchAuditLogRequest, stream curatorv1.Management_WatchAuditLogServer) error {
	ctx := stream.Context()
	backlog := req.GetBacklog()
	// backlog and start_revision >= 0, and start_revision without backlog
	// or no_follow: the request's contract.
	switch {
	case backlog == 0:
		backlog = auditBacklogDefault
	case backlog > auditBacklogMax:
		backlog = auditBacklogMax // "at most": the newest auditBacklogMax
	}
	send := func(kv *mvccpb.KeyValue) error {
		ev := &auditv1.Event{}
		if err := proto.Unmarshal(kv.Value, ev); err != nil {
			s.log.Warn("unreadable audit event", "key", string(kv.Key), "err", err)
			return nil
		}
		return stream.Send(&curatorv1.WatchAuditLogResponse{Event: ev, Revision: kv.ModRevision})
	}

	from := req.GetStartRevision() + 1
	if req.GetStartRevision() == 0 {
		// The newest events by commit order. (etcd sorts the whole range
		// to find them: fine for a log of membership and role changes,
		// bounded by the retention.)
		resp, err := s.etcd.Get(ctx, keys.AuditPrefix, clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend), clientv3.WithLimit(backlog))
		if err != nil {
			return fmt.Errorf("%w: read audit log: %v", errUnavailable, err)
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
	for wr := range s.etcd.Watch(wctx, keys.AuditPrefix, clientv3.WithPrefix(), clientv3.WithRev(from)) {
		if wr.CompactRevision != 0 {
			return fmt.Errorf("%w: events after revision %d are compacted away (etcd keeps about an hour; the oldest left is at %d): watch again without start_revision", rpcerr.OutOfRange, from-1, wr.CompactRevision)
		}
		if err := wr.Err(); err != nil {
			return fmt.Errorf("%w: follow audit log: %v", errUnavailable, err)
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
	return fmt.Errorf("%w: the audit log watch ended; watch again", errUnavailable)
}
