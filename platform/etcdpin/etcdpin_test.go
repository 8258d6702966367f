package etcdpin

// Integration tests against two real, in-process etcd clusters: a pin is a
// check of what a member answers, so it is tested against members that
// answer for different clusters.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"curia.dev/platform/etcdtest"
	"curia.dev/platform/keys"
)

const testTimeout = 20 * time.Second

// client is an etcd client on endpoints, checked by pin unless pin is nil.
func client(t *testing.T, pin *Pin, endpoints ...string) *clientv3.Client {
	t.Helper()
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if pin != nil {
		cfg.DialOptions = pin.DialOptions()
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func clusterID(ctx context.Context, t *testing.T, cli *clientv3.Client) uint64 {
	t.Helper()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatalf("member list: %v", err)
	}
	return resp.Header.GetClusterId()
}

func requireRefused(t *testing.T, what string, err error, pinned uint64) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: the other cluster's answer was accepted", what)
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("%s: code %v, want Unavailable: %v", what, status.Code(err), err)
	}
	var mis *MismatchError
	if !errors.As(err, &mis) || mis.Pinned != pinned {
		t.Fatalf("%s: want a MismatchError pinned to %s, got %v", what, types.ID(pinned), err)
	}
	if !strings.Contains(err.Error(), "pinned to cluster "+types.ID(pinned).String()) {
		t.Fatalf("%s: message does not name the pinned cluster: %v", what, err)
	}
}

// TestPinRefusesAnotherCluster: a client pinned to cluster A is refused,
// Unavailable, every answer of cluster B — a write (unary), a keep-alive
// (stream) — while a client with no pin takes them. A client on both
// clusters' members acknowledges only writes that cluster A holds.
func TestPinRefusesAnotherCluster(t *testing.T) {
	epA, epB := etcdtest.Start(t, "pin-a"), etcdtest.Start(t, "pin-b")
	ctx := testContext(t)

	pin := New(0)
	if err := pin.Learn(ctx, client(t, pin, epA)); err != nil {
		t.Fatal(err)
	}
	idA, idB := clusterID(ctx, t, client(t, nil, epA)), clusterID(ctx, t, client(t, nil, epB))
	if idA == idB {
		t.Fatalf("both clusters have id %s", types.ID(idA))
	}
	if pin.ID() != idA {
		t.Fatalf("pin learned %s, want cluster A %s", types.ID(pin.ID()), types.ID(idA))
	}

	unpinnedB := client(t, nil, epB)
	if _, err := unpinnedB.Put(ctx, "k", "unpinned"); err != nil {
		t.Fatalf("an unpinned client's write to cluster B: %v", err)
	}
	pinnedB := client(t, pin, epB)
	_, err := pinnedB.Put(ctx, "k", "pinned")
	requireRefused(t, "write to cluster B", err, idA)

	lease, err := unpinnedB.Grant(ctx, 60)
	if err != nil {
		t.Fatalf("grant in cluster B: %v", err)
	}
	// etcd's client retries a refused stream until its deadline: the
	// keep-alive is never answered.
	kctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = pinnedB.KeepAliveOnce(kctx, lease.ID)
	cancel()
	if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("keep-alive in cluster B: want refused, got %v", err)
	}

	// Round robin over a member of each: every acknowledged write is in
	// cluster A, none in B.
	both := client(t, pin, epA, epB)
	var acked []string
	for i := range 20 {
		k := "both/" + string(rune('a'+i))
		if _, err := both.Put(ctx, k, "v"); err == nil {
			acked = append(acked, k)
		} else if status.Code(err) != codes.Unavailable {
			t.Fatalf("write %s: %v", k, err)
		}
	}
	if len(acked) == 0 {
		t.Fatal("no write acknowledged through cluster A")
	}
	unpinnedA := client(t, nil, epA)
	for _, k := range acked {
		resp, err := unpinnedA.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 {
			t.Errorf("acknowledged write %s is not in cluster A", k)
		}
	}
}

// TestPinFollowsARecovery: a pin on cluster A moves to cluster B once B
// records that it superseded A, and never back to A, whatever A says.
func TestPinFollowsARecovery(t *testing.T) {
	epA, epB := etcdtest.Start(t, "pin-a"), etcdtest.Start(t, "pin-b")
	ctx := testContext(t)
	unpinnedA, unpinnedB := client(t, nil, epA), client(t, nil, epB)
	idA, idB := clusterID(ctx, t, unpinnedA), clusterID(ctx, t, unpinnedB)

	pin := New(idA)
	pinnedB := client(t, pin, epB)
	moved, err := pin.Follow(ctx, pinnedB, epB)
	if err != nil || moved {
		t.Fatalf("followed B with no record of a recovery: moved %v, err %v", moved, err)
	}
	if _, err := unpinnedB.Put(ctx, keys.Superseded(idA), types.ID(idB).String()); err != nil {
		t.Fatal(err)
	}
	if moved, err = pin.Follow(ctx, pinnedB, epB); err != nil || !moved || pin.ID() != idB {
		t.Fatalf("pin did not follow the recovery to %s: moved %v, pinned %s, err %v", types.ID(idB), moved, types.ID(pin.ID()), err)
	}
	if _, err := pinnedB.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("write to the cluster followed to: %v", err)
	}
	_, err = client(t, pin, epA).Put(ctx, "k", "v")
	requireRefused(t, "write to the superseded cluster", err, idB)

	// A superseded cluster claiming to have replaced the new one is not
	// followed back.
	if _, err := unpinnedA.Put(ctx, keys.Superseded(idB), types.ID(idA).String()); err != nil {
		t.Fatal(err)
	}
	if moved, err := pin.Follow(ctx, pinnedB, epA); err != nil || moved || pin.ID() != idB {
		t.Fatalf("pin followed back to a superseded cluster: moved %v, pinned %s, err %v", moved, types.ID(pin.ID()), err)
	}

	// A fresh pin learned through B follows B's records: pinned to B.
	fresh := New(0)
	if err := fresh.Learn(ctx, client(t, fresh, epB)); err != nil || fresh.ID() != idB || !fresh.Superseded(idA) {
		t.Fatalf("fresh pin: pinned %s, A superseded %v, err %v", types.ID(fresh.ID()), fresh.Superseded(idA), err)
	}
}

// TestRecordOnlyMovesForward: the chain of recoveries is followed to its
// end; a loop or a step back moves nothing.
func TestRecordOnlyMovesForward(t *testing.T) {
	tests := map[string]struct {
		pinned  uint64
		records [][2]uint64
		want    uint64
	}{
		"one recovery":         {pinned: 1, records: [][2]uint64{{1, 2}}, want: 2},
		"chain":                {pinned: 1, records: [][2]uint64{{2, 3}, {1, 2}}, want: 3},
		"another cluster's":    {pinned: 1, records: [][2]uint64{{5, 6}}, want: 1},
		"back to a superseded": {pinned: 1, records: [][2]uint64{{1, 2}, {2, 1}}, want: 2},
		"nothing pinned":       {pinned: 0, records: [][2]uint64{{1, 2}}, want: 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := New(tc.pinned)
			for _, r := range tc.records {
				p.record(r[0], r[1])
			}
			if p.ID() != tc.want {
				t.Fatalf("pinned %d, want %d", p.ID(), tc.want)
			}
		})
	}
	p := New(0)
	p.record(1, 2)
	if p.pin(1); p.ID() != 0 {
		t.Fatalf("learned superseded cluster 1")
	}
}
