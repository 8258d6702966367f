package nodestore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/etcdtest"
	"curia.dev/platform/keys"
	"curia.dev/platform/leaktest"
	"curia.dev/platform/rpcerr"
	"curia.dev/services/curator/internal/nodestore"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

func client(t *testing.T) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdtest.Start(t, "nodestore")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestScanRangeIsOneSnapshot: a scan longer than a page sees the range as
// it was when its first page was read. A key written between two pages
// (here, while the first page is read) is not in it, and the revision
// returned is the first page's: a watch from it sees that write.
func TestScanRangeIsOneSnapshot(t *testing.T) {
	ctx := context.Background()
	cli := client(t)
	const prefix, n = "/scan/", 2*nodestore.Page + 1
	for i := range n {
		if _, err := cli.Put(ctx, fmt.Sprintf("%s%05d", prefix, i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	var seen int
	var late *clientv3.PutResponse
	rev, err := nodestore.ScanRange(ctx, cli, prefix, 0, func(kv *mvccpb.KeyValue) error {
		if seen++; seen == 1 {
			var err error
			// Sorts after every key: on the last page.
			late, err = cli.Put(ctx, prefix+"zzz", "late")
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen != n {
		t.Errorf("scanned %d keys, want %d (the key written during the scan is not in its snapshot)", seen, n)
	}
	if rev >= late.Header.Revision {
		t.Errorf("scan read at revision %d, not before the write during it (%d)", rev, late.Header.Revision)
	}
}

// TestGetAndEach: a node stored with Put reads back with its record's
// revision; Unchanged holds until the record changes; a missing node is
// NotFound and a record that does not decode Corrupt, with what to do.
func TestGetAndEach(t *testing.T) {
	ctx := context.Background()
	cli := client(t)
	s := nodestore.Store{KV: cli}
	n := &curatorv1.Node{Id: "metropolis-a", State: curatorv1.NodeState_NODE_STATE_NEW}
	if _, err := cli.Txn(ctx).Then(nodestore.Put(n)).Commit(); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, n.Id)
	if err != nil {
		t.Fatal(err)
	}
	if got.GetId() != n.Id || got.GetState() != n.GetState() || got.GetRevision() == 0 {
		t.Fatalf("Get = %v, want %s in state %s with its revision", got, n.Id, n.State)
	}
	put := func(cmp clientv3.Cmp) bool {
		t.Helper()
		resp, err := cli.Txn(ctx).If(cmp).Then(nodestore.Put(got)).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return resp.Succeeded
	}
	if !put(nodestore.Unchanged(got)) {
		t.Fatal("Unchanged failed on the record as read")
	}
	if put(nodestore.Unchanged(got)) {
		t.Fatal("Unchanged held on a record written since it was read")
	}

	if _, err := s.Get(ctx, "metropolis-none"); !errors.Is(err, rpcerr.NotFound) {
		t.Errorf("Get of a missing node: %v, want NotFound", err)
	}
	if _, err := cli.Put(ctx, keys.Node("metropolis-bad"), "\xff not a record"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "metropolis-bad"); !errors.Is(err, rpcerr.Corrupt) {
		t.Errorf("Get of an undecodable record: %v, want Corrupt", err)
	}
	if err := s.Each(ctx, func(*curatorv1.Node) error { return nil }); !errors.Is(err, rpcerr.Corrupt) {
		t.Errorf("Each over an undecodable record: %v, want Corrupt", err)
	}
}
