package faults

import (
	"context"
	"sync"
	"time"

	"curia.dev/platform/run"
)

// timingsRecorder measures what the faults cost: how long roles and
// membership took to agree again after a heal, how long the curators took
// to answer under a new leader, and how long the standby reconciler took
// to act, after the leader or the active replica was faulted.
type timingsRecorder struct {
	mu                            sync.Mutex
	converge, failover, takeovers []time.Duration
	// unfinished counts episodes that did not end in time.
	convergeLeft, failoverLeft, takeoverLeft int
}

func (t *timingsRecorder) add(list *[]time.Duration, left *int, d time.Duration, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ok {
		*list = append(*list, d)
	} else {
		*left++
	}
}

// convergence waits (at most a minute) for agreement after f's heal.
// It returns the time taken, 0 when the cluster did not converge in time.
func (t *timingsRecorder) convergence(ctx context.Context, c *cluster, f *fault) time.Duration {
	healed := f.Healed
	err := c.converged(ctx, time.Minute)
	if ctx.Err() != nil {
		return 0
	}
	took := time.Since(healed)
	t.add(&t.converge, &t.convergeLeft, took, err == nil)
	if err != nil {
		return 0
	}
	return took
}

// takeover waits, while f is in force (and a little after, for a pause
// that outlasts a TTL by little), for another curator to lead or another
// reconciler process to act than f's target.
func (t *timingsRecorder) takeover(ctx context.Context, c *cluster, f *fault, healed func() bool) {
	for deadline := f.Began.Add(time.Minute); time.Now().Before(deadline) && ctx.Err() == nil; run.Sleep(ctx, 100*time.Millisecond) {
		var other bool
		switch f.takeover {
		case "curator":
			leader, err := c.curatorLeader(ctx)
			other = err == nil && leader != f.Target
		case "reconciler":
			for _, name := range c.activeReconcilers(ctx) {
				other = other || name != f.Target
			}
		}
		if other {
			t.add(t.list(f.takeover), t.left(f.takeover), time.Since(f.Began), true)
			return
		}
		if healed() {
			break
		}
	}
	if ctx.Err() == nil {
		t.add(t.list(f.takeover), t.left(f.takeover), 0, false)
	}
}

func (t *timingsRecorder) list(kind string) *[]time.Duration {
	if kind == "curator" {
		return &t.failover
	}
	return &t.takeovers
}

func (t *timingsRecorder) left(kind string) *int {
	if kind == "curator" {
		return &t.failoverLeft
	}
	return &t.takeoverLeft
}

func (t *timingsRecorder) summary() (converge, failover, takeover Timings) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return timings(t.converge, t.convergeLeft), timings(t.failover, t.failoverLeft), timings(t.takeovers, t.takeoverLeft)
}
