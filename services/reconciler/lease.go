package reconciler

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	fencev1 "curia.dev/gen/curia/fence/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/backoff"
	"curia.dev/platform/keys"
	"curia.dev/platform/rpcerr"
)

// leaseName is the curator lease the active reconciler holds.
const leaseName = keys.ReconcilerLease

// leaseKeeper campaigns for the lease, keeps it alive while held, and drops
// it the moment the curator says it is stale. Only a replica holding a lease
// that has not expired by its own clock acts.
type leaseKeeper struct {
	r *Reconciler
	// client is the curators' Leases service (tests give another).
	client func() curatorv1.LeasesClient

	mu     sync.Mutex
	held   *curatorv1.Lease
	holder string // who holds it, as last seen
	// since is when this replica took the lease it holds (zero when it
	// holds none): since then a curator leader takes the nodes'
	// heartbeats, and the silences autopilot counts begin then at the
	// earliest (plan.Node.WatchedSince).
	since time.Time
}

func newLeaseKeeper(r *Reconciler) *leaseKeeper { return &leaseKeeper{r: r, client: r.leases} }

// keepAliveRetry is how soon a keep-alive that the curators did not answer
// is tried again: a third of the TTL would leave room for only two tries
// before the lease expires, and a curator stalled for a few seconds (its
// etcd client on a frozen member) would cost the lease.
const keepAliveRetry = 500 * time.Millisecond

// current returns the lease if this replica holds it and it has not
// expired by the local clock (with a margin for the call that follows).
func (k *leaseKeeper) current() *curatorv1.Lease {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.held == nil || time.Until(k.held.GetExpires().AsTime()) < k.r.cfg.LeaseTTL/5 {
		return nil
	}
	return k.held
}

// watchedSince is when this replica took the lease it holds (zero: none).
func (k *leaseKeeper) watchedSince() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.since
}

// fence is the lease's fence, pinned to the membership epoch of a plan.
func (k *leaseKeeper) fence(l *curatorv1.Lease, epoch int64) *fencev1.Fence {
	f := proto.Clone(l.GetFence()).(*fencev1.Fence)
	f.MembershipEpoch = epoch
	return f
}

func (k *leaseKeeper) set(l *curatorv1.Lease, holder string) {
	k.mu.Lock()
	was := k.held != nil
	k.held, k.holder = l, holder
	switch {
	case l == nil:
		k.since = time.Time{}
	case !was:
		k.since = time.Now()
	}
	k.mu.Unlock()
	role := reconcilerv1.Role_ROLE_STANDBY
	if l != nil {
		role = reconcilerv1.Role_ROLE_ACTIVE
	}
	k.r.setRole(role, holder, l)
	switch {
	case l != nil && !was:
		k.r.log.Info("active: holding the lease", "fence", l.GetFence().String(), "term", l.GetTerm())
		k.r.kick()
	case l == nil && was:
		k.r.log.Warn("standby: lease lost", "holder", holder)
	}
}

// drop forgets the lease at once (a stale fence was reported).
func (k *leaseKeeper) drop(why string) {
	k.r.log.Warn("dropping the lease", "why", why)
	k.set(nil, "")
}

// run keeps campaigning for the lease until ctx ends. It calls ready once
// the curator answered (the lease granted, or held by another replica).
// A held lease is kept alive every third of the TTL, and a keep-alive the
// curators did not answer is tried again after keepAliveRetry.
func (k *leaseKeeper) run(ctx context.Context, ready func()) error {
	ttl := k.r.cfg.LeaseTTL
	every := ttl / 3
	unreached := backoff.New(standbyMinRetry, every)
	for {
		k.mu.Lock()
		held := k.held
		k.mu.Unlock()
		next := every
		cctx, cancel := context.WithTimeout(ctx, every)
		if held == nil {
			resp, err := k.client().Acquire(cctx, &curatorv1.AcquireRequest{Name: leaseName, Holder: k.r.holder, TtlSeconds: int64(ttl / time.Second)})
			if err == nil {
				k.set(resp.GetLease(), k.r.holder)
			} else if ctx.Err() == nil {
				// The holder the refusal names (LEASE_HELD's
				// ErrorInfo), not its message: GetStatus's
				// lease_holder is a replica's holder name, which
				// tools compare.
				k.r.setRole(reconcilerv1.Role_ROLE_STANDBY, rpcerr.Meta(err, "holder"), nil)
				next = standbyRetry(err, every, unreached)
			}
			if answered(err) {
				unreached.Reset()
				ready()
			}
		} else {
			resp, err := k.client().KeepAlive(cctx, &curatorv1.KeepAliveRequest{Lease: held})
			switch {
			case err == nil:
				k.set(resp.GetLease(), k.r.holder)
			case status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded:
				// The curator may be failing over; current() stops us
				// acting once the lease is past its expiry.
				if time.Now().After(held.GetExpires().AsTime()) {
					k.drop("lease expired while the curator was unreachable: " + err.Error())
				} else {
					next = keepAliveRetry
				}
			default:
				k.drop(status.Convert(err).Message())
			}
		}
		cancel()
		select {
		case <-ctx.Done():
			k.release()
			return nil
		case <-time.After(next):
		}
	}
}

// standbyMinRetry is the shortest wait of a standby between two tries for
// the lease: the curator says how long the lease has left in whole seconds
// of etcd's, so the last second is polled at this pace.
const standbyMinRetry = 100 * time.Millisecond

// standbyRetry is how long a standby waits after Acquire failed with err,
// as bo (standbyMinRetry to every) says: as long as the curator says (a
// held lease's expiry, in LEASE_HELD's RetryInfo: the standby asks again
// then, not up to a third of the TTL later), or, after a failure to reach
// the curators, its next backoff, doubling from standbyMinRetry (a
// reconciler that starts before the curators serve holds the lease a
// moment after they do). After any other refusal: every.
func standbyRetry(err error, every time.Duration, bo *backoff.Backoff) time.Duration {
	if _, says := rpcerr.RetryDelay(err); says || !answered(err) {
		return bo.After(err)
	}
	return every
}

// answered reports whether a call's error is the curator's answer, not a
// failure to reach it.
func answered(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown:
		return false
	}
	return true
}

// release gives the lease up on shutdown, so a standby takes over at once.
func (k *leaseKeeper) release() {
	k.mu.Lock()
	held := k.held
	k.held = nil
	k.mu.Unlock()
	if held == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := k.client().Release(ctx, &curatorv1.ReleaseRequest{Lease: held}); err != nil {
		k.r.log.Warn("release lease", "err", err)
	}
}
