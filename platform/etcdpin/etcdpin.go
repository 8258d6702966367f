// Package etcdpin pins the etcd cluster an etcd client talks to.
//
// A quorum-loss recovery (services/consensus/recover.go) builds a new
// cluster, with a new cluster id, from one survivor's data. Old members
// that come back (thawed, restarted with their data) can still form the old
// cluster's quorum and answer, and acknowledge writes, for it. A client
// that adopts any member that answers would have those writes lost.
//
// Every etcd response header carries the id of the cluster that answered.
// A Pin holds the one cluster id a client accepts; its interceptors
// (DialOptions, for clientv3.Config.DialOptions) check every response's
// header and turn an answer of another cluster into an Unavailable error:
// the request may have been applied there, but the caller is never told it
// succeeded.
//
//	Learn     nothing pinned: pin the cluster a linearizable read
//	          answers for, then follow its recovery records
//	Follow    a member answers for another cluster: if that cluster's
//	          recovery records say it superseded the pinned one, the pin
//	          moves forward to it
//	          (keys.RecoverySuperseded: <old id> → <new id>)
//
// A pin only moves forward: a cluster once superseded is never pinned
// again.
package etcdpin

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
)

// Pin is the etcd cluster id a client accepts answers from. The zero
// value pins nothing yet (every answer passes); use New.
type Pin struct {
	mu         sync.Mutex
	id         uint64
	superseded map[uint64]uint64 // old cluster id → the one that replaced it
}

// New returns a pin on cluster id, or a pin that learns its cluster (Learn)
// if id is 0.
func New(id uint64) *Pin {
	return &Pin{id: id, superseded: map[uint64]uint64{}}
}

// ID is the pinned cluster id, 0 if none is pinned yet.
func (p *Pin) ID() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.id
}

// Superseded reports whether a recovery replaced cluster id, as far as
// this pin has seen.
func (p *Pin) Superseded(id uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.superseded[id]
	return ok
}

// Accepts reports whether an answer of cluster id passes the pin.
func (p *Pin) Accepts(id uint64) bool {
	if failpoint.Mutated(failpoint.NoClusterPin) {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// No header cluster id (an answer that carries none) says nothing.
	return p.id == 0 || id == 0 || id == p.id
}

// pin sets the pinned id if none is yet and id was never superseded.
func (p *Pin) pin(id uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, gone := p.superseded[id]; p.id == 0 && id != 0 && !gone {
		p.id = id
	}
}

// record notes that cluster old was superseded by cluster next, and moves
// the pin along the chain of recoveries from where it is. It reports
// whether the pin moved.
func (p *Pin) record(old, next uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old == 0 || next == 0 || old == next {
		return false
	}
	p.superseded[old] = next
	// Walk the chain from the pinned cluster to one no recovery replaced;
	// a loop (records that contradict each other) moves nothing.
	id := p.id
	for seen := map[uint64]bool{id: true}; ; {
		n, ok := p.superseded[id]
		if !ok {
			break
		}
		if seen[n] {
			return false
		}
		seen[n], id = true, n
	}
	if id == p.id {
		return false
	}
	p.id = id
	return true
}

// MismatchError is an answer from a member of a cluster other than the
// pinned one. Its gRPC code is Unavailable.
type MismatchError struct {
	Member  uint64 // the answering member's id
	Addr    string // its address, if known
	Cluster uint64 // the cluster it answered for
	Pinned  uint64 // the cluster the client is pinned to
}

func (e *MismatchError) Error() string {
	who := types.ID(e.Member).String()
	if e.Addr != "" {
		who += " (" + e.Addr + ")"
	}
	return fmt.Sprintf("etcd member %s answers for cluster %s, this client is pinned to cluster %s (superseded by a recovery?)",
		who, types.ID(e.Cluster), types.ID(e.Pinned))
}

// GRPCStatus makes the error an Unavailable status for status.Code and
// etcd's client.
func (e *MismatchError) GRPCStatus() *status.Status {
	return status.New(codes.Unavailable, e.Error())
}

// Check returns a *MismatchError if h names a cluster the pin refuses.
func (p *Pin) Check(h *etcdserverpb.ResponseHeader, addr string) error {
	if h == nil || p.Accepts(h.GetClusterId()) {
		return nil
	}
	return &MismatchError{Member: h.GetMemberId(), Addr: addr, Cluster: h.GetClusterId(), Pinned: p.ID()}
}

type uncheckedKey struct{}

// Unchecked returns a context whose etcd calls pass the pin unchecked: for
// a probe that reads the cluster id of an answer and judges it itself.
func Unchecked(ctx context.Context) context.Context {
	return context.WithValue(ctx, uncheckedKey{}, true)
}

func isUnchecked(ctx context.Context) bool {
	v, _ := ctx.Value(uncheckedKey{}).(bool)
	return v
}

// headed is every etcd response: each carries a header.
type headed interface {
	GetHeader() *etcdserverpb.ResponseHeader
}

// DialOptions are the pin's client interceptors, for
// clientv3.Config.DialOptions. Chained after etcd's own (retry)
// interceptors, they check each attempt: etcd retries a refused read on
// another endpoint, never a refused write.
func (p *Pin) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(p.unary),
		grpc.WithChainStreamInterceptor(p.stream),
	}
}

func (p *Pin) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if isUnchecked(ctx) {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	var from peer.Peer
	if err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&from))...); err != nil {
		return err
	}
	r, ok := reply.(headed)
	if !ok {
		return nil
	}
	addr := ""
	if from.Addr != nil {
		addr = from.Addr.String()
	}
	return p.Check(r.GetHeader(), addr)
}

func (p *Pin) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if isUnchecked(ctx) {
		return streamer(ctx, desc, cc, method, opts...)
	}
	// A refused answer ends the stream: the caller opens another, which
	// the balancer may place on a member of the pinned cluster.
	ctx, cancel := context.WithCancel(ctx)
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	return &checkedStream{ClientStream: cs, pin: p, cancel: cancel}, nil
}

type checkedStream struct {
	grpc.ClientStream
	pin    *Pin
	cancel context.CancelFunc
}

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ClientStream.RecvMsg(m); err != nil {
		s.cancel()
		return err
	}
	r, ok := m.(headed)
	if !ok {
		return nil
	}
	if err := s.pin.Check(r.GetHeader(), ""); err != nil {
		s.cancel()
		return err
	}
	return nil
}

// Learn pins the cluster a linearizable read through c answers for, if
// nothing is pinned yet, and follows that cluster's records of the
// clusters it superseded.
func (p *Pin) Learn(ctx context.Context, c *clientv3.Client) error {
	resp, err := c.Get(Unchecked(ctx), keys.RecoverySuperseded, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("learn the etcd cluster id: %w", err)
	}
	p.pin(resp.Header.GetClusterId())
	p.follow(resp.Kvs)
	return nil
}

// Follow asks the member at endpoint, which answers for a cluster other
// than the pinned one, for the recovery records of its cluster (a
// linearizable read: its cluster's quorum answers), and moves the pin
// forward along them. It reports whether the pin moved.
func (p *Pin) Follow(ctx context.Context, c *clientv3.Client, endpoint string) (bool, error) {
	conn, err := c.Dial(endpoint)
	if err != nil {
		return false, fmt.Errorf("dial %s: %w", endpoint, err)
	}
	defer conn.Close()
	prefix := []byte(keys.RecoverySuperseded)
	resp, err := etcdserverpb.NewKVClient(conn).Range(Unchecked(ctx), &etcdserverpb.RangeRequest{
		Key: prefix, RangeEnd: []byte(clientv3.GetPrefixRangeEnd(keys.RecoverySuperseded)),
	})
	if err != nil {
		return false, fmt.Errorf("read the recovery records at %s: %w", endpoint, err)
	}
	if p.ID() == 0 {
		p.pin(resp.Header.GetClusterId())
	}
	return p.follow(resp.Kvs), nil
}

// follow records keys.RecoverySuperseded entries; unreadable ones are
// skipped (they name no cluster to follow).
func (p *Pin) follow(kvs []*mvccpb.KeyValue) bool {
	moved := false
	for _, kv := range kvs {
		old, err1 := types.IDFromString(strings.TrimPrefix(string(kv.Key), keys.RecoverySuperseded))
		next, err2 := types.IDFromString(strings.TrimSpace(string(kv.Value)))
		if err1 != nil || err2 != nil {
			continue
		}
		if p.record(uint64(old), uint64(next)) {
			moved = true
		}
	}
	return moved
}
