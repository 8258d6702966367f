package reconciler

import (
	"context"
	"sync"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// The replica's view of the nodes. A pass needs every node, at least as new
// as the member list it plans against (observe); reading them all again for
// each pass costs the whole registry per pass, and k drifts k registries.
// Instead one Watch stream with progress (followNodes) keeps a copy:
//
//	curator hub ── Watch(all_nodes, progress_notify) ──▶ nodeView
//	                snapshot, then every change in order,     nodes at rev
//	                and "nothing changed up to R"             │
//	                                                          ▼
//	                                   observe: wait until rev ≥ member list's
//
// The stream sends every change of a watched node exactly once, in revision
// order, health changes included, and progress says the view is complete up
// to a revision with nothing to apply: so at rev the view is the registry
// at rev, and a pass that waits for rev ≥ the member list's revision sees
// every node that existed when the members were listed. When the view does
// not get there in time (the stream is down, the replica it reached lags),
// the pass reads a snapshot as before (readNodes), which the curator keeps
// as fresh.
type nodeView struct {
	mu    sync.Mutex
	nodes map[string]*curatorv1.Node
	// rev is the revision the view is complete up to; 0 until the first
	// snapshot.
	rev int64
	// moved is closed and replaced whenever rev moves.
	moved chan struct{}
}

// viewWait bounds how long a pass waits for the view to reach the member
// list's revision before it reads a snapshot instead. Progress comes at
// least every 50 ms while the stream is up.
const viewWait = time.Second

// at returns every node once the view is complete up to minRev or later,
// and the view's revision; ok is false when it is not within wait.
func (v *nodeView) at(ctx context.Context, minRev int64, wait time.Duration) (nodes []*curatorv1.Node, rev int64, ok bool) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		v.mu.Lock()
		if v.rev > 0 && v.rev >= minRev {
			nodes = make([]*curatorv1.Node, 0, len(v.nodes))
			for _, n := range v.nodes {
				nodes = append(nodes, n)
			}
			rev = v.rev
			v.mu.Unlock()
			return nodes, rev, true
		}
		moved := v.movedLocked()
		v.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, 0, false
		case <-timer.C:
			return nil, 0, false
		case <-moved:
		}
	}
}

// revision is the revision the view is complete up to (0: none yet).
func (v *nodeView) revision() int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.rev
}

func (v *nodeView) movedLocked() chan struct{} {
	if v.moved == nil {
		v.moved = make(chan struct{})
	}
	return v.moved
}

// advanceLocked moves the view to rev, if that is newer.
func (v *nodeView) advanceLocked(rev int64) {
	if rev <= v.rev {
		return
	}
	v.rev = rev
	close(v.movedLocked())
	v.moved = make(chan struct{})
}

// replace makes nodes at rev the view (a snapshot). rev is taken as it
// is, even if older than the view's: a snapshot replaces everything (after
// a restore, etcd's history may have gone back).
func (v *nodeView) replace(nodes map[string]*curatorv1.Node, rev int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.nodes, v.rev = nodes, rev
	close(v.movedLocked())
	v.moved = make(chan struct{})
}

// apply applies a batch of changes (or progress: none) at rev.
func (v *nodeView) apply(r *curatorv1.WatchResponse) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, n := range r.GetNodes() {
		v.nodes[n.GetId()] = n
	}
	for _, id := range r.GetDeleted() {
		delete(v.nodes, id)
	}
	v.advanceLocked(r.GetRevision())
}

// followNodes keeps the view current, and triggers a pass on every change
// of a node (a progress response changes none), until ctx ends. A broken
// stream is resumed from the view's revision; a curator that no longer
// holds it sends a snapshot.
func (r *Reconciler) followNodes(ctx context.Context) error {
	for ctx.Err() == nil {
		err := r.followNodesOnce(ctx)
		if ctx.Err() == nil {
			r.log.Debug("node watch ended; watching again", "err", err, "revision", r.view.revision())
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

// followNodesOnce follows one Watch stream until it fails.
func (r *Reconciler) followNodesOnce(ctx context.Context) error {
	stream, err := curatorv1.NewCuratorClient(r.curator).Watch(ctx, &curatorv1.WatchRequest{
		Kind:           &curatorv1.WatchRequest_AllNodes{AllNodes: true},
		StartRevision:  r.view.revision(),
		ProgressNotify: true,
	})
	if err != nil {
		return err
	}
	// snapshot collects a snapshot that comes in several messages: all but
	// the last carry revision 0.
	var snapshot map[string]*curatorv1.Node
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		if resp.GetSnapshot() {
			snapshot = map[string]*curatorv1.Node{}
		}
		switch {
		case snapshot != nil:
			for _, n := range resp.GetNodes() {
				snapshot[n.GetId()] = n
			}
			if rev := resp.GetRevision(); rev != 0 {
				r.view.replace(snapshot, rev)
				snapshot = nil
				r.kick()
			}
		case len(resp.GetNodes()) > 0 || len(resp.GetDeleted()) > 0:
			r.view.apply(resp)
			r.kick()
		default: // progress
			r.view.apply(resp)
		}
	}
}
