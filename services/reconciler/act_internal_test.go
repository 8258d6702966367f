package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/fence"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpcerr"
)

// newBareReconciler is a replica with no connections: enough for its
// decisions, which these tests drive by hand.
func newBareReconciler(cfg Config) *Reconciler {
	r := &Reconciler{
		cfg:     cfg,
		log:     slog.New(slog.DiscardHandler),
		trigger: make(chan struct{}, 1),
		status:  &reconcilerv1.GetStatusResponse{},
		metrics: newMetrics(prometheus.NewRegistry()),
	}
	r.lease = newLeaseKeeper(r)
	return r
}

// TestAfterFailure: the reconciler reacts to why its action was refused,
// from the status as it arrives over the wire (code, ErrorInfo reason and
// metadata, RetryInfo), never from its text.
func TestAfterFailure(t *testing.T) {
	// As the consensus or curator server's error interceptor sends it.
	wire := func(err error) error { return rpcerr.ToStatus(context.Background(), nil, "test", err) }
	stale := func(part string) error { return wire(&fence.StaleError{Part: part, Reason: "moved on"}) }
	tests := map[string]struct {
		err       error
		dropLease bool
		kick      bool // a pass at once
		kickLater bool // a pass after RetryInfo's delay, before the tick
	}{
		"stale lease: acquire again":              {err: stale(fence.PartLease), dropLease: true},
		"stale leader: acquire again":             {err: stale(fence.PartLeader), dropLease: true},
		"stale epoch: plan anew at once":          {err: stale(fence.PartEpoch), kick: true},
		"stale condition: plan anew at once":      {err: stale(fence.PartCondition), kick: true},
		"conflict: read again at once":            {err: wire(fmt.Errorf("%w: node changed", rpcerr.Conflict)), kick: true},
		"learner pending: when RetryInfo says":    {err: wire(rpcerr.RetryAfter(fmt.Errorf("%w: catching up", rpcerr.LearnerPending), 50*time.Millisecond)), kickLater: true},
		"a retry longer than the tick: the tick":  {err: wire(rpcerr.RetryAfter(fmt.Errorf("%w: in flight", rpcerr.ChangePending), 2*time.Hour))},
		"a refusal: the next tick, lease kept":    {err: wire(fmt.Errorf("%w: quorum", rpcerr.QuorumAtRisk))},
		"an error without details: the next tick": {err: errors.New("connection reset")},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := newBareReconciler(Config{Tick: time.Hour})
			r.lease.set(&curatorv1.Lease{Name: leaseName, Holder: "me"}, "me")
			<-r.trigger // the kick of becoming active

			r.afterFailure(tc.err)

			r.lease.mu.Lock()
			dropped := r.lease.held == nil
			r.lease.mu.Unlock()
			if dropped != tc.dropLease {
				t.Fatalf("lease dropped: %v, want %v", dropped, tc.dropLease)
			}
			kicked := func() bool {
				select {
				case <-r.trigger:
					return true
				default:
					return false
				}
			}
			if got := kicked(); got != tc.kick {
				t.Fatalf("a pass at once: %v, want %v", got, tc.kick)
			}
			if tc.kickLater {
				proctest.Eventually(t, 10*time.Second, func() error {
					if !kicked() {
						return errors.New("no pass after RetryInfo's delay")
					}
					return nil
				})
			}
		})
	}
}
