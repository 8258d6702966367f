package reconciler

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"curia.dev/platform/rpcerr"
)

// TestLoopWakesAtRecheck: after a pass whose plan changes by time alone
// before the next tick, the next pass runs at that instant, not at the
// tick; an instant already past runs it at once; a later pass that
// reports none (a trigger came first) cancels the wake-up; an action still
// runs the next pass at once. On synctest's clock, so the instants are
// exact.
func TestLoopWakesAtRecheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newBareReconciler(Config{Tick: 10 * time.Second})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		start := time.Now()
		s := func(n int) time.Duration { return time.Duration(n) * time.Second }
		// What each pass reports: acted, and the recheck after start (-1: none).
		script := []struct {
			acted   bool
			recheck time.Duration
		}{
			{recheck: s(3)},  // at 0 (kicked): wake at 3
			{recheck: s(2)},  // at 3: an instant past: at once
			{recheck: -1},    // at 3: none: the tick at 10
			{recheck: s(16)}, // at 10: wake at 16, but a trigger at 12 comes first
			{recheck: -1},    // at 12: none: no pass at 16, the tick at 20
			{acted: true, recheck: -1},
			{recheck: -1}, // at 20 again: after the action
		}
		time.AfterFunc(s(12), r.kick)
		var passes []time.Duration
		pass := func(context.Context) (bool, time.Time) {
			passes = append(passes, time.Since(start))
			step := script[len(passes)-1]
			if len(passes) == len(script) {
				cancel()
			}
			if step.recheck < 0 {
				return step.acted, time.Time{}
			}
			return step.acted, start.Add(step.recheck)
		}
		r.kick()
		if err := r.runPasses(ctx, pass); err != nil {
			t.Fatal(err)
		}
		if want := []time.Duration{0, s(3), s(3), s(10), s(12), s(20), s(20)}; !slices.Equal(passes, want) {
			t.Fatalf("passes at %v, want %v", passes, want)
		}
	})
}

// TestLoopQuietAfterARetryDelay: an action refused with a retry delay
// (etcd's reconfiguration window) is tried again when the delay ends, not
// at each trigger meanwhile: each refused membership call bumps the epoch
// twice, and the watch of the epoch kicked a pass at once, which failed
// again (a busy loop of 148 refused calls in 3 s on make run).
func TestLoopQuietAfterARetryDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newBareReconciler(Config{Tick: 10 * time.Second})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		start := time.Now()
		refused := rpcerr.ToStatus(context.Background(), nil, "test", rpcerr.RetryAfter(fmt.Errorf("%w: etcd's window", rpcerr.ChangePending), 2*time.Second))
		var passes []time.Duration
		pass := func(context.Context) (bool, time.Time) {
			passes = append(passes, time.Since(start))
			switch len(passes) {
			case 1:
				r.afterFailure(refused)
				r.kick() // the epoch's echoes: now, and a second later
				time.AfterFunc(time.Second, r.kick)
			case 2:
				cancel()
			}
			return false, time.Time{}
		}
		r.kick()
		if err := r.runPasses(ctx, pass); err != nil {
			t.Fatal(err)
		}
		if want := []time.Duration{0, 2 * time.Second}; !slices.Equal(passes, want) {
			t.Fatalf("passes at %v, want %v", passes, want)
		}
	})
}
