// Package nodestore is the curator's one reader and writer of node records:
// curia.storage.v1.NodeRecord under keys.Node(id), converted by
// platform/records. A node read here carries its record's ModRevision as
// Revision; the fields computed on read (health, last heartbeat) are
// filled in by whoever serves the node.
//
// It writes nothing itself: Put and Unchanged are the operation and the
// comparison a caller puts in its own term-guarded transaction, so that a
// node's record changes only if it is still what the caller decided on.
package nodestore

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/records"
	"curia.dev/platform/rpcerr"
)

// Page is how many keys one read of a scan takes.
const Page = 1000

// ScanRange reads every key under prefix at revision rev (0: the current
// one), Page keys at a time, and calls f with each; it returns the
// revision read. The one way the curator reads a whole range: the registry
// (GetNodes, the watch hub's snapshot, the consensus addresses), the
// heartbeats.
func ScanRange(ctx context.Context, kv clientv3.KV, prefix string, rev int64, f func(*mvccpb.KeyValue) error) (int64, error) {
	key, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(Page)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev)) // one consistent snapshot
		}
		resp, err := kv.Get(ctx, key, opts...)
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", prefix, err)
		}
		if rev == 0 {
			// Later pages read at the first page's revision; a header
			// carries the store's current revision, not the one read.
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if err := f(kv); err != nil {
				return 0, err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// Store reads node records through an etcd client.
type Store struct{ KV clientv3.KV }

// Each calls f for every node, decoded, from one scan.
func (s Store) Each(ctx context.Context, f func(*curatorv1.Node) error) error {
	_, err := ScanRange(ctx, s.KV, keys.NodesPrefix, 0, func(kv *mvccpb.KeyValue) error {
		n, err := Decode(kv.Value, kv.ModRevision)
		if err != nil {
			return fmt.Errorf("node %s: %w", kv.Key, err)
		}
		return f(n)
	})
	return err
}

// Get reads a node: rpcerr.NotFound if there is none.
func (s Store) Get(ctx context.Context, id string) (*curatorv1.Node, error) {
	resp, err := s.KV.Get(ctx, keys.Node(id))
	if err != nil {
		return nil, fmt.Errorf("read node %s: %w", id, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: node %s does not exist", rpcerr.NotFound, id)
	}
	return Decode(resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
}

// Decode reads a node record stored at rev: rpcerr.Corrupt if it does not
// decode.
func Decode(b []byte, rev int64) (*curatorv1.Node, error) {
	n, err := records.DecodeNode(b)
	if err != nil {
		return nil, fmt.Errorf("%w: the node record does not decode (%v): restore it, or delete it with DeleteNode's safety bypasses", rpcerr.Corrupt, err)
	}
	n.Revision = rev
	return n, nil
}

// Put is the operation that stores n (what is stored of it).
func Put(n *curatorv1.Node) clientv3.Op {
	b, err := records.EncodeNode(n)
	if err != nil {
		panic(err) // cannot happen for a valid message
	}
	return clientv3.OpPut(keys.Node(n.Id), string(b))
}

// Unchanged is the comparison "n's record is still at the revision read".
func Unchanged(n *curatorv1.Node) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(keys.Node(n.Id)), "=", n.Revision)
}
