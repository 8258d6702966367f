package curator

import (
	"context"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
	"curia.dev/platform/records"
	"curia.dev/platform/rpcerr"
)

// The cluster configuration (ClusterConfig) is one record,
// keys.ClusterConfig, written whole by UpdateClusterConfig: read, apply the
// mask, check the result, write it with its audit event in one
// leader-fenced transaction guarded by the record's revision as read. Its
// revision is the key's ModRevision (0: never written, all defaults).

func (x *managementServer) GetClusterConfig(ctx context.Context, _ *curatorv1.GetClusterConfigRequest) (*curatorv1.GetClusterConfigResponse, error) {
	c, rev, err := x.s.readClusterConfig(ctx)
	if err != nil {
		return nil, err
	}
	return &curatorv1.GetClusterConfigResponse{Config: c, Revision: rev}, nil
}

// WatchClusterConfig sends the configuration as read, then every change
// from this replica's etcd watch of its key, from the read's revision on:
// none is missed, none sent twice.
func (x *managementServer) WatchClusterConfig(_ *curatorv1.WatchClusterConfigRequest, stream curatorv1.Management_WatchClusterConfigServer) error {
	ctx := stream.Context()
	resp, err := x.s.etcd.Get(ctx, keys.ClusterConfig)
	if err != nil {
		return fmt.Errorf("%w: read cluster config: %v", errUnavailable, err)
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
	for w := range x.s.etcd.Watch(clientv3.WithRequireLeader(ctx), keys.ClusterConfig, clientv3.WithRev(resp.Header.Revision+1)) {
		if err := w.Err(); err != nil {
			return fmt.Errorf("%w: watch cluster config: %v; watch again", errUnavailable, err)
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
	return fmt.Errorf("%w: the watch of the cluster config ended; watch again", errUnavailable)
}

// sendClusterConfig sends the configuration record kv holds (nil: none).
func sendClusterConfig(stream curatorv1.Management_WatchClusterConfigServer, kv *mvccpb.KeyValue) error {
	c, rev, err := clusterConfigOf(kv)
	if err != nil {
		return err
	}
	return stream.Send(&curatorv1.WatchClusterConfigResponse{Config: c, Revision: rev})
}

func (x *managementServer) UpdateClusterConfig(ctx context.Context, req *curatorv1.UpdateClusterConfigRequest) (*curatorv1.UpdateClusterConfigResponse, error) {
	return x.s.updateClusterConfig(ctx, req)
}

// readClusterConfig reads the cluster configuration, defaults filled in,
// and its revision.
func (s *Service) readClusterConfig(ctx context.Context) (*curatorv1.ClusterConfig, int64, error) {
	resp, err := s.etcd.Get(ctx, keys.ClusterConfig)
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
		return nil, 0, fmt.Errorf("%w: the cluster configuration record %s does not decode (%v): restore it from a backup, or delete the key (etcdctl del %s) to go back to the defaults and set it again with UpdateClusterConfig", errCorrupt, keys.ClusterConfig, err, keys.ClusterConfig)
	}
	return c, kv.ModRevision, nil
}

// updateClusterConfig applies req to the stored configuration. Without
// expected_revision, a write that finds the record changed since it was
// read decides again on the new record (retryConflicts), so two updates of
// different fields both land; with it, the caller decided on that revision,
// and any other is CONFLICT at once.
func (s *Service) updateClusterConfig(ctx context.Context, req *curatorv1.UpdateClusterConfigRequest) (*curatorv1.UpdateClusterConfigResponse, error) {
	attempt := func() (*curatorv1.UpdateClusterConfigResponse, error) {
		cur, rev, err := s.readClusterConfig(ctx)
		if err != nil {
			return nil, err
		}
		if want := req.GetExpectedRevision(); want != 0 && want != rev {
			return nil, fmt.Errorf("%w: the cluster configuration is at revision %d, not expected_revision %d: read it again and decide again", errConflict, rev, want)
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
		resp, err := s.lead.Txn(ctx, []clientv3.Cmp{guard},
			clientv3.OpPut(keys.ClusterConfig, string(b)),
			s.audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_CLUSTER_CONFIG_UPDATE, "", reason+": "+changes))
		if err != nil {
			return nil, fmt.Errorf("write cluster configuration over revision %d: %w", rev, err)
		}
		s.log.Info("cluster config updated", "changes", changes, "revision", resp.Header.Revision, "by", caller(ctx).String())
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
