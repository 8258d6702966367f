// Package run starts the long-running parts of a process together under one
// root context and stops them together (STYLE rule 3).
//
//	        Run(ctx)
//	           │ root context
//	  ┌────────┼─────────┐
//	"grpc"  "etcd"   "health"      each a Runnable: func(ctx) error
//	  │
//	returns (error or not) ──▶ cancel root ──▶ all others return ──▶ Run returns
//
// The first part to return ends the group: a part that fails returns its
// error, and restarting is the job of whoever supervises the process. Parts
// report readiness with Ready; WaitReady lets one part (typically the one that
// flips the gRPC health status to SERVING) wait for the others.
package run

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Runnable is a long-running part of a process. It runs until ctx is
// cancelled, then cleans up and returns nil (or ctx.Err()). Returning earlier
// stops the whole group.
type Runnable func(ctx context.Context) error

// ErrExited is reported for a part that returned nil before the group was
// asked to stop: a long-running part that quietly ends is a failure of the
// process, not a shutdown.
var ErrExited = errors.New("exited before shutdown")

// ErrStopped is returned by WaitReady when the group stops before every part
// became ready.
var ErrStopped = errors.New("run group stopped")

// Group is a set of named Runnables. The zero value is ready to use. Add
// parts before calling Run; Run may be called once.
type Group struct {
	mu      sync.Mutex
	parts   []part
	ready   map[string]bool
	started bool
	// changed is closed and replaced whenever readiness changes or the
	// group stops, waking WaitReady callers.
	changed chan struct{}
	stopped bool
}

type part struct {
	name string
	run  Runnable
}

// Add registers a part. It panics on a duplicate name or after Run started:
// both are programming errors.
func (g *Group) Add(name string, r Runnable) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started {
		panic(fmt.Sprintf("run: Add(%q) after Run", name))
	}
	if _, dup := g.ready[name]; dup {
		panic(fmt.Sprintf("run: duplicate part %q", name))
	}
	if g.ready == nil {
		g.ready = make(map[string]bool)
	}
	g.parts = append(g.parts, part{name: name, run: r})
	g.ready[name] = false
}

// AddReady registers a part that needs no warm-up: it is ready as soon as
// it starts.
func (g *Group) AddReady(name string, r Runnable) {
	g.Add(name, func(ctx context.Context) error {
		g.Ready(name)
		return r(ctx)
	})
}

// Ready marks a part ready. Parts without a warm-up call it when they start.
// It panics on a name that was never added.
func (g *Group) Ready(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.ready[name]; !ok {
		panic(fmt.Sprintf("run: Ready(%q): no such part", name))
	}
	if !g.ready[name] {
		g.ready[name] = true
		g.notifyLocked()
	}
}

// Readiness reports each part's readiness.
func (g *Group) Readiness() map[string]bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := make(map[string]bool, len(g.ready))
	for k, v := range g.ready {
		m[k] = v
	}
	return m
}

// WaitReady blocks until every part is ready. It returns ctx.Err() if ctx
// ends first and ErrStopped if the group stops first.
func (g *Group) WaitReady(ctx context.Context) error {
	for {
		g.mu.Lock()
		if g.stopped {
			g.mu.Unlock()
			return ErrStopped
		}
		all := true
		for _, r := range g.ready {
			all = all && r
		}
		changed := g.changedLocked()
		g.mu.Unlock()
		if all {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// Run starts every part under one context derived from ctx and waits for all
// of them to return. The first part to return cancels the others. Run returns
// the first error as "run <name>: <err>" and nil when the parts stopped
// because ctx was cancelled. Errors that only report the cancellation
// (context.Canceled, context.DeadlineExceeded) are not failures.
func (g *Group) Run(ctx context.Context) error {
	g.mu.Lock()
	if g.started {
		g.mu.Unlock()
		return errors.New("run: group already ran")
	}
	g.started = true
	parts := g.parts
	g.mu.Unlock()

	defer func() {
		g.mu.Lock()
		g.stopped = true
		g.notifyLocked()
		g.mu.Unlock()
	}()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// first is recorded before the failing part cancels ctx, so errors that
	// other parts return while shutting down cannot overtake the cause.
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for _, p := range parts {
		wg.Go(func() {
			err := p.run(ctx)
			// Was this part asked to stop, or did it end on its own?
			stopping := ctx.Err() != nil
			switch {
			case err == nil && !stopping:
				err = ErrExited
			case stopping && isCancellation(err):
				err = nil // it only reports that it was stopped
			}
			if err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("run %s: %w", p.name, err)
				}
				mu.Unlock()
			}
			cancel()
		})
	}
	wg.Wait()
	return first
}

func isCancellation(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

func (g *Group) changedLocked() chan struct{} {
	if g.changed == nil {
		g.changed = make(chan struct{})
	}
	return g.changed
}

func (g *Group) notifyLocked() {
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}

// Sleep waits d or until ctx ends, whichever comes first; it reports
// whether ctx is still alive.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
