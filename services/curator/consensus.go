package curator

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
	"curia.dev/services/curator/internal/nodestore"
)

// consensusPool reaches the consensus services: the addresses configured,
// then those that consensus-member nodes report. Membership calls are
// idempotent per node, so trying the next service after an unavailable one
// is safe.
type consensusPool struct {
	// configured are the --consensus addresses; the nodes' records in
	// etcd name more.
	configured []string
	etcd       *clientv3.Client
	conns      *rpc.Conns
}

func newConsensusPool(configured []string, etcd *clientv3.Client, creds *rpc.Credentials) *consensusPool {
	return &consensusPool{configured: configured, etcd: etcd,
		conns: rpc.NewConns(rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindConsensus}})}
}

func (p *consensusPool) addresses(ctx context.Context) []string {
	addrs := slices.Clone(p.configured)
	// Best effort: the configured addresses when etcd does not answer; an
	// unreadable record is skipped.
	_, _ = nodestore.ScanRange(ctx, p.etcd, keys.NodesPrefix, 0, func(kv *mvccpb.KeyValue) error {
		n, err := nodestore.Decode(kv.Value, kv.ModRevision)
		if err != nil || n.GetRoles().GetConsensusMember() == nil {
			return nil
		}
		if a := n.GetStatus().GetConsensusApi(); a != "" && !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
		return nil
	})
	return addrs
}

func (p *consensusPool) conn(addr string) (consensusv1.ConsensusClient, error) {
	cc, err := p.conns.Get(addr)
	if err != nil {
		return nil, err
	}
	return consensusv1.NewConsensusClient(cc), nil
}

// Do calls f on consensus services until one answers with anything but
// Unavailable, or with an Unavailable that says when to try again: etcd's
// reconfiguration window, which every service meets alike, and which for a
// membership change means that the change was tried and not applied (its
// epoch moved on, so the next service would only find the fence stale).
func (p *consensusPool) Do(ctx context.Context, what string, f func(consensusv1.ConsensusClient) error) error {
	addrs := p.addresses(ctx)
	if len(addrs) == 0 {
		return fmt.Errorf("%w: %s: no consensus service is known (start the curator with --consensus)", errUnavailable, what)
	}
	var last error
	for _, a := range addrs {
		c, err := p.conn(a)
		if err == nil {
			err = f(c)
		}
		if err == nil {
			return nil
		}
		if _, later := rpcerr.RetryDelay(err); later || status.Code(err) != codes.Unavailable {
			return fmt.Errorf("%s via consensus %s: %w", what, a, err)
		}
		last = err
	}
	return fmt.Errorf("%w: %s: no consensus service answered (tried %v): %v", errUnavailable, what, addrs, last)
}

// listMembersTimeout bounds one consensus service's answer to ListMembers,
// so that a frozen one (SIGSTOP, a stalled VM) leaves time to ask the next.
const listMembersTimeout = 4 * time.Second

// ListMembers reads a fresh member list (with its epoch and pending
// change) from the first consensus service that answers. A read, so one
// that does not answer in time is passed over like an Unavailable one.
func (p *consensusPool) ListMembers(ctx context.Context) (*consensusv1.ListMembersResponse, error) {
	var members *consensusv1.ListMembersResponse
	err := p.Do(ctx, "list etcd members", func(c consensusv1.ConsensusClient) (err error) {
		actx, cancel := context.WithTimeout(ctx, listMembersTimeout)
		defer cancel()
		members, err = c.ListMembers(actx, &consensusv1.ListMembersRequest{})
		if status.Code(err) == codes.DeadlineExceeded && ctx.Err() == nil {
			err = status.Error(codes.Unavailable, err.Error())
		}
		return err
	})
	return members, err
}

func (p *consensusPool) close() { p.conns.Close() }
