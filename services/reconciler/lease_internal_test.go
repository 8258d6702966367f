package reconciler

import (
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
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
