package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

func (a *app) nodesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List, show, approve and delete nodes, and change their roles",
		Example: `  curiactl nodes list
  curiactl nodes get node-0123456789abcdef0123456789abcdef`,
	}
	cmd.AddCommand(a.nodesListCmd(), a.nodesGetCmd(), a.nodesApproveCmd(), a.nodesDeleteCmd(), a.nodesRolesCmd(), a.nodesMaintenanceCmd(), a.nodesDecommissionCmd())
	return cmd
}

// getNodes reads every node filter matches (GetNodes' stream).
func (a *app) getNodes(ctx context.Context, filter string) ([]*curatorv1.Node, error) {
	m, err := a.mgmt()
	if err != nil {
		return nil, err
	}
	ctx, cancel := a.call(ctx)
	defer cancel()
	stream, err := m.GetNodes(ctx, &curatorv1.GetNodesRequest{Filter: filter})
	if err != nil {
		return nil, err
	}
	var nodes []*curatorv1.Node
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nodes, nil
		}
		if err != nil {
			return nil, err
		}
		for _, n := range resp.GetNodes() {
			nodes = append(nodes, redact(n))
		}
	}
}

func (a *app) nodesListCmd() *cobra.Command {
	var filter string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the nodes (GetNodes), sorted by id",
		Long: `List the nodes (Management/GetNodes), sorted by id. --filter is a CEL
expression over node (curia.curator.v1.Node), as GetNodes takes it.
HEARTBEAT is how long ago the curators last heard from the node.`,
		Example: `  curiactl nodes list
  curiactl nodes list --filter 'node.state == NODE_STATE_NEW'
  curiactl nodes list --filter 'has(node.roles.consensus_member)' -o json`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			nodes, err := a.getNodes(cmd.Context(), filter)
			if err != nil {
				return err
			}
			return printMessage(a.stdout, a.output, &curatorv1.GetNodesResponse{Nodes: nodes}, func(w io.Writer) {
				nodeTable(w, nodes, time.Now())
			})
		},
	}
	cmd.Flags().StringVar(&filter, "filter", "", "CEL expression over node, e.g. 'node.state == NODE_STATE_UP' (empty: every node)")
	return cmd
}

// nodeTable is nodes list's table.
func nodeTable(w io.Writer, nodes []*curatorv1.Node, now time.Time) {
	row(w, "ID", "STATE", "HEALTH", "ROLES", "ADDRESS", "VERSION", "HEARTBEAT")
	for _, n := range nodes {
		state := enumName(n.GetState().String(), "NODE_STATE_")
		if n.GetUnreadable() != "" {
			state = "UNREADABLE"
		}
		// A write's answer (approve, roles set) leaves the computed
		// health and heartbeat unset: "-", not "never".
		health, heartbeat := "-", "-"
		if n.GetHealth() != curatorv1.NodeHealth_NODE_HEALTH_UNSPECIFIED {
			health, heartbeat = enumName(n.GetHealth().String(), "NODE_HEALTH_"), ago(n.GetLastHeartbeat(), now)
		}
		if mt := n.GetMaintenance(); mt != nil && now.Before(mt.GetUntil().AsTime()) {
			state += "+MAINTENANCE"
		}
		row(w, n.GetId(), state, health, roles(n.GetRoles()),
			orDash(n.GetStatus().GetAddress()), orDash(n.GetStatus().GetVersion()), heartbeat)
	}
}

// nodeDetail is nodes get's table: one field a line.
func nodeDetail(w io.Writer, n *curatorv1.Node, now time.Time) {
	st := n.GetStatus()
	row(w, "ID:", n.GetId())
	if n.GetUnreadable() != "" {
		row(w, "UNREADABLE:", n.GetUnreadable())
	}
	row(w, "STATE:", enumName(n.GetState().String(), "NODE_STATE_"))
	row(w, "HEALTH:", enumName(n.GetHealth().String(), "NODE_HEALTH_"))
	row(w, "LAST HEARTBEAT:", timestamp(n.GetLastHeartbeat())+" ("+ago(n.GetLastHeartbeat(), now)+")")
	row(w, "ROLES:", roles(n.GetRoles()))
	if j := n.GetRoles().GetConsensusMember().GetJoin(); j != nil {
		row(w, "ETCD MEMBER:", fmt.Sprintf("%016x", j.GetMemberId()))
	}
	row(w, "ADDRESS:", orDash(st.GetAddress()))
	row(w, "VERSION:", orDash(st.GetVersion()))
	row(w, "SERVICES:", orDash(strings.Join(st.GetRunningServices(), ",")))
	row(w, "CONSENSUS API:", orDash(st.GetConsensusApi()))
	row(w, "PEER URL:", orDash(st.GetConsensusPeerUrl()))
	row(w, "CLIENT URL:", orDash(st.GetConsensusClientUrl()))
	var labels []string
	for k, v := range n.GetLabels() {
		labels = append(labels, k+"="+v)
	}
	slices.Sort(labels)
	row(w, "LABELS:", orDash(strings.Join(labels, ",")))
	if mt := n.GetMaintenance(); mt != nil {
		row(w, "MAINTENANCE:", fmt.Sprintf("%s, by %s, since %s, until %s", mt.GetReason(), mt.GetBy(), timestamp(mt.GetSince()), timestamp(mt.GetUntil())))
	}
	row(w, "CERTIFICATE SERIAL:", orDash(n.GetCertificateSerial()))
	row(w, "REVISION:", strconv.FormatInt(n.GetRevision(), 10))
	for i, c := range n.GetCertificates() {
		label := ""
		if i == 0 {
			label = "CERTIFICATES:"
		}
		state := "valid"
		if c.GetRevoked() {
			state = "revoked"
		}
		row(w, label, fmt.Sprintf("%s %s, %s until %s", c.GetSerial(), c.GetPrincipal(), state, timestamp(c.GetNotAfter())))
	}
}

func (a *app) nodesGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "get ID",
		Short:   "Show one node",
		Example: `  curiactl nodes get node-0123456789abcdef0123456789abcdef -o yaml`,
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			nodes, err := a.getNodes(cmd.Context(), "node.id == "+strconv.Quote(ids[0]))
			if err != nil {
				return err
			}
			if len(nodes) == 0 {
				return status.Errorf(codes.NotFound, "no node %q", ids[0])
			}
			return printMessage(a.stdout, a.output, nodes[0], func(w io.Writer) { nodeDetail(w, nodes[0], time.Now()) })
		},
	}
}

func (a *app) nodesApproveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "approve ID",
		Short: "Approve a NEW node: it moves to STANDBY and may commit (ApproveNode)",
		Example: `  curiactl nodes list --filter 'node.state == NODE_STATE_NEW'
  curiactl nodes approve node-0123456789abcdef0123456789abcdef`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			return a.nodeWrite(cmd.Context(), func(ctx context.Context, m curatorv1.ManagementClient) (*curatorv1.Node, error) {
				resp, err := m.ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: ids[0]})
				return resp.GetNode(), err
			})
		},
	}
}

func (a *app) nodesDeleteCmd() *cobra.Command {
	var req curatorv1.DeleteNodeRequest
	cmd := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete a node, revoke its certificates and tombstone its id (DeleteNode)",
		Long: `Delete a node (Management/DeleteNode): every certificate issued to it that
is still valid is revoked, and its id never registers again. A node with
roles, or one that is not decommissioned, is refused unless the matching
--safety-bypass-* flag is given.`,
		Example: `  curiactl nodes delete node-0123456789abcdef0123456789abcdef
  curiactl nodes delete node-0123456789abcdef0123456789abcdef --safety-bypass-has-roles --safety-bypass-not-decommissioned`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			m, err := a.mgmt()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd.Context())
			defer cancel()
			req.NodeId = ids[0]
			resp, err := m.DeleteNode(ctx, &req)
			if err != nil {
				return err
			}
			return printMessage(a.stdout, a.output, resp, func(w io.Writer) {
				row(w, "DELETED:", ids[0])
				row(w, "REVOKED:", orDash(strings.Join(resp.GetRevokedSerials(), ",")))
			})
		},
	}
	cmd.Flags().BoolVar(&req.SafetyBypassHasRoles, "safety-bypass-has-roles", false, "delete even though the node has roles (the reconciler then removes its etcd member)")
	cmd.Flags().BoolVar(&req.SafetyBypassNotDecommissioned, "safety-bypass-not-decommissioned", false, "delete even though the node is not decommissioned (UP)")
	return cmd
}

func (a *app) nodesRolesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "roles",
		Short:   "Change a node's roles",
		Example: `  curiactl nodes roles set node-0123456789abcdef0123456789abcdef --kubernetes-worker=true`,
	}
	var consensus, controller, worker bool
	var reason string
	set := &cobra.Command{
		Use:   "set ID",
		Short: "Give or take roles (UpdateNodeRoles); roles not named are left alone",
		Long: `Give (=true) or take (=false) a node's roles (Management/UpdateNodeRoles):
etcd membership first, the role second. A role whose flag is not given is
left as it is. kubernetes-controller requires consensus-member.`,
		Example: `  curiactl nodes roles set node-0123456789abcdef0123456789abcdef --consensus-member=true --reason "replace node-3"
  curiactl nodes roles set node-0123456789abcdef0123456789abcdef --kubernetes-controller=false --kubernetes-worker=true`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			req := &curatorv1.UpdateNodeRolesRequest{NodeId: ids[0], Reason: reason}
			f := cmd.Flags()
			if f.Changed("consensus-member") {
				req.ConsensusMember = &consensus
			}
			if f.Changed("kubernetes-controller") {
				req.KubernetesController = &controller
			}
			if f.Changed("kubernetes-worker") {
				req.KubernetesWorker = &worker
			}
			if req.ConsensusMember == nil && req.KubernetesController == nil && req.KubernetesWorker == nil {
				return usageError{errors.New("name at least one role: --consensus-member, --kubernetes-controller or --kubernetes-worker (=true or =false)")}
			}
			return a.nodeWrite(cmd.Context(), func(ctx context.Context, m curatorv1.ManagementClient) (*curatorv1.Node, error) {
				resp, err := m.UpdateNodeRoles(ctx, req)
				return resp.GetNode(), err
			})
		},
	}
	set.Flags().BoolVar(&consensus, "consensus-member", false, "give (true) or take (false) ConsensusMember: an etcd member")
	set.Flags().BoolVar(&controller, "kubernetes-controller", false, "give (true) or take (false) KubernetesController (requires ConsensusMember)")
	set.Flags().BoolVar(&worker, "kubernetes-worker", false, "give (true) or take (false) KubernetesWorker")
	set.Flags().StringVar(&reason, "reason", "", "why, for the audit log")
	cmd.AddCommand(set)
	return cmd
}

func (a *app) nodesMaintenanceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "maintenance",
		Short: "Take a node out of service for a while, or bring it back (StartNodeMaintenance, EndNodeMaintenance)",
		Example: `  curiactl nodes maintenance start node-0123456789abcdef0123456789abcdef --reason "kernel upgrade" --duration 15m
  curiactl nodes maintenance end node-0123456789abcdef0123456789abcdef`,
	}
	var reason string
	var duration time.Duration
	start := &cobra.Command{
		Use:     "start ID",
		Short:   "Put a node into maintenance: autopilot neither replaces its voter nor adds a standby; etcd leadership moves away from it",
		Example: `  curiactl nodes maintenance start node-0123456789abcdef0123456789abcdef --reason "kernel upgrade" --duration 15m`,
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			req := &curatorv1.StartNodeMaintenanceRequest{NodeId: ids[0], Reason: reason}
			if duration != 0 {
				req.Duration = durationpb.New(duration)
			}
			return a.nodeWrite(cmd.Context(), func(ctx context.Context, m curatorv1.ManagementClient) (*curatorv1.Node, error) {
				resp, err := m.StartNodeMaintenance(ctx, req)
				return resp.GetNode(), err
			})
		},
	}
	start.Flags().StringVar(&reason, "reason", "", "why, for the audit log (required)")
	start.Flags().DurationVar(&duration, "duration", 0, "how long at most; it ends by itself after (default 10m; 1m to 24h)")
	end := &cobra.Command{
		Use:     "end ID",
		Short:   "End a node's maintenance (ending one not in maintenance changes nothing)",
		Example: `  curiactl nodes maintenance end node-0123456789abcdef0123456789abcdef`,
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			return a.nodeWrite(cmd.Context(), func(ctx context.Context, m curatorv1.ManagementClient) (*curatorv1.Node, error) {
				resp, err := m.EndNodeMaintenance(ctx, &curatorv1.EndNodeMaintenanceRequest{NodeId: ids[0]})
				if err == nil && !resp.GetEnded() {
					fmt.Fprintf(a.stderr, "node %s was not in maintenance: nothing changed\n", ids[0])
				}
				return resp.GetNode(), err
			})
		},
	}
	cmd.AddCommand(start, end)
	return cmd
}

func (a *app) nodesDecommissionCmd() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "decommission ID",
		Short: "Take a node out of service for good: maintenance, its roles (its etcd member first), then DECOMMISSIONED (DecommissionNode); delete needs no bypass after",
		Example: `  curiactl nodes decommission node-0123456789abcdef0123456789abcdef --reason "hardware retired"
  curiactl nodes delete node-0123456789abcdef0123456789abcdef`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			return a.nodeWrite(cmd.Context(), func(ctx context.Context, m curatorv1.ManagementClient) (*curatorv1.Node, error) {
				resp, err := m.DecommissionNode(ctx, &curatorv1.DecommissionNodeRequest{NodeId: ids[0], Reason: reason})
				return resp.GetNode(), err
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log (required)")
	return cmd
}

// nodeWrite makes a Management call that answers with the node it
// changed, and prints that node (its table row, or -o).
func (a *app) nodeWrite(ctx context.Context, call func(context.Context, curatorv1.ManagementClient) (*curatorv1.Node, error)) error {
	m, err := a.mgmt()
	if err != nil {
		return err
	}
	ctx, cancel := a.call(ctx)
	defer cancel()
	n, err := call(ctx, m)
	if err != nil {
		return err
	}
	n = redact(n)
	return printMessage(a.stdout, a.output, n, func(w io.Writer) { nodeTable(w, []*curatorv1.Node{n}, time.Now()) })
}
