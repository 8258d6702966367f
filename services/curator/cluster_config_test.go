package curator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/records"
	"curia.dev/platform/rpcerr"
	cut "curia.dev/services/curator/curatortest"
)

// configUpdate is an UpdateClusterConfigRequest of c for the mask paths.
func configUpdate(c *curatorv1.ClusterConfig, reason string, paths ...string) *curatorv1.UpdateClusterConfigRequest {
	return &curatorv1.UpdateClusterConfigRequest{Config: c, UpdateMask: &fieldmaskpb.FieldMask{Paths: paths}, Reason: reason}
}

// configGet reads the cluster configuration and its revision.
func configGet(t *testing.T, m curatorv1.ManagementClient) (*curatorv1.ClusterConfig, int64) {
	t.Helper()
	resp, err := m.GetClusterConfig(ctxT(t), &curatorv1.GetClusterConfigRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Config, resp.Revision
}

// configEvents is every CLUSTER_CONFIG_UPDATE event of the audit log.
func configEvents(t *testing.T, m curatorv1.ManagementClient) []*auditv1.Event {
	t.Helper()
	var out []*auditv1.Event
	for _, ev := range cut.AuditLog(t, m) {
		if ev.Action == auditv1.AuditAction_AUDIT_ACTION_CLUSTER_CONFIG_UPDATE {
			out = append(out, ev)
		}
	}
	return out
}

// TestClusterConfig: defaults until the first write; an update changes
// the fields its mask names and nothing else, in one write with one audit
// event (none for validate_only or an update that changes nothing); the
// resulting config is checked as a whole; expected_revision is a
// compare-and-set; followers forward; and an update decided on a record
// that changed before its write decides again instead of undoing the other
// change.
func TestClusterConfig(t *testing.T) {
	c := cut.New(t, 2)
	ctx := ctxT(t)
	leader := c.Leader()
	m := curatorv1.NewManagementClient(c.Conn(leader, cut.Admin))
	viaFollower := curatorv1.NewManagementClient(c.Conn(leaseFollower(c), cut.Admin))
	etcd := c.Etcd(c.Voters[0].ClientURL)
	want := records.DefaultClusterConfig()
	wantEvents := 0
	// update makes a real change and checks the answer and what Get reads.
	update := func(t *testing.T, m curatorv1.ManagementClient, req *curatorv1.UpdateClusterConfigRequest) int64 {
		t.Helper()
		_, before := configGet(t, m)
		resp, err := m.UpdateClusterConfig(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		got, rev := configGet(t, m)
		if !proto.Equal(resp.Config, want) || !proto.Equal(got, want) || resp.Revision != rev || rev <= before {
			t.Fatalf("after the update: answered %v at %d, read %v at %d (before: %d), want %v", resp.Config, resp.Revision, got, rev, before, want)
		}
		wantEvents++
		return rev
	}

	t.Run("defaults before any write", func(t *testing.T) {
		got, rev := configGet(t, m)
		if !proto.Equal(got, want) || rev != 0 {
			t.Fatalf("got %v at revision %d, want the defaults %v at 0", got, rev, want)
		}
	})

	t.Run("validate_only writes nothing", func(t *testing.T) {
		req := configUpdate(&curatorv1.ClusterConfig{ControlPlaneSize: 3}, "try", "control_plane_size")
		req.ValidateOnly = true
		resp, err := m.UpdateClusterConfig(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Config.ControlPlaneSize != 3 || resp.Revision != 0 {
			t.Fatalf("validate_only answered %v at %d, want size 3 at revision 0", resp.Config, resp.Revision)
		}
		if got, err := etcd.Get(ctx, keys.ClusterConfig); err != nil || len(got.Kvs) != 0 {
			t.Fatalf("validate_only wrote %v (%v)", got, err)
		}
	})

	var rev int64
	t.Run("the mask says what changes", func(t *testing.T) {
		// min_quorum and stabilization are set but not in the mask.
		req := configUpdate(&curatorv1.ClusterConfig{ControlPlaneSize: 3, MinQuorum: 2, Stabilization: durationpb.New(time.Minute), Paused: true, PauseReason: "upgrade"}, "three voters", "control_plane_size", "paused", "pause_reason")
		want.ControlPlaneSize, want.Paused, want.PauseReason = 3, true, "upgrade"
		rev = update(t, m, req)
	})

	t.Run("an update that changes nothing writes nothing", func(t *testing.T) {
		resp, err := m.UpdateClusterConfig(ctx, configUpdate(&curatorv1.ClusterConfig{ControlPlaneSize: 3}, "again", "control_plane_size"))
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(resp.Config, want) || resp.Revision != rev {
			t.Fatalf("no-op answered %v at %d, want %v at %d", resp.Config, resp.Revision, want, rev)
		}
		if _, now := configGet(t, m); now != rev {
			t.Fatalf("no-op wrote: revision %d, was %d", now, rev)
		}
	})

	t.Run("the resulting config is checked", func(t *testing.T) {
		want.MinQuorum = 3
		rev = update(t, m, configUpdate(&curatorv1.ClusterConfig{MinQuorum: 3}, "", "min_quorum"))
		tests := map[string]struct {
			req      *curatorv1.UpdateClusterConfigRequest
			contains string
		}{
			"min_quorum above the stored size": {configUpdate(&curatorv1.ClusterConfig{MinQuorum: 4}, "", "min_quorum"), "config.min_quorum 4 exceeds config.control_plane_size 3"},
			"size below the stored min_quorum": {configUpdate(&curatorv1.ClusterConfig{MinQuorum: 3, ControlPlaneSize: 1}, "", "control_plane_size"), "config.min_quorum 3 exceeds config.control_plane_size 1"},
			"min_quorum masked but zero":       {configUpdate(&curatorv1.ClusterConfig{}, "", "min_quorum"), "config.min_quorum must be 1 to 7, not 0"},
			"duration masked but unset":        {configUpdate(&curatorv1.ClusterConfig{}, "", "dead_node_threshold"), "config.dead_node_threshold is in update_mask but not set: give it a value (the default is 5m0s)"},
			"unknown path":                     {configUpdate(&curatorv1.ClusterConfig{}, "", "paused", "size"), `unknown path "size": paths are the fields of ClusterConfig (control_plane_size, dead_node_threshold, min_quorum, stabilization, paused, pause_reason)`},
			"wildcard":                         {configUpdate(&curatorv1.ClusterConfig{}, "", "*"), `unknown path "*"`},
			"empty mask":                       {configUpdate(&curatorv1.ClusterConfig{}, ""), "update_mask: must name at least one field of ClusterConfig"},
		}
		for name, tc := range tests {
			t.Run(name, func(t *testing.T) {
				_, err := m.UpdateClusterConfig(ctx, tc.req)
				wantCode(t, err, codes.InvalidArgument, tc.contains)
			})
		}
		if _, now := configGet(t, m); now != rev {
			t.Fatalf("a refused update wrote: revision %d, was %d", now, rev)
		}
		// The second case is valid once min_quorum moves with it.
		want.ControlPlaneSize, want.MinQuorum = 1, 1
		rev = update(t, m, configUpdate(&curatorv1.ClusterConfig{ControlPlaneSize: 1, MinQuorum: 1}, "one voter", "control_plane_size", "min_quorum"))
	})

	t.Run("expected_revision", func(t *testing.T) {
		req := configUpdate(&curatorv1.ClusterConfig{DeadNodeThreshold: durationpb.New(time.Hour)}, "slow disks", "dead_node_threshold")
		req.ExpectedRevision = rev - 1
		_, err := m.UpdateClusterConfig(ctx, req)
		wantKind(t, err, rpcerr.Conflict, "", "not expected_revision")
		req.ExpectedRevision = rev
		want.DeadNodeThreshold = durationpb.New(time.Hour)
		rev = update(t, m, req)
	})

	t.Run("through a follower", func(t *testing.T) {
		want.Stabilization = durationpb.New(30 * time.Second)
		rev = update(t, viaFollower, configUpdate(&curatorv1.ClusterConfig{Stabilization: durationpb.New(30 * time.Second)}, "via follower", "stabilization"))
	})

	// meanwhile writes the record as an update of dead_node_threshold that
	// landed between another update's read and its write would.
	meanwhile := func(t *testing.T) {
		stored, _ := configGet(t, m)
		stored.DeadNodeThreshold = durationpb.New(stored.DeadNodeThreshold.AsDuration() + time.Hour)
		want.DeadNodeThreshold = stored.DeadNodeThreshold
		b, err := records.EncodeClusterConfig(stored)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := etcd.Put(ctx, keys.ClusterConfig, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	// held runs req on the leader while it is held before its write, runs
	// meanwhile, and returns how req ended.
	held := func(t *testing.T, req *curatorv1.UpdateClusterConfigRequest) (*curatorv1.UpdateClusterConfigResponse, error) {
		t.Helper()
		release := leader.Hold("before-cluster-config-write")
		type result struct {
			resp *curatorv1.UpdateClusterConfigResponse
			err  error
		}
		done := make(chan result, 1)
		go func() {
			resp, err := m.UpdateClusterConfig(ctx, req)
			done <- result{resp, err}
		}()
		leader.Reached("before-cluster-config-write")
		meanwhile(t)
		release()
		select {
		case r := <-done:
			return r.resp, r.err
		case <-time.After(time.Minute):
			t.Fatal("UpdateClusterConfig did not return")
			return nil, nil
		}
	}

	t.Run("concurrent updates of different fields both land", func(t *testing.T) {
		resp, err := held(t, configUpdate(&curatorv1.ClusterConfig{Paused: false}, "resume", "paused"))
		if err != nil {
			t.Fatal(err)
		}
		want.Paused = false
		got, now := configGet(t, m)
		if !proto.Equal(got, want) || !proto.Equal(resp.Config, want) || resp.Revision != now {
			t.Fatalf("after concurrent updates: answered %v at %d, read %v at %d, want %v (both changes)", resp.Config, resp.Revision, got, now, want)
		}
		rev = now
		wantEvents++ // the direct write has none
	})

	t.Run("expected_revision: a change before the write is CONFLICT", func(t *testing.T) {
		req := configUpdate(&curatorv1.ClusterConfig{PauseReason: "never written"}, "", "pause_reason")
		req.ExpectedRevision = rev
		_, err := held(t, req)
		wantKind(t, err, rpcerr.Conflict, "", "revision")
		got, now := configGet(t, m)
		if !proto.Equal(got, want) {
			t.Fatalf("after a refused update: %v, want %v", got, want)
		}
		rev = now
	})

	t.Run("one audit event per change, with caller and reason", func(t *testing.T) {
		events := configEvents(t, m)
		if len(events) != wantEvents {
			t.Fatalf("%d CLUSTER_CONFIG_UPDATE events, want %d: %v", len(events), wantEvents, events)
		}
		first, follower := events[0], events[len(events)-2]
		if first.Actor != "admin/test" || first.NodeId != "" || len(first.Fence) == 0 ||
			first.Reason != `three voters: control_plane_size=3 (was 0), paused=true (was false), pause_reason="upgrade" (was "")` {
			t.Fatalf("first event: %v", first)
		}
		if follower.Actor != "admin/test" || !strings.HasPrefix(follower.Reason, "via follower: stabilization=30s (was 2s)") || follower.RecordedBy != "curator/"+leader.Name {
			t.Fatalf("event of the update through a follower: %v", follower)
		}
	})
}

// TestClusterConfigCorrupt: a configuration record that does not decode is
// DataLoss, with the way out, for reads and updates alike.
func TestClusterConfigCorrupt(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	m := c.Management()
	if _, err := c.Etcd(c.Voters[0].ClientURL).Put(ctx, keys.ClusterConfig, "\xff\xfe not a config record"); err != nil {
		t.Fatal(err)
	}
	_, err := m.GetClusterConfig(ctx, &curatorv1.GetClusterConfigRequest{})
	wantCode(t, err, codes.DataLoss, "etcdctl del "+keys.ClusterConfig)
	_, err = m.UpdateClusterConfig(context.Background(), configUpdate(&curatorv1.ClusterConfig{Paused: true}, "", "paused"))
	wantCode(t, err, codes.DataLoss, "does not decode")
}

// TestWatchClusterConfig: through a follower (which answers it itself),
// the stream sends the configuration as read, then each update as
// GetClusterConfig would answer it at the update's revision, in order, and
// the defaults at revision 0 once the record is deleted; a record that
// does not decode ends the stream with DataLoss and the way out.
func TestWatchClusterConfig(t *testing.T) {
	c := cut.New(t, 2)
	ctx := ctxT(t)
	m := curatorv1.NewManagementClient(c.Conn(c.Leader(), cut.Admin))
	etcd := c.Etcd(c.Voters[0].ClientURL)
	stream, err := curatorv1.NewManagementClient(c.Conn(leaseFollower(c), pki.Principal{Kind: pki.KindReconciler})).WatchClusterConfig(ctx, &curatorv1.WatchClusterConfigRequest{})
	if err != nil {
		t.Fatal(err)
	}
	next := func(t *testing.T, want *curatorv1.ClusterConfig, rev int64) {
		t.Helper()
		got, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got.Config, want) || got.Revision != rev {
			t.Fatalf("got %v at revision %d, want %v at %d", got.Config, got.Revision, want, rev)
		}
	}
	want := records.DefaultClusterConfig()
	next(t, want, 0)
	for _, size := range []uint32{3, 5} {
		resp, err := m.UpdateClusterConfig(ctx, configUpdate(&curatorv1.ClusterConfig{ControlPlaneSize: size}, "", "control_plane_size"))
		if err != nil {
			t.Fatal(err)
		}
		want.ControlPlaneSize = size
		next(t, want, resp.Revision)
	}
	if _, err := etcd.Delete(ctx, keys.ClusterConfig); err != nil {
		t.Fatal(err)
	}
	next(t, records.DefaultClusterConfig(), 0)
	if _, err := etcd.Put(ctx, keys.ClusterConfig, "\xff\xfe not a config record"); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	wantCode(t, err, codes.DataLoss, "etcdctl del "+keys.ClusterConfig)
}
