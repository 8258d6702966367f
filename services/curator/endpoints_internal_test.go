package curator

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"

	"curia.dev/platform/etcdpin"
	"curia.dev/platform/etcdtest"
	"curia.dev/platform/keys"
)

// TestEndpointsFollowARecovery (issue 29, N4): a curator whose --etcd
// names members of two clusters, an old one and the one a recovery made
// of it, learns the old one first (its member answered first). One round
// of the endpoint probe finds the new cluster's record that it superseded
// the old one: the pin moves to the new cluster, only its member is an
// endpoint, and every write lands there.
func TestEndpointsFollowARecovery(t *testing.T) {
	oldEP, newEP := etcdtest.Start(t, "endpoints-old"), etcdtest.Start(t, "endpoints-new")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	plain := func(eps ...string) *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	oldCli, newCli := plain(oldEP), plain(newEP)
	id := func(cli *clientv3.Client) uint64 {
		resp, err := cli.Get(ctx, "any")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.GetClusterId()
	}
	oldID, newID := id(oldCli), id(newCli)
	if _, err := newCli.Put(ctx, keys.Superseded(oldID), types.ID(newID).String()); err != nil {
		t.Fatal(err)
	}

	pin := etcdpin.New(0)
	pinned := func(eps ...string) *clientv3.Client { return pinnedClient(t, pin, eps...) }
	// The old cluster's member answers first: the pin learns it.
	if err := pin.Learn(ctx, pinned(oldEP)); err != nil || pin.ID() != oldID {
		t.Fatalf("learn through the old member: pinned %s, err %v", types.ID(pin.ID()), err)
	}
	s := &Service{
		cfg:         Config{Etcd: []string{oldEP, newEP}},
		log:         slog.New(slog.DiscardHandler),
		etcd:        pinned(oldEP, newEP),
		sessionEtcd: pinned(oldEP, newEP),
		memberEtcd:  pinned(oldEP, newEP),
		pin:         pin,
	}
	s.chooseEndpoints(ctx)
	if pin.ID() != newID {
		t.Fatalf("after a probe, pinned to %s; want the cluster %s that superseded %s", types.ID(pin.ID()), types.ID(newID), types.ID(oldID))
	}
	if got := s.etcd.Endpoints(); !slices.Equal(got, []string{newEP}) {
		t.Fatalf("endpoints %v, want only the new cluster's %s", got, newEP)
	}
	for range 10 {
		if _, err := s.etcd.Put(ctx, "written", "x"); err != nil {
			t.Fatalf("write through the curator's client: %v", err)
		}
	}
	if resp, err := oldCli.Get(ctx, "written"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("the superseded cluster holds a write of the curator (%v)", err)
	}
}

// TestEndpointsLeaveMembersThatAreGone: the client's endpoints give no
// member list any more (here its one endpoint no longer serves; in CI it
// was the survivor of a recovery, which autopilot had removed from the
// cluster, and a removed member stops). The probe asks the member that
// answered it for the pinned cluster, which is then the endpoint. Before,
// the client stayed on the gone member for good, and every call of the
// curator failed (4 minutes in CI, until the test gave up).
func TestEndpointsLeaveMembersThatAreGone(t *testing.T) {
	live := etcdtest.Start(t, "endpoints-live")
	gone := "http://" + closedAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pin := etcdpin.New(0)
	pinned := func(eps ...string) *clientv3.Client { return pinnedClient(t, pin, eps...) }
	if err := pin.Learn(ctx, pinned(live)); err != nil {
		t.Fatal(err)
	}
	s := &Service{
		cfg:         Config{Etcd: []string{gone, live}},
		log:         slog.New(slog.DiscardHandler),
		etcd:        pinned(gone),
		sessionEtcd: pinned(gone),
		memberEtcd:  pinned(gone, live),
		pin:         pin,
	}
	s.chooseEndpoints(ctx)
	if got := s.etcd.Endpoints(); !slices.Equal(got, []string{live}) {
		t.Fatalf("after a probe, endpoints %v; want the member that answered, %s", got, live)
	}
	if _, err := s.etcd.Put(ctx, "written", "x"); err != nil {
		t.Fatalf("write through the curator's client: %v", err)
	}
}

// closedAddr is a loopback address nothing listens on (it did a moment
// ago).
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// pinnedClient is an etcd client of eps pinned by pin, closed when the
// test ends.
func pinnedClient(t *testing.T, pin *etcdpin.Pin, eps ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, DialOptions: pin.DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
