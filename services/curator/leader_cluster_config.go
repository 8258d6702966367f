package curator

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
	"curia.dev/platform/records"
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
		return records.DefaultClusterConfig(), 0, nil
	}
	c, err := records.DecodeClusterConfig(resp.Kvs[0].Value)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: the cluster configuration record %s does not decode (%v): restore it from a backup, or delete the key (etcdctl del %s) to go back to the defaults and set it again with UpdateClusterConfig", errCorrupt, keys.ClusterConfig, err, keys.ClusterConfig)
	}
	return c, resp.Kvs[0].ModRevision, nil
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
		resp, err := s.lead.txn(ctx, []clientv3.Cmp{guard},
			clientv3.OpPut(keys.ClusterConfig, string(b)),
			s.auditOp(ctx, auditv1.AuditAction_AUDIT_ACTION_CLUSTER_CONFIG_UPDATE, "", reason+": "+changes))
		if err != nil {
			return nil, fmt.Errorf("write cluster configuration over revision %d: %w", rev, err)
		}
		s.log.Info("cluster config updated", "changes", changes, "revision", resp.Header.Revision, "by", caller(ctx).String())
		return &curatorv1.UpdateClusterConfigResponse{Config: next, Revision: resp.Header.Revision}, nil
	}
	if req.GetExpectedRevision() != 0 {
		return attempt()
	}
	return retryConflicts(ctx, "update cluster config", attempt)
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
