package faults

import (
	"context"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/proctest"
	"curia.dev/platform/records"
)

// etcdForTest starts a single real etcd member on loopback.
func etcdForTest(t *testing.T) *clientv3.Client {
	t.Helper()
	proctest.SkipShort(t)
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	peer, _ := url.Parse("http://127.0.0.1:0")
	client, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		t.Fatal("etcd did not start")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Clients[0].Addr().String()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestCheckDurable: an acknowledged role write counts as kept only when
// a version of the record between the revisions read around the call
// shows it; a write absent from that stretch of history is a violation,
// even when an older or a later version shows it.
func TestCheckDurable(t *testing.T) {
	cli := etcdForTest(t)
	ctx := context.Background()
	put := func(node string, cm bool) int64 {
		n := &curatorv1.Node{Id: node, State: curatorv1.NodeState_NODE_STATE_UP, Roles: &curatorv1.Roles{}}
		if cm {
			n.Roles.ConsensusMember = &curatorv1.ConsensusMember{}
		}
		b, err := records.EncodeNode(n)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := cli.Put(ctx, keys.Node(node), string(b))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	unrelated := func() int64 {
		resp, err := cli.Put(ctx, "/curia/elsewhere", "x")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}

	var a acks
	// Written inside its window, then overwritten: kept.
	before := unrelated()
	put("n1", true)
	after := unrelated()
	put("n1", false)
	a.add(ackedRoles{node: "n1", cm: true, before: before, after: after})
	// A no-op: the version current when the call began shows it.
	put("n2", true)
	before = unrelated()
	after = unrelated()
	a.add(ackedRoles{node: "n2", cm: true, before: before, after: after})
	// Lost: true before the window and after it, false all through it.
	put("n3", true)
	put("n3", false)
	before = unrelated()
	put("n3", false)
	after = unrelated()
	put("n3", true)
	a.add(ackedRoles{node: "n3", cm: true, before: before, after: after, at: time.Now()})
	// Deleted inside the window: the history cannot tell.
	put("n4", false)
	before = unrelated()
	if _, err := cli.Delete(ctx, keys.Node("n4")); err != nil {
		t.Fatal(err)
	}
	after = unrelated()
	a.add(ackedRoles{node: "n4", cm: true, before: before, after: after})
	// No revision after the call: not checked.
	a.add(ackedRoles{node: "n1", cm: true, before: before})

	var ck checker
	checked, unchecked := ck.checkDurable(ctx, cli, &a)
	if checked != 3 || unchecked != 2 {
		t.Errorf("checked %d, unchecked %d; want 3 and 2", checked, unchecked)
	}
	v := ck.Violations()
	if len(v) != 1 || v[0].Invariant != InvAckLost {
		t.Fatalf("violations %v, want one %s (node n3)", v, InvAckLost)
	}
	t.Logf("caught: %s", v[0])
}
