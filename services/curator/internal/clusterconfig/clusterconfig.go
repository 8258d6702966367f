// Package clusterconfig is the cluster configuration (ClusterConfig): one
// record, keys.ClusterConfig, written whole by UpdateClusterConfig: read,
// apply the mask, check the result, write it with its audit event in one
// transaction, guarded by the curator leader's term and by the record's
// revision as read. Its revision is the key's ModRevision (0: never
// written, all defaults). It gets the etcd client, the leadership's guarded
// write and the audit log's event.
package clusterconfig

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
	"curia.dev/platform/records"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
)

// Leadership is this replica's leadership.
type Leadership interface {
	// Txn runs ops in a transaction guarded by this replica's term, plus
	// cmps: a lost term is rpcerr.NotLeader, failed cmps rpcerr.Conflict.
	Txn(ctx context.Context, cmps []clientv3.Cmp, ops ...clientv3.Op) (*clientv3.TxnResponse, error)
}

// Audit is the audit log's event, written in the change's transaction.
type Audit interface {
	Op(ctx context.Context, action auditv1.AuditAction, nodeID, reason string) clientv3.Op
}

// Record is the cluster configuration record, as one curator replica
// reads and writes it.
type Record struct {
	etcd  *clientv3.Client
	lead  Leadership
	audit Audit
	log   *slog.Logger
}

// New returns the record, read through etcd and written through lead.
func New(etcd *clientv3.Client, lead Leadership, audit Audit, log *slog.Logger) *Record {
	return &Record{etcd: etcd, lead: lead, audit: audit, log: log}
}

// Get is Management/GetClusterConfig.
func (r *Record) Get(ctx context.Context) (*curatorv1.GetClusterConfigResponse, error) {
	c, rev, err := r.read(ctx)
	if err != nil {
		return nil, err
	}
	return &curatorv1.GetClusterConfigResponse{Config: c, Revision: rev}, nil
}

// Watch is Management/WatchClusterConfig: the configuration as read, then
// every change from this replica's etcd watch of its key, from the read's
// revision on: none is missed, none sent twice.
func (r *Record) Watch(stream curatorv1.Management_WatchClusterConfigServer) error {
	ctx := stream.Context()
	resp, err := r.etcd.Get(ctx, keys.ClusterConfig)
	if err != nil {
		return fmt.Errorf("%w: read cluster config: %v", rpcerr.Unavailable, err)
	}
	var kv *mvccpb.KeyValue
	if len(resp.Kvs) > 0 {
		kv = resp.Kvs[0]
	}
	if err := sendClusterConfig(stream, kv); err != nil {
		return err
	}
	// Require a leader: a replica cut off from the quorum ends the stream
	// instead of holding it silent; the client watches again, anywhere.
	for w := range r.etcd.Watch(clientv3.WithRequireLeader(ctx), keys.ClusterConfig, clientv3.WithRev(resp.Header.Revision+1)) {
		if err := w.Err(); err != nil {
			return fmt.Errorf("%w: watch cluster config: %v; watch again", rpcerr.Unavailable, err)
		}
		for _, ev := range w.Events {
			kv := ev.Kv
			if ev.Type == mvccpb.DELETE {
				kv = nil
			}
			if err := sendClusterConfig(stream, kv); err != nil {
				return err
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: the watch of the cluster config ended; watch again", rpcerr.Unavailable)
}

// sendClusterConfig sends the configuration record kv holds (nil: none).
func sendClusterConfig(stream curatorv1.Management_WatchClusterConfigServer, kv *mvccpb.KeyValue) error {
	c, rev, err := clusterConfigOf(kv)
	if err != nil {
		return err
	}
	return stream.Send(&curatorv1.WatchClusterConfigResponse{Config: c, Revision: rev})
}

// read reads the cluster configuration, defaults filled in, and its
// revision.
func (r *Record) read(ctx context.Context) (*curatorv1.ClusterConfig, int64, error) {
	resp, err := r.etcd.Get(ctx, keys.ClusterConfig)
	if err != nil {
		return nil, 0, fmt.Errorf("read cluster config: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return clusterConfigOf(nil)
	}
	return clusterConfigOf(resp.Kvs[0])
}

// clusterConfigOf is the configuration the record kv holds, defaults
// filled in, and its revision; for no record (nil: never written, or
// deleted), the defaults at revision 0.
func clusterConfigOf(kv *mvccpb.KeyValue) (*curatorv1.ClusterConfig, int64, error) {
	if kv == nil {
		return records.DefaultClusterConfig(), 0, nil
	}
	c, err := records.DecodeClusterConfig(kv.Value)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: the cluster configuration record %s does not decode (%v): restore it from a backup, or delete the key (etcdctl del %s) to go back to the defaults and set it again with UpdateClusterConfig", rpcerr.Corrupt, keys.ClusterConfig, err, keys.ClusterConfig)
	}
	return c, kv.ModRevision, nil
}

// Update is Management/UpdateClusterConfig: it applies req to the stored
// configuration. Without expected_revision, a write that finds the record
// changed since it was read decides again on the new record
// (rpcerr.RetryConflicts), so two updates of different fields both land;
// with it, the caller decided on that revision, and any other is CONFLICT
// at once.
func (r *Record) Update(ctx context.Context, req *curatorv1.UpdateClusterConfigRequest) (*curatorv1.UpdateClusterConfigResponse, error) {
	attempt := func() (*curatorv1.UpdateClusterConfigResponse, error) {
		cur, rev, err := r.read(ctx)
		if err != nil {
			return nil, err
		}
		if want := req.GetExpectedRevision(); want != 0 && want != rev {
			return nil, fmt.Errorf("%w: the cluster configuration is at revision %d, not expected_revision %d: read it again and decide again", rpcerr.Conflict, rev, want)
		}
		next, err := records.ClusterConfigWithMask(cur, req.GetConfig(), req.GetUpdateMask().GetPaths())
		if err != nil {
			return nil, err
		}
		if err := records.CheckClusterConfig(next); err != nil {
			return nil, err
		}
		if req.GetValidateOnly() || proto.Equal(next, cur) {
			return &curatorv1.UpdateClusterConfigResponse{Config: next, Revision: rev}, nil
		}
		b, err := records.EncodeClusterConfig(next)
		if err != nil {
			return nil, err
		}
		changes := configChanges(cur, next)
		reason := req.GetReason()
		if reason == "" {
			reason = "UpdateClusterConfig"
		}
		failpoint.Hold("before-cluster-config-write")
		guard := clientv3.Compare(clientv3.ModRevision(keys.ClusterConfig), "=", rev)
		resp, err := r.lead.Txn(ctx, []clientv3.Cmp{guard},
			clientv3.OpPut(keys.ClusterConfig, string(b)),
			r.audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_CLUSTER_CONFIG_UPDATE, "", reason+": "+changes))
		if err != nil {
			return nil, fmt.Errorf("write cluster configuration over revision %d: %w", rev, err)
		}
		who, _ := rpc.PrincipalFromContext(ctx)
		r.log.Info("cluster config updated", "changes", changes, "revision", resp.Header.Revision, "by", who.String())
		return &curatorv1.UpdateClusterConfigResponse{Config: next, Revision: resp.Header.Revision}, nil
	}
	if req.GetExpectedRevision() != 0 {
		return attempt()
	}
	return rpcerr.RetryConflicts(ctx, "update cluster config", attempt)
}

// configChanges says which fields differ from old to next, with both
// values, as the audit event's reason records it.
func configChanges(old, next *curatorv1.ClusterConfig) string {
	var out []string
	fields := old.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if was, is := records.ClusterConfigValue(old, f), records.ClusterConfigValue(next, f); was != is {
			out = append(out, fmt.Sprintf("%s=%s (was %s)", f.Name(), is, was))
		}
	}
	return strings.Join(out, ", ")
}
