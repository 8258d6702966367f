package curator

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/records"
)

// Nodes are stored as curia.storage.v1.NodeRecord under keys.Node(id)
// (platform/records converts): decodeNode and putNode are the curator's
// only reader and writer of it. The fields computed on read (health, last
// heartbeat) are filled in by the callers that serve a node; the revision
// is the key's ModRevision.

// nodePage is how many node records one read of a scan takes.
const nodePage = 1000

// scanRange reads every key under prefix at revision rev (0: the current
// one), nodePage at a time, and calls f with each; it returns the revision
// read. The one way the curator reads a whole range: the registry
// (GetNodes, the watch hub's snapshot, the consensus addresses), the
// heartbeats.
func scanRange(ctx context.Context, kv clientv3.KV, prefix string, rev int64, f func(*mvccpb.KeyValue) error) (int64, error) {
	key, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(nodePage)}
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

// eachNode calls f for every node, decoded, from one scan.
func (s *Service) eachNode(ctx context.Context, f func(*curatorv1.Node) error) error {
	_, err := scanRange(ctx, s.etcd, keys.NodesPrefix, 0, func(kv *mvccpb.KeyValue) error {
		n, err := decodeNode(kv.Value, kv.ModRevision)
		if err != nil {
			return fmt.Errorf("node %s: %w", kv.Key, err)
		}
		return f(n)
	})
	return err
}

// getNode reads a node; its Revision is the record's ModRevision.
func (s *Service) getNode(ctx context.Context, id string) (*curatorv1.Node, error) {
	resp, err := s.etcd.Get(ctx, keys.Node(id))
	if err != nil {
		return nil, fmt.Errorf("read node %s: %w", id, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: node %s does not exist", errNotFound, id)
	}
	return decodeNode(resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
}

// decodeNode reads a node record stored at rev.
func decodeNode(b []byte, rev int64) (*curatorv1.Node, error) {
	n, err := records.DecodeNode(b)
	if err != nil {
		return nil, fmt.Errorf("%w: the node record does not decode (%v): restore it, or delete it with DeleteNode's safety bypasses", errCorrupt, err)
	}
	n.Revision = rev
	return n, nil
}

// putNode is the operation that stores n (what is stored of it).
func putNode(n *curatorv1.Node) clientv3.Op {
	b, err := records.EncodeNode(n)
	if err != nil {
		panic(err) // cannot happen for a valid message
	}
	return clientv3.OpPut(keys.Node(n.Id), string(b))
}

// unchanged is the comparison "n's record is still at the revision read".
func unchanged(n *curatorv1.Node) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(keys.Node(n.Id)), "=", n.Revision)
}

// hasRoles reports whether a node holds any role.
func hasRoles(r *curatorv1.Roles) bool {
	return r.GetConsensusMember() != nil || r.GetKubernetesController() != nil || r.GetKubernetesWorker() != nil
}

func protoEqual(a, b proto.Message) bool { return proto.Equal(a, b) }
