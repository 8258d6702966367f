package local

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"curia.dev/platform/recovery"
	"curia.dev/platform/rpc"
	"curia.dev/platform/snapshots"
)

// RecoverOptions say how to recover a cluster that lost its quorum.
type RecoverOptions struct {
	// Confirm is the operator's consent: the node whose data becomes the
	// cluster (the survivor Recover chose, or the node to restore the
	// snapshot on). Without it, Recover only says what it would do.
	Confirm string
	// Snapshot is a snapshot file (Management/GetSnapshot's) to restore
	// instead of a survivor's data.
	Snapshot string
	// Reason goes into the report and the audit log.
	Reason string
	// Wait is how long to wait for the control plane to grow back to its
	// size (0: do not wait).
	Wait time.Duration
	// Settle is how long the survivors may take to notice the loss (no
	// leader anywhere) before a reachable leader means "refused".
	Settle time.Duration
	// Out, if set, gets the progress instead of the cluster's output.
	Out io.Writer
}

// Survivor is one node's consensus process, as the recovery found it.
type Survivor = recovery.Survivor

// RecoveryReport is what curia-local recover did, written to
// <state>/recovery-<time>.json.
type RecoveryReport = recovery.Report

// ErrNoConsent: Recover said what it would do and changed nothing.
var ErrNoConsent = recovery.ErrNoConsent

// Recover rebuilds a cluster whose majority of voters is gone for good, from
// the most up-to-date survivor (or a snapshot): platform/recovery's
// Recover, given this layout's consensus processes, curators and admin
// credentials, and the snapshots of <state>/snapshots to compare with. It
// writes the report to <state>/recovery-<time>.json once the recovery has
// been made (also when the regrowth then times out).
func (c *Cluster) Recover(ctx context.Context, opts RecoverOptions) (*RecoveryReport, error) {
	out := cmp.Or[io.Writer](opts.Out, c.cfg.Out)
	creds, err := rpc.LoadCredentials(c.cfg.Cluster, c.AdminFiles())
	if err != nil {
		return nil, err
	}
	ro := recovery.Options{Confirm: opts.Confirm, Reason: cmp.Or(opts.Reason, "curia-local recover: "+recovery.DefaultReason),
		Wait: opts.Wait, Settle: opts.Settle, Out: out, Program: "curia-local"}
	if opts.Snapshot != "" {
		if ro.Snapshot, err = recovery.ResolveSnapshot(ctx, opts.Snapshot, recovery.ResolveOptions{Dir: c.cfg.State}); err != nil {
			return nil, err
		}
	}
	rc := recovery.Cluster{Curators: c.Curators, Credentials: creds, ControlPlane: c.cfg.ControlPlane,
		Snapshots: func(context.Context) ([]snapshots.Metadata, string, error) {
			dir := c.path(snapshotsDir)
			list, err := snapshots.Dir(dir).List()
			return list, "in " + dir, err
		}}
	c.mu.Lock()
	for _, n := range c.Nodes {
		rc.Nodes = append(rc.Nodes, recovery.Target{Name: n.Name, Addr: n.ConsensusAPI(), NodeID: n.ID})
	}
	c.mu.Unlock()
	rep, err := recovery.Recover(ctx, rc, ro)
	if rep == nil || rep.RecoveredAt.IsZero() {
		return rep, err
	}
	if werr := c.writeRecoveryReport(out, rep); err == nil {
		err = werr
	}
	return rep, err
}

// clock and awaitLoss are platform/recovery's, as this package's test
// drives them.
type clock struct {
	now   func() time.Time
	sleep func(context.Context, time.Duration) error
}

var realClock = clock{now: recovery.RealClock.Now, sleep: recovery.RealClock.Sleep}

func awaitLoss(ctx context.Context, settle time.Duration, clk clock, look func(context.Context) string) error {
	return recovery.AwaitLoss(ctx, settle, recovery.Clock{Now: clk.now, Sleep: clk.sleep}, look)
}

func (c *Cluster) writeRecoveryReport(out io.Writer, rep *RecoveryReport) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	rep.ReportFile = c.path("recovery-" + rep.StartedAt.Format("20060102T150405Z") + ".json")
	if err := os.WriteFile(rep.ReportFile, append(b, '\n'), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(out, "curia-local: report in %s\n", rep.ReportFile)
	return nil
}
