package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/pki"
)

func (a *app) planCmd() *cobra.Command {
	var propose []string
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Show what the reconciler and autopilot would do now, or under a proposed configuration (Reconciler/Plan)",
		Long: `Show what the reconciler and autopilot would do, without doing it: the
action its next pass would take and the whole sequence it intends from
now (a learner added, promoted, a dead voter replaced...), each step with
the voters and the failure tolerance the cluster has once it is done.

From Reconciler/Plan, asked of any reconciler replica (--reconciler,
$CURIA_RECONCILERS, else $CURIA_RECONCILER): it observes the cluster
now and plans as a pass would, under the stored cluster configuration,
or, with --propose KEY=VALUE (the keys of config set), under the
configuration that change would leave. Nothing is written: a proposal is
checked as config set checks it (INVALID_ARGUMENT, exit 6, for a value it
refuses) and planned under, and config set applies it.

The sequence assumes every step goes as planned; members it adds have
placeholder ids. Passes plan anew from what they observe, so a step that
goes otherwise changes the rest. A paused autopilot (config paused=true)
plans nothing it would act on.`,
		Example: `  curiactl plan
  curiactl plan --propose control_plane_size=5
  curiactl plan --propose control_plane_size=1 --propose paused=false -o json`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &reconcilerv1.PlanRequest{}
			if len(propose) > 0 {
				cfg, paths, err := parseAssignments(propose)
				if err != nil {
					return usageError{fmt.Errorf("--propose: %w", err)}
				}
				req.Proposed, req.ProposedMask = cfg, &fieldmaskpb.FieldMask{Paths: paths}
			}
			addrs, _, err := a.setting(setReconcilers, a.reconcilers)
			if err != nil {
				return err
			}
			if addrs == "" {
				return a.missing(setReconcilers, "reconciler address")
			}
			cc, err := a.dial(addrs, pki.KindReconciler)
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd.Context())
			defer cancel()
			resp, err := reconcilerv1.NewReconcilerClient(cc).Plan(ctx, req)
			if err != nil {
				return err
			}
			return printMessage(a.stdout, a.output, resp, func(w io.Writer) { planTable(w, resp, req.GetProposedMask().GetPaths()) })
		},
	}
	cmd.Flags().StringArrayVar(&propose, "propose", nil, "plan under the configuration as this change would leave it, KEY=VALUE as config set takes it (repeatable)")
	return cmd
}

// planTable is plan's table: what it was planned under and from, then one
// line a step.
func planTable(w io.Writer, p *reconcilerv1.PlanResponse, proposed []string) {
	c := p.GetConfig()
	under := configLine(c)
	if len(proposed) > 0 {
		under += " (proposed: " + strings.Join(proposed, ", ") + "; nothing written)"
	} else {
		under += " (stored)"
	}
	row(w, "PLANNED UNDER:", under)
	row(w, "OBSERVED:", fmt.Sprintf("%d etcd members, %d nodes", p.GetMembers(), p.GetNodes()))
	row(w, "NEXT ACTION:", actionLine(p.GetAction()))
	fmt.Fprintln(w)
	row(w, "STEP", "ACTION", "NODE", "MEMBER", "VOTERS", "HEALTHY", "TOLERANCE", "REASON")
	for i, s := range p.GetSteps() {
		a := s.GetAction()
		member := "-"
		if a.GetMemberId() != 0 {
			member = fmt.Sprintf("%016x", a.GetMemberId())
		}
		row(w, strconv.Itoa(i+1), actionKind(a.GetKind()), orDash(a.GetNodeId()), member,
			strconv.FormatUint(uint64(s.GetVoters()), 10), strconv.FormatUint(uint64(s.GetHealthyVoters()), 10),
			strconv.FormatInt(int64(s.GetFailureTolerance()), 10), oneLine(a.GetReason()))
	}
}

// actionKind is an action kind without its prefix: ADD_MEMBER.
func actionKind(k reconcilerv1.ActionKind) string {
	return enumName(k.String(), "ACTION_KIND_")
}

// actionLine is an action in one line: its kind, node and reason.
func actionLine(a *reconcilerv1.Action) string {
	s := actionKind(a.GetKind())
	if a.GetNodeId() != "" {
		s += " " + a.GetNodeId()
	}
	if r := a.GetReason(); r != "" {
		s += ": " + oneLine(r)
	}
	return s
}

// oneLine is s with its line breaks as spaces ("-" for none).
func oneLine(s string) string {
	return orDash(strings.Join(strings.Fields(s), " "))
}

// configLine is the fields of a cluster configuration autopilot acts on,
// in one line.
func configLine(c *curatorv1.ClusterConfig) string {
	return fmt.Sprintf("control_plane_size=%d paused=%v", c.GetControlPlaneSize(), c.GetPaused())
}
