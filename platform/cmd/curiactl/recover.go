package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/offsite"
	"curia.dev/platform/recovery"
	"curia.dev/platform/snapshots"
)

// envConsensus is where --consensus comes from when not given.
const envConsensus = "CURIA_CONSENSUS"

// recoverFlags are recover's and snapshot restore's flags.
type recoverFlags struct {
	consensus string
	snapshot  string
	confirm   string
	reason    string
	wait      time.Duration
	settle    time.Duration
	// s3 reaches the object storage of an s3:// snapshot.
	s3 offsite.Options
}

func (f *recoverFlags) add(cmd *cobra.Command, withSnapshot bool) {
	fs := cmd.Flags()
	fs.StringVar(&f.consensus, "consensus", "", "consensus API address of every control-plane node, host:port[,host:port...] (default $"+envConsensus+")")
	if withSnapshot {
		fs.StringVar(&f.snapshot, "snapshot", "", "restore this snapshot instead of a survivor's data: a file (snapshot save's), or an off-site copy s3://bucket/prefix[/name] (object storage from $CURIA_S3_*)")
	}
	fs.StringVar(&f.confirm, "confirm", "", "consent: the node (id, or address) whose data becomes the cluster; without it, only say what would be done")
	fs.StringVar(&f.reason, "reason", "", "why, for the report and the audit log")
	fs.DurationVar(&f.wait, "wait", 5*time.Minute, "how long to wait for the control plane to grow back (0: do not wait)")
	fs.DurationVar(&f.settle, "settle", 10*time.Second, "how long the survivors may take to notice the loss before a leader seen means a quorum is reachable")
	// The object storage of an s3:// snapshot: the curators' flags.
	s3 := flag.NewFlagSet("s3", flag.ContinueOnError)
	f.s3.AddFlags(s3, "")
	fs.AddGoFlagSet(s3)
}

const recoverLong = `Rebuild a cluster that lost the majority of its etcd voters for good, from
the most up-to-date surviving member or from a snapshot file: curia-local
recover's flow (platform/recovery), against any deployment whose consensus
APIs are reachable from here (--consensus, $CURIA_CONSENSUS; on Kubernetes
through kubectl port-forward to each node pod's port 7100), with the
admin credentials.

  1. Survey: ask every consensus process named for its status.
  2. Wait for the loss to settle: go on only once, for --settle on end, no
     member follows a leader and no curator (--curator, if set) answers
     for a cluster with a leader. A quorum still seen after twice
     --settle is a partition or a slow election, not a loss: refused
     (exit 7), nothing changed.
  3. Choose: the member that applied the highest raft index, or, with
     --snapshot, the node --confirm names. The snapshot file is checked
     first (etcd's sha256 trailer, and the .json metadata beside it if
     any): a file that fails is refused (exit 1) before anything is asked.
  4. Without --confirm naming that node: say what would be done, change
     nothing (exit 7). With it: Consensus/Recover (RestoreSnapshot) on
     that node: a new one-member cluster from its data; the old data is
     moved aside, never deleted.
  5. Wait (--wait) while the reconciler and autopilot grow the control
     plane back to control_plane_size, through the curators.

The progress goes to stdout (-o json/yaml: to stderr, and the report to
stdout). No survivor with data: refused (exit 7); restore a snapshot.`

func (a *app) recoverCmd() *cobra.Command {
	var f recoverFlags
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "Rebuild a cluster that lost its quorum, from the best survivor or a snapshot (Consensus/Recover)",
		Long:  recoverLong,
		Example: `  # what would be done: names the survivor, changes nothing (exit 7)
  curiactl recover --consensus 10.0.0.11:7100,10.0.0.12:7100,10.0.0.13:7100
  # do it, on the node it named
  curiactl recover --confirm node-0123456789abcdef0123456789abcdef --reason "lost two of three voters"
  # Kubernetes: one port-forward a node pod
  kubectl -n curia port-forward pod/curia-node-0 7101:7100 &
  curiactl recover --consensus 127.0.0.1:7101,127.0.0.1:7102 --curator 127.0.0.1:7200`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.recover(cmd.Context(), f) },
	}
	f.add(cmd, true)
	return cmd
}

func (a *app) snapshotRestoreCmd() *cobra.Command {
	var f recoverFlags
	cmd := &cobra.Command{
		Use:   "restore FILE|s3://bucket/prefix[/name]",
		Short: "Restore a snapshot file as a new cluster, after losing every voter (Consensus/RestoreSnapshot)",
		Long: `Restore the snapshot FILE (snapshot save's, or a file of the curators'
snapshot directory), or an off-site copy the curators uploaded
(s3://bucket/prefix/name, or s3://bucket/prefix for the newest; fetched
from the object storage $CURIA_S3_ENDPOINT, $CURIA_S3_ACCESS_KEY and
$CURIA_S3_SECRET_KEY name, and kept only if its size and sha256 match),
as a new one-member cluster on the node --confirm
names, when the cluster lost its quorum for good: curiactl recover
--snapshot FILE. It is refused while a quorum is reachable; see
curiactl recover --help for every step and exit code.` + "\n\n" + recoverLong,
		Example: `  curiactl snapshot restore backup.db --consensus 10.0.0.11:7100,10.0.0.12:7100
  curiactl snapshot restore backup.db --confirm node-0123456789abcdef0123456789abcdef --reason "every voter lost"
  CURIA_S3_ENDPOINT=s3.example:9000 curiactl snapshot restore s3://backups/prod --consensus 10.0.0.11:7100`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, files []string) error {
			f.snapshot = files[0]
			return a.recover(cmd.Context(), f)
		},
	}
	f.add(cmd, false)
	return cmd
}

// recover runs platform/recovery with curiactl's settings.
func (a *app) recover(ctx context.Context, f recoverFlags) error {
	opts := recovery.Options{Confirm: f.confirm, Reason: f.reason, Wait: f.wait, Settle: f.settle, Out: a.stdout, Program: "curiactl"}
	if a.output != "table" {
		opts.Out = a.stderr
	}
	if opts.Reason == "" {
		opts.Reason = "curiactl recover: " + recovery.DefaultReason
	}
	if f.snapshot != "" {
		s3 := f.s3
		s3.Endpoint = cmp.Or(s3.Endpoint, a.getenv(offsite.EnvEndpoint))
		s3.AccessKey = cmp.Or(s3.AccessKey, a.getenv(offsite.EnvAccessKey))
		s3.SecretKey = cmp.Or(s3.SecretKey, a.getenv(offsite.EnvSecretKey))
		s3.Insecure = s3.Insecure || a.getenv(offsite.EnvInsecure) == "true"
		snap, err := recovery.ResolveSnapshot(ctx, f.snapshot, recovery.ResolveOptions{S3: s3})
		if err != nil {
			return err
		}
		opts.Snapshot = snap
	}
	addrs, _, err := a.setting(setConsensus, f.consensus)
	if err != nil {
		return err
	}
	targets := splitAddrs(addrs)
	if len(targets) == 0 {
		return a.missing(setConsensus, "consensus address (every control-plane node's consensus API, host:port)")
	}
	creds, err := a.credentials()
	if err != nil {
		return err
	}
	c := recovery.Cluster{Credentials: creds}
	for _, t := range targets {
		c.Nodes = append(c.Nodes, recovery.Target{Addr: t})
	}
	curators, _, err := a.setting(setCurators, a.curators)
	if err != nil {
		return err
	}
	c.Curators = splitAddrs(curators)
	if len(c.Curators) == 0 {
		fmt.Fprintf(opts.Out, "curiactl: no curator named (--curator, $%s): the quorum is looked for at the consensus processes alone, and the regrowth is not followed\n", envCurators)
		opts.Wait = 0
	} else {
		c.Snapshots = a.curatorSnapshots
	}
	rep, err := recovery.Recover(ctx, c, opts)
	if err != nil {
		return err
	}
	if a.output != "table" {
		return printValue(a.stdout, a.output, rep)
	}
	tw := newTable(a.stdout)
	row(tw, "RECOVERED:", rep.Chosen)
	row(tw, "WHY:", rep.Why)
	if rep.Voters > 0 {
		row(tw, "VOTERS:", fmt.Sprintf("%d, %s after the recovery began", rep.Voters, rep.VotersAfter))
	}
	return tw.Flush()
}

// curatorSnapshots lists the curators' snapshots, for the recovery to
// compare the recovered data with. Right after a recovery the curators
// may have no leader yet: it asks for up to 30 s.
func (a *app) curatorSnapshots(ctx context.Context) ([]snapshots.Metadata, string, error) {
	m, err := a.mgmt()
	if err != nil {
		return nil, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var resp *curatorv1.ListSnapshotsResponse
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err = m.ListSnapshots(cctx, &curatorv1.ListSnapshotsRequest{})
		ccancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	if err != nil {
		return nil, "of the curators (they did not answer: " + status.Code(err).String() + ")", err
	}
	var out []snapshots.Metadata
	for _, s := range resp.GetSnapshots() {
		out = append(out, snapshots.Metadata{Name: s.GetName(), Revision: s.GetRevision()})
	}
	return out, "of the curators", nil
}

// splitAddrs is a comma-separated address list, blanks dropped.
func splitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// recoveryRefused says whether err is a recovery's refusal, which changed
// nothing (exit 7).
func recoveryRefused(err error) bool {
	for _, e := range []error{recovery.ErrNoConsent, recovery.ErrQuorumReachable, recovery.ErrNoSurvivor, recovery.ErrUnknownNode} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
