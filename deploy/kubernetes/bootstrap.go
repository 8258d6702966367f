package kubernetes

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/fieldmaskpb"
	corev1 "k8s.io/api/core/v1"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/nodes"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// BootstrapConfig is curia-kube bootstrap's: the one-shot Job that makes
// the PKI and gives the new cluster its shape, as deploy/compose's pki and
// init services do.
type BootstrapConfig struct {
	Cluster string
	// Curator is the curators' gRPC target.
	Curator string
	// Nodes is how many nodes to approve and wait for: curia-seed's one
	// and curia-node's replicas.
	Nodes int
	// ControlPlane is the control_plane_size written on the first run
	// (autopilot then picks and promotes that many voters).
	ControlPlane int
	// Interval is the time between two looks at the cluster.
	Interval time.Duration
}

// DefaultBootstrapConfig is base/'s shape: the seed and three nodes, three
// voters.
func DefaultBootstrapConfig() BootstrapConfig {
	return BootstrapConfig{Cluster: "curia", Curator: "dns:///" + ServiceCurator + ":7200", Nodes: 4, ControlPlane: 3, Interval: time.Second}
}

// AddFlags registers the flags.
func (c *BootstrapConfig) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Cluster, "cluster", c.Cluster, "cluster name (trust domain of every identity)")
	fs.StringVar(&c.Curator, "curator", c.Curator, "the curators' gRPC target")
	fs.IntVar(&c.Nodes, "nodes", c.Nodes, "nodes to approve and wait for: curia-seed's 1 and curia-node's replicas")
	fs.IntVar(&c.ControlPlane, "control-plane", c.ControlPlane, "control_plane_size to set when the cluster has no configuration yet")
	fs.DurationVar(&c.Interval, "interval", c.Interval, "time between two looks at the cluster")
}

// Validate checks the configuration.
func (c *BootstrapConfig) Validate() error {
	if err := pki.ValidateCluster(c.Cluster); err != nil {
		return err
	}
	switch {
	case c.Curator == "":
		return errors.New("--curator is required")
	case c.Nodes < 1:
		return errors.New("--nodes: at least 1")
	case c.ControlPlane < 1 || c.ControlPlane > c.Nodes:
		return fmt.Errorf("--control-plane %d: 1..--nodes (%d)", c.ControlPlane, c.Nodes)
	case c.Interval <= 0:
		return errors.New("--interval: positive")
	}
	return nil
}

// Bootstrap makes the PKI (once: EnsurePKI), then, as the admin, writes the
// register ticket into its Secret, approves the nodes as they register (up
// to cfg.Nodes), sets control_plane_size on a cluster without a
// configuration, and returns once roles and etcd membership agree (the
// first time: with cfg.ControlPlane voters). Run again on a cluster with
// a configuration, it changes nothing but the ticket's Secret, and waits
// for agreement (plan).
func Bootstrap(ctx context.Context, cfg BootstrapConfig, api *API, out io.Writer, log *slog.Logger) error {
	admin, made, err := EnsurePKI(ctx, api, cfg.Cluster)
	if err != nil {
		return err
	}
	if made {
		fmt.Fprintf(out, "curia-kube: made the PKI: secrets and configmap %s in namespace %s\n", ConfigMapPublic, api.Namespace)
	}
	creds, err := rpc.NewCredentials(cfg.Cluster, admin.CA, admin.Cert, admin.Key)
	if err != nil {
		return fmt.Errorf("the admin's credentials: %w", err)
	}
	conn, err := rpc.Dial(cfg.Curator, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		return err
	}
	defer conn.Close()
	m := curatorv1.NewManagementClient(conn)
	var st bootstrapState
	begun := time.Now()
	for {
		done, err := bootstrapStep(ctx, cfg, api, m, &st, out)
		if done {
			fmt.Fprintf(out, "curia-kube: cluster ready %v after the start: roles and etcd membership agree\n", time.Since(begun).Round(time.Second))
			return nil
		}
		if err != nil {
			log.Info("bootstrap: waiting", "for", err.Error())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(cfg.Interval):
		}
	}
}

// Admin is the admin's credentials, as PEM.
type Admin struct{ CA, Cert, Key []byte }

// bootstrapState is what the Job has done so far.
type bootstrapState struct {
	ticketWritten bool
	// sizeSet: this run wrote control_plane_size, so it waits for that
	// many voters (else for agreement alone: an operator's shape).
	sizeSet bool
}

// view is what one look at the cluster saw.
type view struct {
	nodes []*curatorv1.Node
	// configRevision is the cluster configuration's (0: never written).
	configRevision int64
	consensus      *curatorv1.GetConsensusStatusResponse
}

// step is what to do about a view.
type step struct {
	approve []string
	setSize bool
	done    bool
	// waiting says what the cluster lacks, when not done.
	waiting string
}

// plan decides the bootstrap's next step from a view: approve new nodes
// while fewer than cfg.Nodes are approved (the lowest ids first, so that
// runs agree); once cfg.Nodes are UP and have reported their consensus
// process, set control_plane_size if no configuration exists; done once
// roles and membership agree, with cfg.ControlPlane voters if this run set
// the size.
//
// A cluster with a configuration this run did not write is past its
// bootstrap (the Job runs again after every `kubectl apply -k`: its TTL
// deletes it): it approves nobody (a node registered since is an
// admin's to approve, even where one was deleted) and waits for no node
// count (one may be down, or rolled), only for roles and membership to
// agree.
func plan(cfg BootstrapConfig, st bootstrapState, v view) step {
	var s step
	if v.configRevision != 0 && !st.sizeSet {
		if why := disagreement(v.consensus); why != "" {
			s.waiting = why
			return s
		}
		s.done = true
		return s
	}
	var fresh []string
	approved, up := 0, 0
	for _, n := range v.nodes {
		switch n.GetState() {
		case curatorv1.NodeState_NODE_STATE_NEW:
			fresh = append(fresh, n.GetId())
			continue
		case curatorv1.NodeState_NODE_STATE_UP:
			if n.GetStatus().GetConsensusPeerUrl() != "" {
				up++
			}
		}
		approved++
	}
	slices.Sort(fresh)
	s.approve = fresh[:min(len(fresh), max(0, cfg.Nodes-approved))]
	if up < cfg.Nodes {
		s.waiting = fmt.Sprintf("%d of %d nodes UP with their consensus reported", up, cfg.Nodes)
		return s
	}
	if v.configRevision == 0 && !st.sizeSet {
		s.setSize = true
		s.waiting = "control_plane_size being set"
		return s
	}
	if why := disagreement(v.consensus); why != "" {
		s.waiting = why
		return s
	}
	if st.sizeSet && int(v.consensus.GetVoters()) != cfg.ControlPlane {
		s.waiting = fmt.Sprintf("%d voters of %d", v.consensus.GetVoters(), cfg.ControlPlane)
		return s
	}
	s.done = true
	return s
}

// disagreement says why roles and etcd membership do not agree yet (every
// member a voter whose node has ConsensusMember, every such node a member,
// a leader), or "".
func disagreement(cs *curatorv1.GetConsensusStatusResponse) string {
	if cs == nil {
		return "no consensus status"
	}
	leader := false
	for _, m := range cs.GetMembers() {
		switch {
		case !m.GetNodeExists() || !m.GetHasRole():
			return fmt.Sprintf("member %x without a node with ConsensusMember", m.GetMemberId())
		case m.GetLearner():
			return fmt.Sprintf("member %x still a learner", m.GetMemberId())
		}
		leader = leader || m.GetLeader()
	}
	if len(cs.GetRoleWithoutMember()) > 0 {
		return fmt.Sprintf("nodes with ConsensusMember not members yet: %v", cs.GetRoleWithoutMember())
	}
	if !leader {
		return "no etcd leader"
	}
	return ""
}

// bootstrapStep looks at the cluster once and acts on the plan.
func bootstrapStep(ctx context.Context, cfg BootstrapConfig, api *API, m curatorv1.ManagementClient, st *bootstrapState, out io.Writer) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if !st.ticketWritten {
		t, err := m.GetRegisterTicket(cctx, &curatorv1.GetRegisterTicketRequest{})
		if err != nil {
			return false, fmt.Errorf("register ticket: %w", err)
		}
		if err := api.Apply(cctx, "secrets", SecretRegisterTicket, ticketSecret(t.GetTicket())); err != nil {
			return false, fmt.Errorf("secret %s: %w", SecretRegisterTicket, err)
		}
		fmt.Fprintf(out, "curia-kube: wrote the register ticket into secret %s\n", SecretRegisterTicket)
		st.ticketWritten = true
	}
	var v view
	var err error
	if v.nodes, err = nodes.List(cctx, m, ""); err != nil {
		return false, err
	}
	cfgResp, err := m.GetClusterConfig(cctx, &curatorv1.GetClusterConfigRequest{})
	if err != nil {
		return false, err
	}
	v.configRevision = cfgResp.GetRevision()
	if v.consensus, err = m.GetConsensusStatus(cctx, &curatorv1.GetConsensusStatusRequest{}); err != nil {
		return false, err
	}
	s := plan(cfg, *st, v)
	for _, id := range s.approve {
		if _, err := m.ApproveNode(cctx, &curatorv1.ApproveNodeRequest{NodeId: id}); err != nil {
			return false, fmt.Errorf("approve %s: %w", id, err)
		}
		fmt.Fprintf(out, "curia-kube: approved node %s\n", id)
	}
	if s.setSize {
		if _, err := m.UpdateClusterConfig(cctx, &curatorv1.UpdateClusterConfigRequest{
			Config:     &curatorv1.ClusterConfig{ControlPlaneSize: uint32(cfg.ControlPlane)}, //nolint:gosec // G115: 1..--nodes, checked by Validate
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"control_plane_size"}},
			Reason:     fmt.Sprintf("curia-kube bootstrap: a control plane of %d voters, kept by autopilot", cfg.ControlPlane),
		}); err != nil {
			return false, fmt.Errorf("set the cluster configuration: %w", err)
		}
		st.sizeSet = true
		fmt.Fprintf(out, "curia-kube: control_plane_size %d: autopilot grows the control plane\n", cfg.ControlPlane)
	}
	if s.done {
		return true, nil
	}
	return false, errors.New(s.waiting)
}

func ticketSecret(ticket []byte) *corev1.Secret {
	return &corev1.Secret{
		TypeMeta:   typeMeta("Secret"),
		ObjectMeta: objectMeta(SecretRegisterTicket),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{KeyTicket: ticket},
	}
}
