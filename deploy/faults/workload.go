package faults

// The workload: operators, node agents and readers using the public APIs
// the whole run, every call recorded with its start, end and outcome.

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"curia.dev/deploy/faults/internal/registry"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/nodes"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/run"
)

// opStats counts the calls of one kind.
type opStats struct {
	Attempted    int `json:"attempted"`
	Acknowledged int `json:"acknowledged"`
	Refused      int `json:"refused"`
	Unknown      int `json:"unknown"`
}

// stats counts calls by kind.
type stats struct {
	mu     sync.Mutex
	byKind map[string]*opStats
}

func (s *stats) record(kind string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byKind == nil {
		s.byKind = map[string]*opStats{}
	}
	st := s.byKind[kind]
	if st == nil {
		st = &opStats{}
		s.byKind[kind] = st
	}
	st.Attempted++
	switch registry.OutcomeOf(err) {
	case registry.OutcomeOK:
		st.Acknowledged++
	case registry.OutcomeRefused:
		st.Refused++
	default:
		st.Unknown++
	}
}

func (s *stats) snapshot() map[string]opStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]opStats{}
	for k, v := range s.byKind {
		out[k] = *v
	}
	return out
}

// workload drives the public APIs.
type workload struct {
	cluster  *cluster
	admin    *grpc.ClientConn
	registry *registry.History
	stats    stats
	// roleAcks are the operators' acknowledged role writes.
	roleAcks acks
	// callTimeout bounds each call; an operator's call that times out is
	// an Unknown outcome.
	callTimeout time.Duration
	// internal collects Internal/Unknown gRPC answers: a curia server
	// never returns those on purpose.
	internal func(what string, err error)
}

func (w *workload) mgmt() curatorv1.ManagementClient { return curatorv1.NewManagementClient(w.admin) }

// call runs f with the call timeout and records its outcome.
func (w *workload) call(ctx context.Context, kind string, f func(context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, w.callTimeout)
	defer cancel()
	err := f(cctx)
	if ctx.Err() != nil {
		return err // the run ended: not an outcome
	}
	w.stats.record(kind, err)
	if c := status.Code(err); c == codes.Internal || c == codes.Unknown {
		w.internal(kind, err)
	}
	return err
}

// operator gives and takes ConsensusMember on the nodes it may change
// (never the bootstrap node: the curators reach etcd through the first
// control-plane nodes), as an operator growing and shrinking the control
// plane would, retrying nothing: the next decision is a new call.
func (w *workload) operator(ctx context.Context, rng *mrand.Rand, nodes func() []string, pace time.Duration) {
	for ctx.Err() == nil {
		run.Sleep(ctx, pace/2+time.Duration(rng.Int64N(int64(pace))))
		ids := nodes()
		id := ids[rng.IntN(len(ids))]
		cm := rng.IntN(2) == 0
		before := revision(ctx, w.cluster.etcd)
		err := w.call(ctx, "update-roles", func(ctx context.Context) error {
			_, err := w.mgmt().UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: id, ConsensusMember: &cm, Reason: "fault suite operator"})
			return err
		})
		if err == nil && ctx.Err() == nil {
			w.roleAcks.add(ackedRoles{node: id, cm: cm, before: before, after: revision(ctx, w.cluster.etcd), at: time.Now()})
		}
	}
}

// synthetic is a node that exists only in the registry: a key, no
// processes. The registry clients play its agent and its operators.
type synthetic struct {
	id  string
	key ed25519.PrivateKey
}

func newSynthetic() (synthetic, error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return synthetic{}, err
	}
	return synthetic{id: pki.NodeID(pub), key: key}, nil
}

// synthetics are the synthetic nodes the registry clients share. A node
// whose deletion was acknowledged is replaced by a fresh one after a while
// (a deleted id never registers again), so the workload keeps nodes alive;
// calls on the deleted one go on until then, to check it stays gone.
type synthetics struct {
	mu    sync.Mutex
	nodes []synthetic
	// deleted counts the calls each deleted node (by index) still gets.
	deleted map[int]int
}

func newSynthetics(n int) (*synthetics, error) {
	s := &synthetics{deleted: map[int]int{}}
	for range n {
		node, err := newSynthetic()
		if err != nil {
			return nil, err
		}
		s.nodes = append(s.nodes, node)
	}
	return s, nil
}

// pick chooses a node; a deleted one is replaced after a few more calls.
func (s *synthetics) pick(rng *mrand.Rand) synthetic {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := rng.IntN(len(s.nodes))
	if left, ok := s.deleted[i]; ok {
		if left == 0 {
			if fresh, err := newSynthetic(); err == nil {
				s.nodes[i] = fresh
			}
			delete(s.deleted, i)
		} else {
			s.deleted[i] = left - 1
		}
	}
	return s.nodes[i]
}

// gone records that n's deletion was acknowledged.
func (s *synthetics) gone(n synthetic) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range s.nodes {
		if m.id == n.id {
			if _, ok := s.deleted[i]; !ok {
				s.deleted[i] = 8
			}
		}
	}
}

// registryClient walks synthetic nodes through their lifecycle, several
// clients on the same nodes at once, recording every call for the
// linearizability check.
func (w *workload) registryClient(ctx context.Context, client int, rng *mrand.Rand, nodes *synthetics, ticket []byte, pace time.Duration) {
	for ctx.Err() == nil {
		run.Sleep(ctx, pace/2+time.Duration(rng.Int64N(int64(pace))))
		n := nodes.pick(rng)
		switch rng.IntN(8) {
		case 0, 1:
			w.register(ctx, client, n, ticket)
		case 2:
			w.approve(ctx, client, n)
		case 3:
			w.commit(ctx, client, n)
		case 4:
			w.setWorker(ctx, client, n, rng.IntN(2) == 0)
		case 5:
			if w.deleteNode(ctx, client, n) {
				nodes.gone(n)
			}
		default:
			w.get(ctx, client, n)
		}
	}
}

// enrolling is the Curator API with a synthetic node's self-signed
// certificate, on a random curator.
func (w *workload) enrolling(n synthetic) (curatorv1.CuratorClient, func(), error) {
	addrs := w.cluster.curators()
	addr := addrs[mrand.IntN(len(addrs))]
	cc, err := rpc.DialEnrolling(addr, w.cluster.caPEM, n.key, []pki.Kind{pki.KindCurator})
	if err != nil {
		return nil, nil, err
	}
	return curatorv1.NewCuratorClient(cc), func() { cc.Close() }, nil
}

func nodeResult(err error, node *curatorv1.Node) registry.Result {
	r := registry.Result{Outcome: registry.OutcomeOf(err), Code: status.Code(err)}
	if err == nil && node != nil {
		r.Exists, r.State, r.Worker = true, node.GetState().String(), node.GetRoles().GetKubernetesWorker() != nil
	}
	return r
}

func (w *workload) register(ctx context.Context, client int, n synthetic, ticket []byte) {
	cl, done, err := w.enrolling(n)
	if err != nil {
		return
	}
	defer done()
	finish := w.registry.Begin(client, "register", n.id, false)
	var resp *curatorv1.RegisterNodeResponse
	err = w.call(ctx, "register", func(ctx context.Context) (err error) {
		resp, err = cl.RegisterNode(ctx, &curatorv1.RegisterNodeRequest{RegisterTicket: ticket, PublicKey: n.key.Public().(ed25519.PublicKey)})
		return err
	})
	finish(nodeResult(err, resp.GetNode()))
}

func (w *workload) approve(ctx context.Context, client int, n synthetic) {
	finish := w.registry.Begin(client, "approve", n.id, false)
	var resp *curatorv1.ApproveNodeResponse
	err := w.call(ctx, "approve", func(ctx context.Context) (err error) {
		resp, err = w.mgmt().ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: n.id})
		return err
	})
	finish(nodeResult(err, resp.GetNode()))
}

func (w *workload) commit(ctx context.Context, client int, n synthetic) {
	cl, done, err := w.enrolling(n)
	if err != nil {
		return
	}
	defer done()
	finish := w.registry.Begin(client, "commit", n.id, false)
	var resp *curatorv1.CommitNodeResponse
	err = w.call(ctx, "commit", func(ctx context.Context) (err error) {
		resp, err = cl.CommitNode(ctx, &curatorv1.CommitNodeRequest{})
		return err
	})
	finish(nodeResult(err, resp.GetNode()))
}

func (w *workload) setWorker(ctx context.Context, client int, n synthetic, worker bool) {
	finish := w.registry.Begin(client, "set-worker", n.id, worker)
	var resp *curatorv1.UpdateNodeRolesResponse
	err := w.call(ctx, "set-worker", func(ctx context.Context) (err error) {
		resp, err = w.mgmt().UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: n.id, KubernetesWorker: &worker, Reason: "fault suite registry"})
		return err
	})
	finish(nodeResult(err, resp.GetNode()))
}

// deleteNode deletes n and says whether the deletion was acknowledged.
func (w *workload) deleteNode(ctx context.Context, client int, n synthetic) bool {
	finish := w.registry.Begin(client, "delete", n.id, false)
	err := w.call(ctx, "delete", func(ctx context.Context) error {
		_, err := w.mgmt().DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: n.id, SafetyBypassHasRoles: true, SafetyBypassNotDecommissioned: true})
		return err
	})
	finish(registry.Result{Outcome: registry.OutcomeOf(err), Code: status.Code(err)})
	return err == nil
}

func (w *workload) get(ctx context.Context, client int, n synthetic) {
	finish := w.registry.Begin(client, "get", n.id, false)
	var found *curatorv1.Node
	err := w.call(ctx, "get", func(ctx context.Context) error {
		listed, err := nodes.ByID(ctx, w.mgmt(), fmt.Sprintf("node.id == %q", n.id))
		found = listed[n.id]
		return err
	})
	finish(nodeResult(err, found))
}

// auditReader reads the audit log now and then, as an operator would.
func (w *workload) auditReader(ctx context.Context, pace time.Duration) {
	for ctx.Err() == nil {
		run.Sleep(ctx, pace)
		_ = w.call(ctx, "read-audit", func(ctx context.Context) error { // call records the outcome
			stream, err := w.mgmt().WatchAuditLog(ctx, &curatorv1.WatchAuditLogRequest{Backlog: 100, NoFollow: true})
			if err != nil {
				return err
			}
			for {
				if _, err := stream.Recv(); err != nil {
					if errors.Is(err, io.EOF) {
						return nil
					}
					return err
				}
			}
		})
	}
}

// watcher follows every node's record, resuming from the last revision
// seen after every break, and checks that revisions only grow.
func (w *workload) watcher(ctx context.Context, violate func(string)) {
	var rev int64
	for ctx.Err() == nil {
		err := func() error {
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			stream, err := curatorv1.NewCuratorClient(w.admin).Watch(wctx, &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_AllNodes{AllNodes: true}, StartRevision: rev})
			if err != nil {
				return err
			}
			for {
				resp, err := stream.Recv()
				if err != nil {
					return err
				}
				if r := resp.GetRevision(); r != 0 {
					if r < rev && !resp.GetSnapshot() {
						violate(fmt.Sprintf("the node watch went back from revision %d to %d", rev, r))
					}
					rev = r
				}
			}
		}()
		if ctx.Err() == nil {
			w.stats.record("watch", err)
		}
		run.Sleep(ctx, 200*time.Millisecond)
	}
}
