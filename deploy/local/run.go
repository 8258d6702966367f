package local

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/nodes"
	"curia.dev/platform/pki"
	"curia.dev/platform/recovery"
	"curia.dev/platform/rpc"
)

// Run starts the cluster, brings it to its target shape, writes the env
// file, and keeps it running until ctx ends; then it stops every process.
func (c *Cluster) Run(ctx context.Context) error {
	for _, d := range []string{"logs", "run", "data"} {
		if err := os.MkdirAll(c.path(d), 0o700); err != nil {
			return err
		}
	}
	if err := c.PKI(); err != nil {
		return err
	}
	defer c.Stop()
	c.startAll(ctx)
	dashboard := c.startDashboard(ctx)

	admin, err := c.AdminConn()
	if err != nil {
		return err
	}
	defer admin.Close()
	if err := c.writeEnv(); err != nil {
		return err
	}
	begun := time.Now()
	fmt.Fprintf(c.cfg.Out, "curia: starting %d control-plane nodes, %d worker(s), %d curators, %d reconcilers (logs in %s)\n",
		c.cfg.ControlPlane, c.cfg.Workers, c.cfg.Curators, c.cfg.Reconcilers, c.path("logs"))
	// Wait on health in dependency order: consensus (node-1's agent
	// bootstraps etcd meanwhile, or the members restart from disk), then
	// the curators on top, then the reconcilers on the curators. The other
	// nodes' agents become healthy only once init approved them.
	if err := c.waitHealthy(ctx, "consensus", "curator", "reconciler"); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	// The first run shapes the cluster; later runs only wait until roles
	// and membership agree again (an operator may have changed its shape).
	shaped := c.path("initialized")
	var err2 error
	if _, err := os.Stat(shaped); err == nil {
		err2 = c.waitAgreement(ctx, admin)
	} else if err2 = c.Init(ctx, admin); err2 == nil {
		err2 = os.WriteFile(shaped, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600)
	}
	if err2 == nil {
		err2 = c.waitHealthy(ctx, "roleserve")
	}
	if err2 != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err2
	}
	fmt.Fprintf(c.cfg.Out, "curia: cluster ready in %v: roles and etcd membership agree\n\n", time.Since(begun).Round(100*time.Millisecond))
	fmt.Fprintf(c.cfg.Out, "  source %s\n  grpcurl $CURIA_TLS $CURIA_CURATOR curia.curator.v1.Management/GetNodes\n\nCtrl-C stops the cluster; running it again starts it from %s.\n",
		c.path("env"), c.cfg.State)
	c.printDashboard(dashboard)
	<-ctx.Done()
	fmt.Fprintln(c.cfg.Out, "curia: stopping")
	return nil
}

// startAll starts every process.
func (c *Cluster) startAll(ctx context.Context) {
	for _, p := range c.processes() {
		c.start(ctx, p.name, p.host, p.bin, p.args...)
	}
}

// procSpec is one process to start: its name, host, binary, flags, and the
// identity whose secrets it reads.
type procSpec struct {
	name, host, bin string
	args            []string
	identity        string
}

// processes are every process of the cluster, in start order (consensus
// first, then the curators, the node agents, the reconcilers). Each reads
// public/ and its own identity's directory (layout.go).
func (c *Cluster) processes() []procSpec {
	var out []procSpec
	add := func(name, host, bin, identity string, args ...string) {
		args = append(args, "--listen-metrics", metricsAddr(host, bin))
		out = append(out, procSpec{name: name, host: host, bin: bin, args: args, identity: identity})
	}
	ca := c.public(pki.CACertFile)
	tls := func(identity string) []string {
		f := c.TLSFiles(identity)
		return []string{"--ca", f.CA, "--cert", f.Cert, "--key", f.Key}
	}
	// Curators and reconcilers reach etcd and the consensus services of
	// the control-plane nodes (the curator learns further ones from node
	// status). Each replica starts its list at another node, so that the
	// replicas' membership calls reach different consensus processes and
	// only the cluster-wide pending change serialises them, as on real
	// machines.
	var etcd, consensus []string
	for _, n := range c.Nodes {
		if !n.Worker {
			etcd = append(etcd, n.ClientURL())
			consensus = append(consensus, n.ConsensusAPI())
		}
	}
	common := func(string) []string { return []string{"--cluster", c.cfg.Cluster, "--log-level", "info"} }
	for i, n := range c.Nodes {
		args := append(common(n.Name),
			"--data-dir", c.path("data", n.Name, "consensus"),
			"--ca", c.public(pki.CACertFile), "--crl", c.public(pki.CRLFile),
			"--node-id-file", c.public(n.Name+".id"),
			"--curator", strings.Join(c.Curators, ","),
			"--listen", n.ConsensusAPI(),
			"--listen-peer", strings.TrimPrefix(n.PeerURL(), "https://"),
			"--listen-client", strings.TrimPrefix(n.ClientURL(), "https://"))
		identity := ""
		if i == 0 {
			// The first member starts before any curator: the deployment
			// gives it its key and certificates.
			identity = consensusIdentity(n)
			args = append(args, "--key", c.secret(identity, tlsKey), "--cert", c.secret(identity, tlsCert), "--member-cert", c.secret(identity, memberCert))
		}
		add(n.Name+"-consensus", n.Host, "consensus", identity, args...)
	}
	for i, addr := range c.Curators {
		name := fmt.Sprintf("curator-%d", i+1)
		args := append(append(common(name), "--name", name), tls(curatorIdentity)...)
		add(name, hostOf(addr), "curator", curatorIdentity, append(args,
			"--ca-key", c.secret(curatorIdentity, pki.CAKeyFile),
			// A silent node is unhealthy after 6 s, not 20: autopilot's
			// dead_node_threshold counts from its last heartbeat, but only
			// once it is unhealthy.
			"--heartbeat-interval", "2s", "--heartbeat-timeout", "6s",
			"--listen", addr, "--listen-http", httpAddr(addr),
			// One snapshot directory for every curator: the leader
			// writes it, a new leader goes on from it.
			"--snapshot-dir", c.path(snapshotsDir),
			"--etcd", strings.Join(etcd, ","), "--consensus", strings.Join(rotate(consensus, i), ","))...)
	}
	for i, n := range c.Nodes {
		agent := agentIdentity(n)
		args := append(common(n.Name),
			"--data-dir", c.path("data", n.Name, "roleserve"),
			"--ca", ca,
			"--node-key", c.secret(agent, nodeKey),
			"--curator", strings.Join(c.Curators, ","),
			"--address", n.Host,
			"--labels", "zone="+n.Zone,
			"--listen", n.RoleServe(),
			"--consensus", n.ConsensusAPI())
		if i == 0 {
			args = append(args, "--bootstrap", "--bootstrap-cert", c.secret(agent, bootCert), "--bootstrap-key", c.secret(agent, nodeKey))
		} else {
			args = append(args, "--register-ticket-file", c.ticketFile())
		}
		add(n.Name+"-roleserve", n.Host, "roleserve", agent, args...)
	}
	for i, addr := range c.Reconcilers {
		name := fmt.Sprintf("reconciler-%d", i+1)
		args := append(append(common(name), "--name", name), tls(reconcilerIdentity)...)
		add(name, hostOf(addr), "reconciler", reconcilerIdentity, append(args,
			"--listen", addr,
			"--curator", strings.Join(c.Curators, ","), "--consensus", strings.Join(rotate(consensus, i+1), ","))...)
	}
	return out
}

// rotate returns addrs starting at the i-th (modulo its length).
func rotate(addrs []string, i int) []string {
	if len(addrs) == 0 {
		return nil
	}
	i %= len(addrs)
	return append(slices.Clone(addrs[i:]), addrs[:i]...)
}

// AdminFiles are the operator's TLS files.
func (c *Cluster) AdminFiles() rpc.TLSFiles { return c.TLSFiles(adminIdentity) }

// TLSFiles are the TLS files of an identity (admin, curator, reconciler,
// <node>-consensus).
func (c *Cluster) TLSFiles(identity string) rpc.TLSFiles {
	return rpc.TLSFiles{CA: c.public(pki.CACertFile), Cert: c.secret(identity, tlsCert), Key: c.secret(identity, tlsKey)}
}

// AdminConn connects to the curators as the admin.
func (c *Cluster) AdminConn() (*grpc.ClientConn, error) {
	creds, err := rpc.LoadCredentials(c.cfg.Cluster, c.AdminFiles())
	if err != nil {
		return nil, err
	}
	return rpc.DialAny(c.Curators, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
}

// Init brings the cluster to its shape through the public APIs, and is
// idempotent: it writes the register ticket for the agents and approves new
// nodes. Once every node is in service and has reported its consensus, it
// writes the cluster configuration — if it was never written — with
// control_plane_size set to the control-plane node count: autopilot picks
// the nodes (one zone each), adds them one learner at a time and promotes
// them. It returns once that many voters agree with the roles (or, when
// the configuration was written before, an operator's, once roles and
// membership agree).
func (c *Cluster) Init(ctx context.Context, admin *grpc.ClientConn) error {
	m := curatorv1.NewManagementClient(admin)
	st := initState{}
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		done, err := c.initStep(ctx, m, &st)
		if done {
			return nil
		}
		if err != nil {
			c.cfg.Log.Debug("init", "waiting for", err.Error())
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// initState is what Init's steps have done so far.
type initState struct {
	ticketWritten bool
	// configured: the cluster configuration is in place; size is the
	// number of voters to wait for (0: whatever the operator's
	// configuration makes, once roles and membership agree).
	configured bool
	size       int
	sizeSet    time.Time
}

// localConfig is the cluster configuration of a local cluster (make run,
// make up): autopilot keeps size voters and replaces one dead for 30 s;
// learners are promoted after the default stabilization (2 s).
func localConfig(size int) (*curatorv1.ClusterConfig, []string) {
	return &curatorv1.ClusterConfig{
		ControlPlaneSize:  uint32(size), //nolint:gosec // G115: 1..9, checked by curia-local's flags
		DeadNodeThreshold: durationpb.New(30 * time.Second),
	}, []string{"control_plane_size", "dead_node_threshold"}
}

func (c *Cluster) initStep(ctx context.Context, m curatorv1.ManagementClient, st *initState) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	byID, err := nodes.ByID(cctx, m, "")
	if err != nil {
		return false, err
	}
	if !st.ticketWritten {
		// (The curator refuses registrations until the bootstrap node has
		// its record, so the agents may have the ticket at once.)
		t, err := m.GetRegisterTicket(cctx, &curatorv1.GetRegisterTicketRequest{})
		if err != nil {
			return false, fmt.Errorf("register ticket: %w", err)
		}
		if err := pki.WriteFileAtomic(c.ticketFile(), t.Ticket, 0o600); err != nil {
			return false, err
		}
		st.ticketWritten = true
	}
	ready := true
	for _, n := range c.Nodes {
		node, ok := byID[n.ID]
		if !ok {
			ready = false // not registered yet
			continue
		}
		switch node.State {
		case curatorv1.NodeState_NODE_STATE_NEW:
			ready = false
			if _, err := m.ApproveNode(cctx, &curatorv1.ApproveNodeRequest{NodeId: n.ID}); err != nil {
				return false, fmt.Errorf("approve %s: %w", n.Name, err)
			}
			fmt.Fprintf(c.cfg.Out, "curia: approved %s (%s, %s)\n", n.Name, n.ID, n.Zone)
			continue
		case curatorv1.NodeState_NODE_STATE_STANDBY:
			ready = false // committing
			continue
		}
		if node.Status.GetConsensusPeerUrl() == "" {
			ready = false // its agent has not reported its consensus yet
		}
	}
	if !ready {
		return false, errNotReady
	}
	// Every node can be chosen: autopilot chooses among all of them, so
	// that its choice (one per zone) does not depend on which agent was
	// quickest.
	if !st.configured {
		got, err := m.GetClusterConfig(cctx, &curatorv1.GetClusterConfigRequest{})
		if err != nil {
			return false, err
		}
		if got.GetRevision() == 0 {
			cfg, paths := localConfig(c.cfg.ControlPlane)
			if _, err := m.UpdateClusterConfig(cctx, &curatorv1.UpdateClusterConfigRequest{
				Config: cfg, UpdateMask: &fieldmaskpb.FieldMask{Paths: paths},
				Reason: fmt.Sprintf("curia-local: a control plane of %d voters, kept by autopilot", c.cfg.ControlPlane),
			}); err != nil {
				return false, fmt.Errorf("set the cluster configuration: %w", err)
			}
			st.size, st.sizeSet = c.cfg.ControlPlane, time.Now()
			fmt.Fprintf(c.cfg.Out, "curia: control_plane_size %d: autopilot grows the control plane\n", st.size)
		}
		st.configured = true
	}
	cs, err := m.GetConsensusStatus(cctx, &curatorv1.GetConsensusStatusRequest{})
	if err != nil {
		return false, err
	}
	if !agree(cs) || (st.size > 0 && int(cs.GetVoters()) != st.size) {
		return false, errNotReady
	}
	if st.size > 0 {
		fmt.Fprintf(c.cfg.Out, "curia: %d voters %v after control_plane_size was set\n", st.size, time.Since(st.sizeSet).Round(100*time.Millisecond))
	}
	return true, nil
}

// waitAgreement returns once every etcd member is a voter whose node has
// ConsensusMember, every such node is a member, and etcd has a leader.
func (c *Cluster) waitAgreement(ctx context.Context, admin *grpc.ClientConn) error {
	m := curatorv1.NewManagementClient(admin)
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := m.GetConsensusStatus(cctx, &curatorv1.GetConsensusStatusRequest{})
		cancel()
		if err == nil && agree(st) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// agree says whether roles and membership agree (platform/recovery's
// Agree: the recovery waits for it too).
func agree(st *curatorv1.GetConsensusStatusResponse) bool { return recovery.Agree(st) }

func hostOf(addr string) string {
	host, _, _ := net.SplitHostPort(addr)
	return host
}

// httpAddr is where a curator serves the admin API over Connect: its gRPC
// address, port 7201.
func httpAddr(grpcAddr string) string {
	host, _, _ := net.SplitHostPort(grpcAddr)
	return net.JoinHostPort(host, "7201")
}

// dquote escapes s for a shell's double quotes.
func dquote(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "$", `\$`, "`", "\\`").Replace(s)
}

// writeEnv writes the shell variables an operator sources.
func (c *Cluster) writeEnv() error {
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			return p
		}
		return a
	}
	var consensus, roleserves []string
	for _, n := range c.Nodes {
		if !n.Worker {
			consensus = append(consensus, n.ConsensusAPI())
		}
		roleserves = append(roleserves, n.RoleServe())
	}
	lines := []string{
		"# curia local cluster: source this file, then use curiactl, or grpcurl with these variables.",
	}
	if c.cfg.Grpcurl != "" {
		// The pinned grpcurl first: `make run` installs it into the
		// tools cache, which no fresh shell has on its PATH.
		lines = append(lines, `export PATH="`+dquote(filepath.Dir(abs(c.cfg.Grpcurl)))+`:$PATH"`)
	}
	if c.cfg.Bin != "" {
		// The binaries make build wrote, curiactl among them.
		lines = append(lines, `export PATH="`+dquote(abs(c.cfg.Bin))+`:$PATH"`)
	}
	lines = append(lines,
		"export CURIA_CLUSTER="+c.cfg.Cluster,
		"export CURIA_CURATOR="+c.Curators[0],
		"export CURIA_CACERT="+abs(c.AdminFiles().CA),
		"export CURIA_ADMIN_CERT="+abs(c.AdminFiles().Cert),
		"export CURIA_ADMIN_KEY="+abs(c.AdminFiles().Key),
		`export CURIA_TLS="-cacert $CURIA_CACERT -cert $CURIA_ADMIN_CERT -key $CURIA_ADMIN_KEY"`,
		"export CURIA_CURATORS="+strings.Join(c.Curators, ","),
		"export CURIA_CURATOR_HTTP=https://"+httpAddr(c.Curators[0]),
		"export CURIA_RECONCILER="+c.Reconcilers[0],
		"export CURIA_RECONCILERS="+strings.Join(c.Reconcilers, ","),
		"export CURIA_CONSENSUS="+strings.Join(consensus, ","),
		"export CURIA_ROLESERVES="+strings.Join(roleserves, ","),
	)
	return os.WriteFile(c.path("env"), []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}
