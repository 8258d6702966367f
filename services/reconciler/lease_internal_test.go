package reconciler

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/backoff"
)

// TestLeaseStopsActingBeforeItExpires: by its own clock, a replica stops
// acting a fifth of the TTL before its lease expires, so that an action it
// starts cannot land after the curator granted the lease to another
// replica; a keep-alive gives it the lease back in full.
func TestLeaseStopsActingBeforeItExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 10 * time.Second
		r := newBareReconciler(Config{Tick: time.Hour, LeaseTTL: ttl})
		granted := func() *curatorv1.Lease {
			return &curatorv1.Lease{Name: leaseName, Holder: "me", Expires: timestamppb.New(time.Now().Add(ttl))}
		}
		r.lease.set(granted(), "me")
		if r.lease.current() == nil {
			t.Fatal("a lease just granted is not current")
		}
		time.Sleep(ttl - ttl/5 - time.Millisecond)
		if r.lease.current() == nil {
			t.Fatalf("the lease is not current %v before it expires (the margin is %v)", ttl/5+time.Millisecond, ttl/5)
		}
		time.Sleep(2 * time.Millisecond)
		if l := r.lease.current(); l != nil {
			t.Fatalf("the lease is still current %v before it expires, inside the margin of %v", time.Until(l.GetExpires().AsTime()), ttl/5)
		}
		r.lease.set(granted(), "me") // kept alive
		if r.lease.current() == nil {
			t.Fatal("a lease kept alive is not current")
		}
	})
}

// stalledLeases answers keep-alives as the curators do while their etcd
// client sits on a frozen member: a call started before until hangs to its
// deadline; later ones extend the lease by ttl, unless it expired.
type stalledLeases struct {
	curatorv1.LeasesClient
	until time.Time
	ttl   time.Duration
	kept  int
}

func (s *stalledLeases) KeepAlive(ctx context.Context, req *curatorv1.KeepAliveRequest, _ ...grpc.CallOption) (*curatorv1.KeepAliveResponse, error) {
	if time.Now().Before(s.until) {
		<-ctx.Done()
		return nil, status.Error(codes.DeadlineExceeded, ctx.Err().Error())
	}
	if !time.Now().Before(req.GetLease().GetExpires().AsTime()) {
		return nil, status.Error(codes.FailedPrecondition, "lease expired: acquire again")
	}
	s.kept++
	l := proto.Clone(req.GetLease()).(*curatorv1.Lease)
	l.Expires = timestamppb.New(time.Now().Add(s.ttl))
	return &curatorv1.KeepAliveResponse{Lease: l}, nil
}

func (s *stalledLeases) Release(context.Context, *curatorv1.ReleaseRequest, ...grpc.CallOption) (*curatorv1.ReleaseResponse, error) {
	return &curatorv1.ReleaseResponse{}, nil
}

// TestLeaseSurvivesAStalledCurator: the curators stall for three quarters
// of the TTL (every keep-alive sent meanwhile hangs to its deadline of a
// third of the TTL). The keeper tries again soon after each failure, so a
// keep-alive sent after the stall lands before the lease expires. With the
// next try a third of the TTL after a failure, the second try still falls
// in the stall and the lease is lost (a frozen voter cost the e2e test's
// active reconciler its lease this way).
func TestLeaseSurvivesAStalledCurator(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 10 * time.Second
		r := newBareReconciler(Config{Tick: time.Hour, LeaseTTL: ttl})
		curators := &stalledLeases{until: time.Now().Add(ttl * 3 / 4), ttl: ttl}
		r.lease.client = func() curatorv1.LeasesClient { return curators }
		r.lease.set(&curatorv1.Lease{Name: leaseName, Holder: "me", Expires: timestamppb.New(time.Now().Add(ttl))}, "me")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = r.lease.run(ctx, func() {})
		}()
		defer func() { cancel(); <-done }()
		time.Sleep(ttl + ttl/2)
		synctest.Wait()
		r.lease.mu.Lock()
		held := r.lease.held
		r.lease.mu.Unlock()
		if held == nil || curators.kept == 0 {
			t.Fatalf("the lease was lost to a curator stall of %v (keep-alives answered after it: %d)", ttl*3/4, curators.kept)
		}
	})
}

// startingCurators are curators that begin to serve at serving: before,
// every call fails as a connection refused does; then Acquire grants.
type startingCurators struct {
	curatorv1.LeasesClient
	serving time.Time
	ttl     time.Duration
}

func (s *startingCurators) Acquire(_ context.Context, req *curatorv1.AcquireRequest, _ ...grpc.CallOption) (*curatorv1.AcquireResponse, error) {
	if time.Now().Before(s.serving) {
		return nil, status.Error(codes.Unavailable, "connection error: connect: connection refused")
	}
	return &curatorv1.AcquireResponse{Lease: &curatorv1.Lease{Name: req.GetName(), Holder: req.GetHolder(), Expires: timestamppb.New(time.Now().Add(s.ttl))}}, nil
}

func (s *startingCurators) Release(context.Context, *curatorv1.ReleaseRequest, ...grpc.CallOption) (*curatorv1.ReleaseResponse, error) {
	return &curatorv1.ReleaseResponse{}, nil
}

// TestLeaseAcquiredSoonAfterCuratorsServe: a reconciler started before the
// curators (make run starts them all at once) tries again on a backoff
// from 0.1 s while it cannot reach them, so it holds the lease about as
// long after they serve as it had waited before, not a third of the TTL
// after its last try (3.3 s: the cluster's first membership change waited
// for it).
func TestLeaseAcquiredSoonAfterCuratorsServe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 10 * time.Second
		const after = time.Second
		r := newBareReconciler(Config{Tick: time.Hour, LeaseTTL: ttl})
		begun := time.Now()
		r.lease.client = func() curatorv1.LeasesClient { return &startingCurators{serving: begun.Add(after), ttl: ttl} }
		ctx, cancel := context.WithCancel(context.Background())
		held := make(chan time.Duration, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = r.lease.run(ctx, func() { held <- time.Since(begun) })
		}()
		defer func() { cancel(); <-done }()
		select {
		case took := <-held:
			if took > 2*after || r.lease.current() == nil {
				t.Fatalf("the lease was held %v after the start (current: %v), the curators served after %v", took, r.lease.current(), after)
			}
		case <-time.After(ttl):
			t.Fatalf("no lease %v after the start; the curators served after %v", ttl, after)
		}
	})
}

func TestStandbyRetry(t *testing.T) {
	every := 10 * time.Second / 3
	held, err := status.New(codes.FailedPrecondition, "lease held").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(2 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	bo := backoff.New(standbyMinRetry, every)
	if d := standbyRetry(held.Err(), every, bo); d != 2*time.Second {
		t.Errorf("after a held lease with 2 s left: %v, want 2s", d)
	}
	if d := standbyRetry(status.Error(codes.PermissionDenied, "no"), every, bo); d != every {
		t.Errorf("after a refusal: %v, want a third of the TTL (%v)", d, every)
	}
	var waits []time.Duration
	for range 8 {
		waits = append(waits, standbyRetry(status.Error(codes.Unavailable, "connection refused"), every, bo))
	}
	if waits[0] > 2*standbyMinRetry || waits[len(waits)-1] < every*4/5 {
		t.Errorf("after curators it could not reach: %v, want from about %v growing to about %v", waits, standbyMinRetry, every)
	}
}
