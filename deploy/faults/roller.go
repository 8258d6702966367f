package faults

import (
	"context"
	"io"
	mrand "math/rand/v2"
	"strings"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/rolling"
	"curia.dev/platform/run"
)

// roller rolls the whole cluster again and again, the operator's way
// (platform/rolling, as make upgrade does: one process at a time, each
// node in maintenance), while the other nemeses fault it. It is not in the
// nemeses' deck: it runs beside them. Each restart is recorded as a fault
// of kind NemRollingRestart with its host down, so the quorum check knows
// what the roll stopped; a roll that finds the cluster unhealthy (another
// fault in force) waits and tries again, as an operator would.
type roller struct {
	c   *cluster
	nem *nemesis
	rng *mrand.Rand
	// Rolls and Refused count the rolls finished and those that stopped
	// (refused before the first step, or a step that did not get healthy
	// again in time).
	Rolls, Refused int
}

func (r *roller) run(ctx context.Context) {
	for ctx.Err() == nil {
		run.Sleep(ctx, 5*time.Second+time.Duration(r.rng.Int64N(int64(10*time.Second))))
		if ctx.Err() != nil {
			return
		}
		report, err := rolling.Run(ctx, &faultFleet{Fleet: r.c.lc.Fleet(), r: r}, rolling.Options{
			Management:    curatorv1.NewManagementClient(r.c.admin),
			Curator:       curatorv1.NewCuratorClient(r.c.admin),
			Out:           logWriter{r.c},
			Prefix:        "nemesis " + NemRollingRestart,
			Reason:        "fault suite: " + NemRollingRestart,
			HealthTimeout: time.Minute,
		})
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.Refused++
			r.c.logf("nemesis %s: stopped: %v", NemRollingRestart, err)
		default:
			r.Rolls++
			r.c.logf("nemesis %s: %s", NemRollingRestart, report)
		}
	}
}

// faultFleet records each restart as a fault, its host down meanwhile.
type faultFleet struct {
	rolling.Fleet
	r *roller
}

func (f *faultFleet) fault(target string, restart func() ([]string, error)) ([]string, error) {
	ft := &fault{Kind: NemRollingRestart, Target: target, Began: time.Now(), down: []string{target}}
	f.r.nem.record(ft)
	defer f.r.nem.healed(ft)
	return restart()
}

func (f *faultFleet) RestartNode(ctx context.Context, n rolling.Node) ([]string, error) {
	return f.fault(f.r.c.hostOfNode(n.ID), func() ([]string, error) { return f.Fleet.RestartNode(ctx, n) })
}

func (f *faultFleet) RestartCurator(ctx context.Context, name string) ([]string, error) {
	return f.fault(name, func() ([]string, error) { return f.Fleet.RestartCurator(ctx, name) })
}

func (f *faultFleet) RestartReconciler(ctx context.Context, name string) ([]string, error) {
	return f.fault(name, func() ([]string, error) { return f.Fleet.RestartReconciler(ctx, name) })
}

// logWriter writes each line to the run's log.
type logWriter struct{ c *cluster }

func (w logWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.c.logf("%s", line)
	}
	return len(p), nil
}

var _ io.Writer = logWriter{}
