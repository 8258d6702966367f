package faults

// Acknowledged writes outside the registry model: an operator's
// UpdateNodeRoles on a real node (the reconciler writes the same records,
// so these calls are not in porcupine's history). Each acknowledged call
// must show in the record's history in etcd, between a revision read
// before the call and one read after its answer.

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"curia.dev/platform/keys"
	"curia.dev/platform/records"
)

// ackedRoles is one acknowledged UpdateNodeRoles(consensus_member=cm):
// etcd's revision was at least before when the call started and at most
// after when it was answered.
type ackedRoles struct {
	node          string
	cm            bool
	before, after int64
	at            time.Time
}

// acks collects acknowledged role writes.
type acks struct {
	mu   sync.Mutex
	list []ackedRoles
	// unchecked counts acknowledged calls without both revisions (etcd
	// did not answer the probe in time).
	unchecked int
}

func (a *acks) add(w ackedRoles) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.before == 0 || w.after == 0 {
		a.unchecked++
		return
	}
	a.list = append(a.list, w)
}

// revision is etcd's current revision (0 when etcd does not answer within
// a second): a linearizable read, so it is at least every revision
// acknowledged before it was sent.
func revision(ctx context.Context, cli *clientv3.Client) int64 {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/curia/faults-revision-probe", clientv3.WithCountOnly())
	if err != nil {
		return 0
	}
	return resp.Header.Revision
}

// checkDurable looks for every acknowledged role write in its node's
// history: some version of the record, current at a revision in
// [before, after], has ConsensusMember as the call asked (a call that
// found the roles already so wrote nothing: the version current at before
// shows it). History the walk cannot read (compacted, or the record
// deleted meanwhile) is counted as unchecked, not as a loss.
func (c *checker) checkDurable(ctx context.Context, cli *clientv3.Client, a *acks) (checked, unchecked int) {
	a.mu.Lock()
	list, unchecked := append([]ackedRoles(nil), a.list...), a.unchecked
	a.mu.Unlock()
	for _, w := range list {
		found, known := false, true
		// Walk the versions back from after to the one current at before.
		for rev := w.after; !found; {
			resp, err := cli.Get(ctx, keys.Node(w.node), clientv3.WithRev(rev))
			if err != nil || len(resp.Kvs) == 0 {
				known = false
				break
			}
			kv := resp.Kvs[0]
			if n, err := records.DecodeNode(kv.Value); err == nil && (n.GetRoles().GetConsensusMember() != nil) == w.cm {
				found = true
			}
			if kv.ModRevision <= w.before {
				break
			}
			rev = kv.ModRevision - 1
		}
		switch {
		case found:
			checked++
		case !known:
			unchecked++
		default:
			checked++
			c.violate(InvAckLost, w.at, "UpdateNodeRoles(%s, consensus_member=%v) was acknowledged, but no version of the record between revisions %d and %d has it", w.node, w.cm, w.before, w.after)
		}
	}
	return checked, unchecked
}
