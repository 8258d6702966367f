package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"curia.dev/deploy/local"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	roleservev1 "curia.dev/gen/curia/roleserve/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/process"
	"curia.dev/platform/rpc"
)

// cluster is the curia-local cluster inside the network of namespaces,
// with what the suite needs to observe and fault it.
type cluster struct {
	net   *Net
	lc    *local.Cluster
	state string
	name  string
	// hosts maps a host name (node-1, curator-1, reconciler-1) to its IP.
	hosts map[string]string
	// failpoints is every process's CURIA_FAILPOINT_DIR.
	failpoints string
	caPEM      []byte
	admin      *grpc.ClientConn
	adminCreds *rpc.Credentials
	etcd       *clientv3.Client
	out        io.Writer

	mu    sync.Mutex
	twins map[string]*process.Process
	conns map[pki.Kind]*rpc.Conns // by the server's kind

	// lastMembers is the last member list the sampler read.
	lastMembersMu sync.Mutex
	lastMembers   map[uint64]memberView
}

func (c *cluster) logf(format string, args ...any) {
	fmt.Fprintf(c.out, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

// nodes are the nodes' host names, curatorHosts the curators'.
func (c *cluster) nodes() []string        { return c.hostsWith("node-") }
func (c *cluster) curatorHosts() []string { return c.hostsWith("curator-") }

func (c *cluster) hostsWith(prefix string) []string {
	var out []string
	for h := range c.hosts {
		if strings.HasPrefix(h, prefix) {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return out
}

// curators are the curator replicas' API addresses.
func (c *cluster) curators() []string { return c.lc.Curators }

// nodeIDs are the cluster's (real) node ids; the first is the bootstrap
// node's.
func (c *cluster) nodeIDs() []string {
	var out []string
	for _, n := range c.lc.NodeList() {
		out = append(out, n.ID)
	}
	return out
}

func (c *cluster) bootstrapID() string { return c.lc.NodeList()[0].ID }

// hostOfNode maps a node id to its host name.
func (c *cluster) hostOfNode(id string) string {
	for _, n := range c.lc.NodeList() {
		if n.ID == id {
			return n.Name
		}
	}
	return ""
}

// processes are the supervised processes' names.
func (c *cluster) processes() []string { return c.lc.Processes() }

func (c *cluster) pid(proc string) int { return c.lc.PID(proc) }

// hostOf is the host a process runs on (node-1-consensus → node-1).
func (c *cluster) hostOf(proc string) string {
	for _, suffix := range []string{"-consensus", "-roleserve"} {
		if h, ok := strings.CutSuffix(proc, suffix); ok {
			return h
		}
	}
	return proc
}

func (c *cluster) isConsensus(proc string) bool { return strings.HasSuffix(proc, "-consensus") }

// takeoverKind is what faulting proc makes the cluster do: elect a new
// curator leader (proc leads the curators), or hand the reconciler lease
// over (proc is the active reconciler); "" for anything else.
func (c *cluster) takeoverKind(ctx context.Context, proc string) string {
	switch {
	case strings.HasPrefix(proc, "curator-"):
		if leader, err := c.curatorLeader(ctx); err == nil && leader == proc {
			return "curator"
		}
	case strings.HasPrefix(proc, "reconciler-"):
		if slices.Contains(c.activeReconcilers(ctx), proc) {
			return "reconciler"
		}
	}
	return ""
}

// spareIP is an address in the subnet that no host uses.
func (c *cluster) spareIP() string {
	ip := c.hosts["node-1"]
	return ip[:strings.LastIndex(ip, ".")] + ".99"
}

// etcdLeaderHost is the host of the etcd leader.
func (c *cluster) etcdLeaderHost(ctx context.Context) (string, error) {
	list, err := c.etcd.MemberList(ctx)
	if err != nil {
		return "", err
	}
	for _, m := range list.Members {
		if len(m.ClientURLs) == 0 {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := c.etcd.Status(sctx, m.ClientURLs[0])
		cancel()
		if err == nil && st.Leader == m.ID {
			if h := c.hostOfNode(m.Name); h != "" {
				return h, nil
			}
		}
	}
	return "", errors.New("no etcd leader found")
}

// curatorLeader is the host of the curator leader.
func (c *cluster) curatorLeader(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	stream, err := curatorv1.NewCuratorClient(c.admin).GetCurrentLeader(ctx, &curatorv1.GetCurrentLeaderRequest{})
	if err != nil {
		return "", err
	}
	resp, err := stream.Recv()
	if err != nil {
		return "", err
	}
	if _, ok := c.hosts[resp.GetLeaderName()]; !ok {
		return "", fmt.Errorf("curator leader %q is no host", resp.GetLeaderName())
	}
	return resp.GetLeaderName(), nil
}

// reconcilerAddrs are the reconciler processes' API addresses by name,
// twins included.
func (c *cluster) reconcilerAddrs() map[string]string {
	out := map[string]string{}
	for i, addr := range c.lc.Reconcilers {
		out[fmt.Sprintf("reconciler-%d", i+1)] = addr
	}
	c.mu.Lock()
	for name := range c.twins {
		host := strings.TrimSuffix(name, "-twin")
		out[name] = c.hosts[host] + ":" + twinPort
	}
	c.mu.Unlock()
	return out
}

// reconcilerStatus asks one reconciler process for its status.
func (c *cluster) reconcilerStatus(ctx context.Context, addr string) (*reconcilerv1.GetStatusResponse, error) {
	cc, err := c.conn(addr, pki.KindReconciler)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	return reconcilerv1.NewReconcilerClient(cc).GetStatus(ctx, &reconcilerv1.GetStatusRequest{})
}

// conn is a connection as the admin to one process, kept for the run.
func (c *cluster) conn(addr string, kind pki.Kind) (*grpc.ClientConn, error) {
	c.mu.Lock()
	conns, ok := c.conns[kind]
	if !ok {
		if c.conns == nil {
			c.conns = map[pki.Kind]*rpc.Conns{}
		}
		conns = rpc.NewConns(rpc.ClientConfig{Credentials: c.adminCreds, ServerKinds: []pki.Kind{kind}})
		c.conns[kind] = conns
	}
	c.mu.Unlock()
	return conns.Get(addr)
}

// closeConns closes the kept connections.
func (c *cluster) closeConns() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conns := range c.conns {
		conns.Close()
	}
	c.conns = nil
}

// activeReconcilers are the reconciler processes (twins included) that
// say they hold the lease.
func (c *cluster) activeReconcilers(ctx context.Context) []string {
	var out []string
	for name, addr := range c.reconcilerAddrs() {
		if st, err := c.reconcilerStatus(ctx, addr); err == nil && st.GetRole() == reconcilerv1.Role_ROLE_ACTIVE {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// activeReconciler is the (original, not twin) reconciler process that
// holds the lease.
func (c *cluster) activeReconciler(ctx context.Context) (string, error) {
	for _, name := range c.activeReconcilers(ctx) {
		if !strings.HasSuffix(name, "-twin") {
			return name, nil
		}
	}
	return "", errors.New("no reconciler is active")
}

// agentStatus asks a node's agent for its status.
func (c *cluster) agentStatus(ctx context.Context, n local.Node) (*roleservev1.GetStatusResponse, error) {
	cc, err := c.conn(n.RoleServe(), pki.KindNode)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return roleservev1.NewRoleServerClient(cc).GetStatus(ctx, &roleservev1.GetStatusRequest{})
}

// armCrash makes the next process that passes the failpoint crash there.
func (c *cluster) armCrash(point string) error {
	return os.WriteFile(filepath.Join(c.failpoints, point+".crash"), nil, 0o600)
}

func (c *cluster) disarmCrash(point string) { os.Remove(filepath.Join(c.failpoints, point+".crash")) }

// twinPort and twinMetricsPort are where a twin reconciler listens (its
// original keeps the usual ports).
const (
	twinPort        = "7301"
	twinMetricsPort = "9301"
)

// startTwin starts a second process of a reconciler under the same name
// on the same host: a restarted twin while the original is only paused.
// stop kills it.
func (c *cluster) startTwin(name string) (stop func(), err error) {
	argv := c.lc.Argv(name)
	if argv == nil {
		return nil, fmt.Errorf("no process %s", name)
	}
	argv = slices.Clone(argv)
	for i := range argv {
		port := map[string]string{"--listen": twinPort, "--listen-metrics": twinMetricsPort}[argv[i]]
		if port != "" && i+1 < len(argv) {
			host, _, _ := strings.Cut(argv[i+1], ":")
			argv[i+1] = host + ":" + port
		}
	}
	p, err := process.Start(process.Spec{Argv: argv, Log: filepath.Join(c.state, "logs", name+"-twin.log")})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.twins == nil {
		c.twins = map[string]*process.Process{}
	}
	c.twins[name+"-twin"] = p
	c.mu.Unlock()
	return func() {
		p.Stop(syscall.SIGKILL, time.Second)
		c.mu.Lock()
		delete(c.twins, name+"-twin")
		c.mu.Unlock()
	}, nil
}

// newEtcd is an etcd client as the curator (the checker reads the audit
// log with its revisions, and the membership nemesis writes behind curia's
// back), to every node's client URL.
func newEtcd(creds *rpc.Credentials, nodes []local.Node) (*clientv3.Client, error) {
	var eps []string
	for _, n := range nodes {
		eps = append(eps, n.ClientURL())
	}
	return clientv3.New(clientv3.Config{
		Endpoints:   eps,
		TLS:         rpc.ClientTLSConfig(creds, []pki.Kind{pki.KindMember}),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
}
