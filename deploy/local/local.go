// Package local runs a whole curia cluster as processes on this machine,
// each service on its own loopback address (127.0.0.0/8 is all loopback on
// Linux), so that ports never clash and every address looks like a host:
//
//	node-1..3   127.0.0.11-13   consensus :7100 (etcd :2380 peer, :2379 client) + roleserve :7400
//	node-4      127.0.0.14      the same, a worker: its consensus stays idle until it gets ConsensusMember
//	curator-1,2     127.0.0.21-22:7200
//	reconciler-1,2  127.0.0.31-32:7300
//
// (--subnet moves everything to another 127.x.y.0/24, e.g. for tests next
// to a running cluster.)
//
// The first run creates the PKI in the state directory; node-1 bootstraps,
// the others register with the ticket; an init step (public APIs only)
// approves the nodes and sets control_plane_size to 3 (the control-plane
// node count): autopilot gives ConsensusMember to node-2 and node-3, one
// zone each, one learner at a time, and promotes them. Later runs start
// from disk.
package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"curia.dev/platform/process"
)

// Config says where the cluster lives.
type Config struct {
	// State is the state directory (PKI, data, logs, env file).
	State string
	// Bin holds the service binaries (consensus, curator, reconciler,
	// roleserve).
	Bin string
	// Cluster is the cluster name.
	Cluster string
	// ControlPlane and Workers are the node counts.
	ControlPlane, Workers int
	// Curators and Reconcilers are the replica counts.
	Curators, Reconcilers int
	// Subnet is the first three octets of the loopback addresses used
	// (default 127.0.0).
	Subnet string
	// Compose lays the cluster out for deploy/compose: hosts are the
	// compose services' names (node1.., curator, reconciler) instead of
	// loopback addresses, and the curator replicas are one DNS name.
	Compose bool
	// Out receives the operator-facing messages.
	Out io.Writer
	Log *slog.Logger
	// Wrap, when set, prefixes the command line of each process with what
	// it returns for the process's host (e.g. "ip netns exec <ns>", to run
	// every host in its own network namespace).
	Wrap func(host string) []string
	// Dashboard starts the web dashboard (curia-dashboard, from Bin) on
	// <Subnet>.1:7000.
	Dashboard bool
	// ExtraArgs are further flags for every process of a binary
	// ("consensus", "curator", "reconciler", "roleserve").
	ExtraArgs map[string][]string
	// Grpcurl, when set, is the grpcurl the env file puts first on PATH
	// (make run passes the pinned one from the tools cache), so that the
	// commands printed at the end work in a fresh shell.
	Grpcurl string
	// SANs are further host names or IPs of the curators' and the
	// reconcilers' certificates: where an operator reaches them (compose:
	// the host IP their ports are published on). They are written when
	// the PKI is made, and never changed after.
	SANs []string
}

// Node is one node of the cluster.
type Node struct {
	Name string
	// Host is the node's address: a loopback IP, or a compose host name.
	Host   string
	ID     string
	Worker bool
	// Zone is the node's "zone" label, across which autopilot spreads the
	// voters: the control-plane nodes one zone each (zone-a, zone-b,
	// zone-c, then round again), the workers zone-a, with the bootstrap
	// node. So autopilot's first choices are the other control-plane
	// nodes, and a worker replaces a voter of any zone.
	Zone string
}

// ConsensusAPI and friends are the node's service addresses.
func (n Node) ConsensusAPI() string { return net.JoinHostPort(n.Host, "7100") }
func (n Node) PeerURL() string      { return "https://" + net.JoinHostPort(n.Host, "2380") }
func (n Node) ClientURL() string    { return "https://" + net.JoinHostPort(n.Host, "2379") }
func (n Node) RoleServe() string    { return net.JoinHostPort(n.Host, "7400") }

// Cluster is the cluster's layout (and, locally, its processes).
type Cluster struct {
	cfg   Config
	Nodes []Node
	// Curators and Reconcilers are the replicas' addresses; under compose,
	// one DNS name each that resolves to every replica.
	Curators    []string
	Reconcilers []string
	procs       []*proc
	// mu guards the nodes' ids, which Reinstall changes.
	mu sync.Mutex
}

func (c *Cluster) path(p ...string) string {
	return filepath.Join(append([]string{c.cfg.State}, p...)...)
}

// New lays out the cluster; nothing runs yet.
func New(cfg Config) *Cluster {
	if cfg.Subnet == "" {
		cfg.Subnet = "127.0.0"
	}
	c := &Cluster{cfg: cfg}
	for i := range cfg.ControlPlane + cfg.Workers {
		n := Node{Name: fmt.Sprintf("node-%d", i+1), Host: fmt.Sprintf("%s.%d", cfg.Subnet, 11+i), Worker: i >= cfg.ControlPlane, Zone: "zone-a"}
		if !n.Worker {
			n.Zone = fmt.Sprintf("zone-%c", 'a'+i%3)
		}
		if cfg.Compose {
			n.Name = fmt.Sprintf("node%d", i+1)
			n.Host = n.Name
		}
		c.Nodes = append(c.Nodes, n)
	}
	if cfg.Compose {
		c.Curators, c.Reconcilers = []string{"curator:7200"}, []string{"reconciler:7300"}
		return c
	}
	for i := range cfg.Curators {
		c.Curators = append(c.Curators, fmt.Sprintf("%s.%d:7200", cfg.Subnet, 21+i))
	}
	for i := range cfg.Reconcilers {
		c.Reconcilers = append(c.Reconcilers, fmt.Sprintf("%s.%d:7300", cfg.Subnet, 31+i))
	}
	return c
}

// proc is one supervised service process: restarted when it dies on its
// own (as systemd or compose would), stopped with SIGTERM on shutdown.
type proc struct {
	name string
	args []string
	log  string
	pid  string

	// ctx and logger are the cluster's, kept for a restart.
	ctx    context.Context
	logger *slog.Logger

	mu  sync.Mutex
	sup *process.Supervisor
}

func (c *Cluster) start(ctx context.Context, name, host, bin string, args ...string) *proc {
	argv := append([]string{filepath.Join(c.cfg.Bin, bin)}, args...)
	argv = append(argv, c.cfg.ExtraArgs[bin]...)
	if c.cfg.Wrap != nil {
		argv = append(c.cfg.Wrap(host), argv...)
	}
	p := &proc{name: name, args: argv, log: c.path("logs", name+".log"), pid: c.path("run", name+".pid"), ctx: ctx, logger: c.cfg.Log}
	c.procs = append(c.procs, p)
	p.supervise()
	return p
}

// supervise starts the process under a new supervisor.
func (p *proc) supervise() {
	sup := process.Supervise(p.ctx, process.Spec{Argv: p.args, Log: p.log}, p.logger.With("process", p.name), func(pid int) {
		if err := os.WriteFile(p.pid, fmt.Appendf(nil, "%d\n", pid), 0o600); err != nil {
			p.logger.Warn("write pid file", "process", p.name, "err", err)
		}
	})
	p.mu.Lock()
	p.sup = sup
	p.mu.Unlock()
}

// Processes are the names of the supervised processes, in start order.
func (c *Cluster) Processes() []string {
	var out []string
	for _, p := range c.procs {
		out = append(out, p.name)
	}
	return out
}

// PID is the process id of the named process while it runs, else 0.
func (c *Cluster) PID(name string) int {
	for _, p := range c.procs {
		if p.name == name {
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.sup.PID()
		}
	}
	return 0
}

// Argv is the named process's command line (with the Wrap prefix), nil
// for an unknown name.
func (c *Cluster) Argv(name string) []string {
	for _, p := range c.procs {
		if p.name == name {
			return slices.Clone(p.args)
		}
	}
	return nil
}

// stop sends SIGTERM and waits (SIGKILL after the grace period).
func (p *proc) stop(grace time.Duration) {
	p.mu.Lock()
	sup := p.sup
	p.mu.Unlock()
	sup.Stop(grace)
	_ = os.Remove(p.pid) // gone already when it never started
}

// Restart stops the named process (SIGTERM, SIGKILL after grace), runs
// meanwhile while it is down (to wipe its state, say) and starts it again
// under supervision, even if meanwhile fails.
func (c *Cluster) Restart(name string, grace time.Duration, meanwhile func() error) error {
	i := slices.IndexFunc(c.procs, func(p *proc) bool { return p.name == name })
	if i < 0 {
		return fmt.Errorf("no process %s", name)
	}
	p := c.procs[i]
	p.stop(grace)
	err := meanwhile()
	p.supervise()
	return err
}

// Stop stops every process, in the reverse order of their start.
func (c *Cluster) Stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop(15 * time.Second)
	}
}

var errNotReady = errors.New("not ready")
