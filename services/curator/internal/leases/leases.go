// Package leases is the curator's named leases (DESIGN §4): the
// Leases service the reconciler acquires its lease from, and the fence the
// lease gives. The reconciler's fenced role writes, which these leases
// fence, are internal/registry's reconcile.go.
//
// A lease is the record keys.Lease(name) = leaseRecord (JSON), bound to an
// etcd lease of the holder's TTL and created by the leader in a txn guarded
// by its term and by CreateRevision(key) == 0: one holder per name. The
// holder's fence is
//
//	[leader key @ the term that granted the lease, leases/<name> @ its create revision]
//
// and every fenced write compares both in one etcd txn.
//
// Why a curator leader change invalidates the leases of the old term:
//
//   - A new leader is elected only after the old leader's election key is
//     gone (concurrency.Election: the lowest key leads, and the next waits
//     for its deletion). The first condition of an old fence names that key,
//     so every old fence fails in etcd — at the consensus service and here —
//     from the moment another replica leads, whether or not the lease record
//     itself is still alive.
//   - The record of an old term may live on in etcd until its TTL ends. The
//     new leader never treats it as valid: KeepAlive compares the lease's term
//     with its own and answers Aborted ("acquire again"), so the record
//     expires within one TTL; Acquire, by its holder or anyone else, deletes
//     it (term-guarded, pinned to its create revision) and grants a new
//     record, whose create revision differs, so nothing of the old fence can
//     hold again.
//   - A fence could still be forged from the current leader key and an
//     old-term record that has not expired yet. fence.Apply, here and at the
//     consensus service, reads the record and refuses it unless it names
//     the fence's leader key and term, and pins the record's revision in
//     the write's txn.
//   - A deposed leader that has not noticed yet may answer a KeepAlive for a
//     lease of its own (ended) term: harmless, because that lease's fence
//     already fails; it cannot grant or write anything, since every write is
//     guarded by its term.
//
// Keep-alives do not rewrite the record: the etcd lease is the truth about
// expiry, the record's revisions stay put (the fence pins them) and a
// keep-alive costs no write.
//
// Files: leases.go (the service, the records, the fence's shape).
package leases

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/fence"
	"curia.dev/platform/keys"
	"curia.dev/platform/rpcerr"
)

// Leadership is the curator leader's term, and its writes guarded by it.
type Leadership interface {
	// Ours is the leader key and term while this replica leads.
	Ours() (key string, term int64, ok bool)
	// Txn runs ops in a transaction guarded by this replica's term, plus
	// cmps: a lost term is rpcerr.NotLeader, failed cmps rpcerr.Conflict.
	Txn(ctx context.Context, cmps []clientv3.Cmp, ops ...clientv3.Op) (*clientv3.TxnResponse, error)
}

// Server implements curia.curator.v1.Leases. The policy admits only the
// reconciler; followers forward to the leader.
type Server struct {
	curatorv1.UnimplementedLeasesServer
	etcd *clientv3.Client
	lead Leadership // grants and writes only while this replica leads
	log  *slog.Logger
}

// New is the Leases service of a replica whose leadership is lead.
func New(etcd *clientv3.Client, lead Leadership, log *slog.Logger) *Server {
	return &Server{etcd: etcd, lead: lead, log: log}
}

const (
	// Reconciler is the lease that fences the reconciler's writes.
	Reconciler = keys.ReconcilerLease
	// acquireAttempts bounds how often Acquire decides again when the
	// record changed under it (a concurrent Acquire, an expiry).
	acquireAttempts = 5
)

// leaseRecord is the value of keys.Lease(name), stored as JSON; the
// consensus service reads it too, to pair a lease with its leader key.
type leaseRecord = fence.LeaseRecord

// storedLease is a lease record as read from etcd.
type storedLease struct {
	rec       leaseRecord
	createRev int64
	modRev    int64
	id        clientv3.LeaseID
}

// leaseClaim is a lease as a caller presents it (KeepAlive, Release).
type leaseClaim struct {
	name, holder string
	leader       fence.Condition // leader key @ granting term
	rev          int64           // create revision of keys.Lease(name)
}

func (x *Server) Acquire(ctx context.Context, req *curatorv1.AcquireRequest) (*curatorv1.AcquireResponse, error) {
	l, err := x.acquire(ctx, req.GetName(), req.GetHolder(), req.GetTtlSeconds())
	if err != nil {
		return nil, err
	}
	return &curatorv1.AcquireResponse{Lease: l}, nil
}

// acquire grants the lease, or returns the caller's own lease of this term
// (kept alive), or says who holds it until when (FailedPrecondition). A
// record of an older term, or one that expired, is replaced. The name (a
// DNS label, so a plain etcd key segment), the holder and the TTL (2..60s)
// are AcquireRequest's contract.
func (x *Server) acquire(ctx context.Context, name, holder string, ttl int64) (*curatorv1.Lease, error) {
	key := keys.Lease(name)
	for range acquireAttempts {
		leaderKey, term, ok := x.lead.Ours()
		if !ok {
			return nil, rpcerr.NotLeader
		}
		cur, err := x.read(ctx, name)
		if err != nil {
			return nil, err
		}
		if cur != nil {
			switch {
			case cur.rec.Term > term:
				// Only a later leader writes a later term, and it leads
				// only after our key is gone: confirm, and step down.
				if _, err := x.lead.Txn(ctx, nil); err != nil {
					return nil, err
				}
				return nil, fmt.Errorf("%w: lease %s was granted in term %d, after this replica's term %d", rpcerr.Conflict, name, cur.rec.Term, term)
			case cur.rec.Term == term && cur.rec.Holder == holder:
				// Idempotent: the caller's own lease, kept alive.
				start := time.Now()
				ka, err := x.etcd.KeepAliveOnce(ctx, cur.id)
				if err == nil {
					return cur.proto(name, leaderKey, start.Add(time.Duration(ka.TTL)*time.Second)), nil
				}
				if left, alive, lerr := x.remaining(ctx, cur.id); lerr != nil || (alive && left > 0) {
					return nil, fmt.Errorf("keep lease %s alive: %w", name, err)
				}
				// Expired a moment ago: replace it below.
			case cur.rec.Term == term:
				left, alive, err := x.remaining(ctx, cur.id)
				if err != nil {
					return nil, err
				}
				if alive {
					return nil, rpcerr.LeaseHeldBy(name, cur.rec.Holder, time.Now().Add(left))
				}
			}
			// A record of an older term (or unreadable, term 0), or an
			// expired one: delete it, pinned to the revision read, then
			// grant afresh.
			_, err := x.lead.Txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", cur.createRev)}, clientv3.OpDelete(key))
			if errors.Is(err, rpcerr.Conflict) {
				continue
			}
			if err != nil {
				return nil, err
			}
			x.revoke(cur.id)
			x.log.Info("lease record replaced", "lease", name, "holder", cur.rec.Holder, "granted_term", cur.rec.Term, "term", term, "for", holder)
			continue
		}

		start := time.Now()
		g, err := x.etcd.Grant(ctx, ttl)
		if err != nil {
			return nil, fmt.Errorf("grant etcd lease for %s: %w", name, err)
		}
		rec := leaseRecord{Holder: holder, Term: term, LeaderKey: leaderKey, TTLSeconds: g.TTL, Granted: start.UTC()}
		val, err := json.Marshal(rec)
		if err != nil {
			x.revoke(g.ID)
			return nil, fmt.Errorf("encode lease record: %w", err)
		}
		resp, err := x.lead.Txn(ctx,
			[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
			clientv3.OpPut(key, string(val), clientv3.WithLease(g.ID)))
		if err != nil {
			x.revoke(g.ID)
			if errors.Is(err, rpcerr.Conflict) {
				continue // someone acquired it meanwhile: decide again
			}
			return nil, err
		}
		got := &storedLease{rec: rec, createRev: resp.Header.Revision, modRev: resp.Header.Revision, id: g.ID}
		x.log.Info("lease granted", "lease", name, "holder", holder, "term", term, "revision", got.createRev, "ttl", g.TTL)
		return got.proto(name, leaderKey, start.Add(time.Duration(g.TTL)*time.Second)), nil
	}
	return nil, fmt.Errorf("%w: lease %s changed under every attempt; retry", rpcerr.Conflict, name)
}

func (x *Server) KeepAlive(ctx context.Context, req *curatorv1.KeepAliveRequest) (*curatorv1.KeepAliveResponse, error) {
	l, err := x.keepAlive(ctx, req.GetLease())
	if err != nil {
		return nil, err
	}
	return &curatorv1.KeepAliveResponse{Lease: l}, nil
}

// keepAlive extends the caller's lease if it is still the stored one and
// was granted in this leader's term; anything else is stale (Aborted).
func (x *Server) keepAlive(ctx context.Context, l *curatorv1.Lease) (*curatorv1.Lease, error) {
	c, err := parseLeaseClaim(l)
	if err != nil {
		return nil, err
	}
	leaderKey, term, ok := x.lead.Ours()
	if !ok {
		return nil, rpcerr.NotLeader
	}
	if c.leader.Key != leaderKey || c.leader.CreateRevision != term {
		return nil, staleLease("lease %s was granted in term %d, the leader's term is %d: acquire again", c.name, c.leader.CreateRevision, term)
	}
	cur, err := x.read(ctx, c.name)
	if err != nil {
		return nil, err
	}
	if err := cur.matches(c, term); err != nil {
		return nil, err
	}
	start := time.Now()
	ka, err := x.etcd.KeepAliveOnce(ctx, cur.id)
	if err != nil {
		if left, alive, lerr := x.remaining(ctx, cur.id); lerr == nil && (!alive || left == 0) {
			return nil, staleLease("lease %s expired: acquire again", c.name)
		}
		return nil, fmt.Errorf("keep lease %s alive: %w", c.name, err)
	}
	return cur.proto(c.name, leaderKey, start.Add(time.Duration(ka.TTL)*time.Second)), nil
}

func (x *Server) Release(ctx context.Context, req *curatorv1.ReleaseRequest) (*curatorv1.ReleaseResponse, error) {
	if err := x.release(ctx, req.GetLease()); err != nil {
		return nil, err
	}
	return &curatorv1.ReleaseResponse{}, nil
}

// release deletes the caller's lease record (and revokes its etcd lease)
// if it is still the caller's. A lease that is gone, or held by someone
// else by now, is released already: success, nothing touched.
func (x *Server) release(ctx context.Context, l *curatorv1.Lease) error {
	c, err := parseLeaseClaim(l)
	if err != nil {
		return err
	}
	cur, err := x.read(ctx, c.name)
	if err != nil {
		return err
	}
	if cur == nil || cur.createRev != c.rev || cur.rec.Holder != c.holder {
		return nil
	}
	key := keys.Lease(c.name)
	_, err = x.lead.Txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", c.rev)}, clientv3.OpDelete(key))
	if errors.Is(err, rpcerr.Conflict) {
		return nil // expired or replaced meanwhile
	}
	if err != nil {
		return err
	}
	x.revoke(cur.id)
	x.log.Info("lease released", "lease", c.name, "holder", c.holder, "revision", c.rev)
	return nil
}

// read returns the stored lease record, nil if there is none. An
// unreadable record reads as one of term 0: stale, and replaced by the next
// Acquire.
func (x *Server) read(ctx context.Context, name string) (*storedLease, error) {
	resp, err := x.etcd.Get(ctx, keys.Lease(name))
	if err != nil {
		return nil, fmt.Errorf("read lease %s: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	kv := resp.Kvs[0]
	sl := &storedLease{createRev: kv.CreateRevision, modRev: kv.ModRevision, id: clientv3.LeaseID(kv.Lease)}
	if err := json.Unmarshal(kv.Value, &sl.rec); err != nil {
		x.log.Warn("unreadable lease record", "lease", name, "err", err)
		sl.rec = leaseRecord{}
	}
	return sl, nil
}

// remaining is how long the etcd lease id has left, in whole seconds, and
// whether it still exists. etcd truncates: 0 means less than a second left
// (or expired a moment ago and not revoked yet), so a lease at 0 still
// counts as held; only a lease etcd no longer knows (TTL -1) is gone.
func (x *Server) remaining(ctx context.Context, id clientv3.LeaseID) (left time.Duration, alive bool, err error) {
	if id == clientv3.NoLease {
		return 0, false, nil
	}
	resp, err := x.etcd.TimeToLive(ctx, id)
	if err != nil {
		return 0, false, fmt.Errorf("read etcd lease %x: %w", int64(id), err)
	}
	if resp.TTL < 0 {
		return 0, false, nil
	}
	return time.Duration(resp.TTL) * time.Second, true, nil
}

// revoke drops an etcd lease whose record is deleted or was never written.
// Only clean-up: the lease expires on its own otherwise.
func (x *Server) revoke(id clientv3.LeaseID) {
	if id == clientv3.NoLease {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := x.etcd.Revoke(ctx, id); err != nil {
		x.log.Debug("revoke etcd lease", "id", fmt.Sprintf("%x", int64(id)), "err", err)
	}
}

// matches says whether the stored lease is still the one the caller
// claims, granted in this term; if not, why (a stale fence).
func (sl *storedLease) matches(c leaseClaim, term int64) error {
	switch {
	case sl == nil:
		return staleLease("lease %s expired (or was released): acquire again", c.name)
	case sl.rec.Holder != c.holder:
		return staleLease("lease %s is held by %s now: acquire again", c.name, sl.rec.Holder)
	case sl.createRev != c.rev:
		return staleLease("lease %s was granted again (revision %d, not %d): use the lease the latest Acquire returned", c.name, sl.createRev, c.rev)
	case sl.rec.Term != term:
		return staleLease("lease %s was granted in term %d, the leader's term is %d: acquire again", c.name, sl.rec.Term, term)
	}
	return nil
}

// proto is the lease as granted by the leader at leaderKey, with its fence.
func (sl *storedLease) proto(name, leaderKey string, expires time.Time) *curatorv1.Lease {
	f := fence.Fence{Conditions: []fence.Condition{
		{Key: leaderKey, CreateRevision: sl.rec.Term},
		{Key: keys.Lease(name), CreateRevision: sl.createRev},
	}}
	return &curatorv1.Lease{
		Name:    name,
		Holder:  sl.rec.Holder,
		Fence:   f.Proto(),
		Expires: timestamppb.New(expires),
		Term:    sl.rec.Term,
	}
}

// parseLeaseClaim checks a lease as Acquire returned it: its fence is
// [leader key @ term, leases/<name> @ revision]. That the lease is there,
// and its name and holder, are the requests' contract.
func parseLeaseClaim(l *curatorv1.Lease) (leaseClaim, error) {
	c := leaseClaim{name: l.GetName(), holder: l.GetHolder()}
	leader, lease, err := FenceShape(fence.FromProto(l.GetFence()), c.name)
	if err != nil {
		return c, err
	}
	if l.GetTerm() != leader.CreateRevision {
		return c, fmt.Errorf("%w: lease term %d disagrees with its fence (leader key @ %d)", rpcerr.Invalid, l.GetTerm(), leader.CreateRevision)
	}
	c.leader, c.rev = leader, lease.CreateRevision
	return c, nil
}

// FenceShape checks that f is exactly [a leader key, leases/<name>]
// and returns the two conditions.
func FenceShape(f fence.Fence, name string) (leader, lease fence.Condition, err error) {
	if err := f.Validate(keys.LeaderElection, keys.LeasesPrefix); err != nil {
		return leader, lease, fmt.Errorf("%w: %v", rpcerr.Invalid, err)
	}
	var nLeader, nLease int
	for _, c := range f.Conditions {
		switch {
		case strings.HasPrefix(c.Key, keys.LeaderElection):
			leader, nLeader = c, nLeader+1
		case c.Key == keys.Lease(name):
			lease, nLease = c, nLease+1
		}
	}
	if nLeader != 1 || nLease != 1 || len(f.Conditions) != 2 {
		return leader, lease, fmt.Errorf("%w: the fence of lease %s is [the leader key that granted it (under %s) @ term, %s @ its revision], as Acquire returned it; got [%s]",
			rpcerr.Invalid, name, keys.LeaderElection, keys.Lease(name), f)
	}
	return leader, lease, nil
}

// dropOldTermLeases deletes, when this replica becomes leader, every lease
// record granted in an earlier term. Such a record's fence names the old
// leader key and fails anyway; but until it expires, a caller could pair the
// NEW leader key with it and pass a fence check elsewhere (the consensus
// service checks conditions, not their pairing). Each delete is guarded by
// the record's create revision, so a lease granted meanwhile stays.
// DropOldTerm deletes the lease records of terms other than term (a new
// leader does, once it leads): no record of an earlier term waits out its
// TTL.
func DropOldTerm(ctx context.Context, etcd *clientv3.Client, lead Leadership, log *slog.Logger, term int64) error {
	resp, err := etcd.Get(ctx, keys.LeasesPrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("read leases: %w", err)
	}
	for _, kv := range resp.Kvs {
		var rec leaseRecord
		if json.Unmarshal(kv.Value, &rec) == nil && rec.Term == term {
			continue
		}
		_, err := lead.Txn(ctx,
			[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)},
			clientv3.OpDelete(string(kv.Key)))
		if err != nil && !errors.Is(err, rpcerr.Conflict) {
			return fmt.Errorf("drop old-term lease %s: %w", kv.Key, err)
		}
		if err == nil {
			log.Info("dropped a lease of an earlier term", "lease", string(kv.Key), "holder", rec.Holder, "term", rec.Term)
		}
	}
	return nil
}

// staleLease says that the caller's lease no longer holds: acquire again.
func staleLease(format string, args ...any) error {
	return &fence.StaleError{Part: fence.PartLease, Reason: fmt.Sprintf(format, args...)}
}

// StaleLeader says that the caller's fence is of an older leader term.
func StaleLeader(format string, args ...any) error {
	return &fence.StaleError{Part: fence.PartLeader, Reason: fmt.Sprintf(format, args...)}
}
