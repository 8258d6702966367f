package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
)

func (a *app) auditCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "audit",
		Short:   "Read the audit log",
		Example: `  curiactl audit tail -n 20`,
	}
	cmd.AddCommand(a.auditTailCmd())
	return cmd
}

// auditHeader and auditLine are audit tail's columns, fixed widths so that
// lines printed as they come (-f) line up.
const auditFormat = "%-9s  %-20s  %-12s  %-39s  %-37s  %s\n"

func auditHeader(w io.Writer) {
	fmt.Fprintf(w, auditFormat, "REVISION", "TIME", "ACTOR", "ACTION", "NODE", "REASON")
}

func auditLine(w io.Writer, r *curatorv1.WatchAuditLogResponse) {
	e := r.GetEvent()
	reason := e.GetReason()
	if o := e.GetOutcome(); o != auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED {
		reason = "[" + enumName(o.String(), "CHANGE_OUTCOME_") + "] " + reason
	}
	fmt.Fprintf(w, auditFormat, fmt.Sprint(r.GetRevision()), timestamp(e.GetTime()), orDash(e.GetActor()),
		enumName(e.GetAction().String(), "AUDIT_ACTION_"), orDash(e.GetNodeId()), strings.ReplaceAll(orDash(reason), "\n", " "))
}

func (a *app) auditTailCmd() *cobra.Command {
	var follow bool
	var n int64
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Show the newest audit events, and with -f every new one (WatchAuditLog)",
		Long: `Show the newest audit events (Management/WatchAuditLog), oldest first, and
with -f follow new ones until interrupted. The log keeps events for the
curators' --audit-max-age and at most --audit-max-events of them.
-o json prints one JSON object a line (JSON Lines); -o yaml one document
an event.`,
		Example: `  curiactl audit tail -n 20
  curiactl audit tail -f
  curiactl audit tail -n 100 -o json | jq -r .event.action`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if n < 1 {
				return usageError{fmt.Errorf("-n %d: want at least 1", n)}
			}
			m, err := a.mgmt()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if !follow {
				var cancel func()
				ctx, cancel = a.call(ctx)
				defer cancel()
			}
			stream, err := m.WatchAuditLog(ctx, &curatorv1.WatchAuditLogRequest{Backlog: n, NoFollow: !follow})
			if err != nil {
				return err
			}
			if a.output == "table" {
				auditHeader(a.stdout)
			}
			for {
				r, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					return nil
				}
				if err != nil {
					if follow && ctx.Err() != nil {
						return nil // interrupted
					}
					return err
				}
				if err := a.printEvent(r); err != nil {
					return err
				}
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "after the newest events, print every new one until interrupted")
	cmd.Flags().Int64VarP(&n, "lines", "n", 10, "how many of the newest events to show first (at most 10000)")
	return cmd
}

func (a *app) printEvent(r *curatorv1.WatchAuditLogResponse) error {
	switch a.output {
	case "json":
		b, err := marshalJSON(r, false)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", b)
		return err
	case "yaml":
		b, err := toYAML(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "---\n%s", b)
		return err
	}
	auditLine(a.stdout, r)
	return nil
}
