// Package curator is the curator service: the cluster's memory and the
// operator's front door. N replicas elect a leader through etcd; the leader
// serves every call and guards every write with its term; followers forward.
//
//	grpcurl, roleserve, reconciler
//	        │ mTLS gRPC (any replica)
//	        ▼
//	follower ──forward (original principal in metadata)──▶ leader
//	                                                        │ txn If(CreateRevision(leader key) == term)
//	                                                        ▼
//	                                              etcd (/curia/...)  ◀── consensus AddNode/RemoveMember
//
// Files: curator.go (config, wiring, run), leader.go (election,
// term-guarded writes), follower.go (forwarding), servers.go (the gRPC
// servers: each handler hands its call to the part that serves it),
// heartbeat.go (the Watch and Heartbeat streams, handed to
// internal/nodewatch), leader_nodes.go and filter.go (GetNodes and
// ListNodes' pages, with CEL filters, from the watch hub),
// leader_consensus_status.go (GetConsensusStatus), consensus.go (calls to
// the consensus services), enrolment_limit.go (the rate limit on enrolling
// nodes), endpoints.go (the etcd client's endpoints: the voters that
// answer), metrics.go (what /metrics adds to the gRPC server's), policy.go
// (who may call what), errors.go (the one mapping to gRPC codes),
// connect.go (the admin API over the Connect protocol).
//
// Internal packages own one job each and get only what it needs; none
// holds *Service:
//   - internal/registry: the node registry (bootstrap, register, approve,
//     commit, roles with the etcd step first, delete, status, certificate
//     renewal, the reconciler's fenced role writes);
//   - internal/nodestore: node records read, decoded and written, the one
//     reader and writer;
//   - internal/roles: the role decision, pure (which roles a record gets,
//     for UpdateNodeRoles and the reconciler alike);
//   - internal/nodewatch: the watch hub (one etcd watch fanned out to every
//     Watch stream, the nodes GetNodes answers from) and the leader's
//     heartbeat tracker, whose shards give every node its health;
//   - internal/certs: node certificates issued, recorded and revoked, the
//     CRL, tombstones;
//   - internal/leases: named leases and the fence they give (the Leases
//     service);
//   - internal/maintenance: a node out of service for a while, or for good;
//   - internal/etcdmaint: etcd's members observed, leadership moved off
//     one, defragmentation and the NOSPACE alarm;
//   - internal/snaps: the leader's etcd snapshots, their retention and their
//     copies off-site;
//   - internal/auditlog: the event each change writes, WatchAuditLog, the
//     retention;
//   - internal/clusterconfig: the cluster configuration record.
//
// Service wires them (New) and runs them (Run); the gRPC servers hold it,
// as the API over all of them.
package curator

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/crl"
	"curia.dev/platform/etcdpin"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/run"
	"curia.dev/services/curator/internal/auditlog"
	"curia.dev/services/curator/internal/certs"
	"curia.dev/services/curator/internal/clusterconfig"
	"curia.dev/services/curator/internal/etcdmaint"
	"curia.dev/services/curator/internal/leases"
	"curia.dev/services/curator/internal/maintenance"
	"curia.dev/services/curator/internal/nodestore"
	"curia.dev/services/curator/internal/nodewatch"
	"curia.dev/services/curator/internal/registry"
	"curia.dev/services/curator/internal/snaps"
)

// Config configures one curator replica.
type Config struct {
	// Cluster is the cluster name, the trust domain of every identity.
	Cluster string
	// Name identifies this replica in the election (default: hostname).
	Name string
	// TLS is this replica's curator certificate.
	TLS rpc.TLSFiles
	// CAKey is the cluster CA's private key: the leader issues node
	// certificates and revokes them.
	CAKey string
	// Listen is the gRPC address; Advertise the address other replicas
	// forward to (default: Listen).
	Listen    string
	Advertise string
	// ListenHTTP serves the admin API over the Connect protocol (curl with
	// JSON) when set, with the same mutual TLS.
	ListenHTTP string
	// ListenMetrics serves Prometheus metrics (/metrics) and health
	// (/healthz) over plain HTTP when set (meant for loopback).
	ListenMetrics string
	// Etcd are etcd client URLs (https://host:port).
	Etcd []string
	// Consensus are consensus service API addresses (host:port) used for
	// membership changes, besides those nodes report.
	Consensus []string
	// SessionTTL is the election session's TTL: how long a dead leader
	// keeps leading.
	SessionTTL time.Duration
	// HeartbeatInterval is how often nodes send heartbeats;
	// HeartbeatTimeout after which a silent node is HEARTBEAT_TIMEOUT.
	HeartbeatInterval time.Duration
	HeartbeatTimeout  time.Duration
	// Watch sizes the watch hub (internal/nodewatch).
	Watch nodewatch.Config
	// EnrolmentRate and EnrolmentBurst bound the calls of enrolling nodes
	// (self-signed certificates) on each replica.
	EnrolmentRate  float64
	EnrolmentBurst int
	// CertValidity is how long the certificates issued to nodes (node,
	// consensus, member) live; agents renew them after two thirds.
	CertValidity time.Duration
	// Audit bounds the audit log (internal/auditlog).
	Audit auditlog.Retention
	// Snapshots configures the leader's etcd snapshots
	// (internal/snaps).
	Snapshots snaps.Config
	// Defrag configures the leader's etcd defragmentation
	// (internal/etcdmaint).
	Defrag etcdmaint.Config
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		Cluster:           "curia",
		Name:              host,
		Listen:            "127.0.0.1:7200",
		SessionTTL:        5 * time.Second,
		HeartbeatInterval: 5 * time.Second,
		HeartbeatTimeout:  20 * time.Second,
		EnrolmentRate:     20,
		EnrolmentBurst:    40,
		CertValidity:      30 * 24 * time.Hour,
		Audit:             auditlog.Retention{MaxAge: 90 * 24 * time.Hour, MaxEvents: 100000, Every: 10 * time.Minute},
		Snapshots:         snaps.Config{Interval: 10 * time.Minute, Keep: 24, MaxAge: 7 * 24 * time.Hour, ReuseWithin: 30 * time.Second, OffsiteKeep: 48},
		Defrag:            etcdmaint.Config{CheckInterval: 5 * time.Minute, Threshold: 0.5, MinWasted: 64 << 20},
	}
}

// AddFlags registers the curator's flags.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Cluster, "cluster", c.Cluster, "cluster name (trust domain of every identity)")
	fs.StringVar(&c.Name, "name", c.Name, "this replica's name in the election")
	c.TLS.AddFlags(fs, "")
	fs.StringVar(&c.CAKey, "ca-key", c.CAKey, "cluster CA private key (PEM), to issue and revoke node certificates")
	fs.StringVar(&c.Listen, "listen", c.Listen, "gRPC address (host:port)")
	fs.StringVar(&c.ListenHTTP, "listen-http", c.ListenHTTP, "HTTPS address for the admin API over the Connect protocol, for curl with JSON (off when empty)")
	fs.StringVar(&c.ListenMetrics, "listen-metrics", c.ListenMetrics, "plain-HTTP address of Prometheus metrics (/metrics) and health (/healthz), e.g. 127.0.0.1:9100 (off when empty)")
	fs.StringVar(&c.Advertise, "advertise", c.Advertise, "address other replicas forward to (default: --listen, or this host's first non-loopback address when listening on every interface)")
	run.ListFlag(fs, "etcd", "etcd client URL", &c.Etcd)
	run.ListFlag(fs, "consensus", "consensus service API address host:port", &c.Consensus)
	fs.DurationVar(&c.SessionTTL, "session-ttl", c.SessionTTL, "election session TTL: how long a crashed leader keeps leading")
	fs.DurationVar(&c.HeartbeatInterval, "heartbeat-interval", c.HeartbeatInterval, "how often nodes send heartbeats")
	fs.DurationVar(&c.HeartbeatTimeout, "heartbeat-timeout", c.HeartbeatTimeout, "silence after which a node is HEARTBEAT_TIMEOUT")
	fs.Float64Var(&c.EnrolmentRate, "enrolment-rate", c.EnrolmentRate, "calls per second this replica takes from enrolling nodes (self-signed certificates); more get ResourceExhausted")
	fs.IntVar(&c.EnrolmentBurst, "enrolment-burst", c.EnrolmentBurst, "how many enrolling calls may come at once before --enrolment-rate applies")
	fs.DurationVar(&c.Audit.MaxAge, "audit-max-age", c.Audit.MaxAge, "audit events older than this are deleted")
	fs.Int64Var(&c.Audit.MaxEvents, "audit-max-events", c.Audit.MaxEvents, "at most this many audit events are kept; the oldest beyond go")
	fs.DurationVar(&c.Audit.Every, "audit-prune-interval", c.Audit.Every, "how often the leader applies --audit-max-age and --audit-max-events")
	fs.DurationVar(&c.CertValidity, "cert-validity", c.CertValidity, "validity of the certificates issued to nodes (node, consensus, member); their agents renew them after two thirds")
	c.Watch.AddFlags(fs)
	c.Snapshots.AddFlags(fs)
	c.Defrag.AddFlags(fs)
}

// withDefaults returns c with its derived defaults filled in: the
// advertised address from the listen address.
func (c Config) withDefaults() (Config, error) {
	if c.Advertise == "" {
		adv, err := advertiseAddr(c.Listen)
		if err != nil {
			return c, err
		}
		c.Advertise = adv
	}
	return c, nil
}

// Validate checks the configuration, its derived defaults included; it
// changes nothing (New fills them in).
func (c Config) Validate() error {
	if err := pki.ValidateCluster(c.Cluster); err != nil {
		return err
	}
	if c.Name == "" {
		return errors.New("--name is required")
	}
	if c.TLS.CA == "" || c.TLS.Cert == "" || c.TLS.Key == "" || c.CAKey == "" {
		return errors.New("--ca, --cert, --key (a curator certificate) and --ca-key are required")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--listen %q: %w", c.Listen, err)
	}
	if _, err := c.withDefaults(); err != nil {
		return err
	}
	if len(c.Etcd) == 0 {
		return errors.New("--etcd is required: at least one etcd client URL")
	}
	if c.SessionTTL < time.Second {
		return fmt.Errorf("--session-ttl %v: at least 1s", c.SessionTTL)
	}
	if c.CertValidity < 30*time.Second {
		return fmt.Errorf("--cert-validity %v: at least 30s (agents renew after two thirds)", c.CertValidity)
	}
	if c.Audit.MaxAge < time.Minute || c.Audit.MaxEvents < 1 || c.Audit.Every <= 0 {
		return fmt.Errorf("--audit-max-age %v (at least 1m), --audit-max-events %d (at least 1) and --audit-prune-interval %v (positive)", c.Audit.MaxAge, c.Audit.MaxEvents, c.Audit.Every)
	}
	if c.EnrolmentRate <= 0 || c.EnrolmentBurst < 1 {
		return fmt.Errorf("--enrolment-rate %g and --enrolment-burst %d: both must be positive", c.EnrolmentRate, c.EnrolmentBurst)
	}
	if c.HeartbeatInterval <= 0 || c.HeartbeatTimeout <= c.HeartbeatInterval {
		return fmt.Errorf("--heartbeat-timeout (%v) must exceed --heartbeat-interval (%v)", c.HeartbeatTimeout, c.HeartbeatInterval)
	}
	if err := c.Snapshots.Validate(); err != nil {
		return err
	}
	return c.Defrag.Validate()
}

// advertiseAddr is where other replicas reach one listening on listen: the
// listen address itself, or, when it listens on every interface (as in a
// container), the first non-loopback address of this host.
func advertiseAddr(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return listen, nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("find an address to advertise: %w", err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			return net.JoinHostPort(ipn.IP.String(), port), nil
		}
	}
	return "", fmt.Errorf("--listen %s is on every interface and no non-loopback address was found: set --advertise", listen)
}

// Service is one curator replica.
type Service struct {
	cfg   Config
	log   *slog.Logger
	creds *rpc.Credentials
	etcd  *clientv3.Client
	// nodes reads node records through etcd.
	nodes nodestore.Store
	// sessionEtcd is the election session's own etcd client (leader.go).
	sessionEtcd *clientv3.Client
	// memberEtcd makes calls to one member (its endpoints never change).
	memberEtcd *clientv3.Client
	// pin is the etcd cluster the clients accept answers from.
	pin       *etcdpin.Pin
	rpc       *rpc.Server
	lead      *leadership
	consensus *consensusPool
	audit     *auditlog.Log
	config    *clusterconfig.Record
	watch     *nodewatch.Hub
	crl       *crl.Watcher
	certs     *certs.Issuer
	snaps     *snaps.Snapshotter
	defrag    *etcdmaint.Defragmenter
	maint     *maintenance.Maintenance
	registry  *registry.Registry
	// beats is the current term's heartbeat tracker while this replica
	// leads (internal/nodewatch).
	beats atomic.Pointer[nodewatch.Tracker]
}

// New prepares a replica; nothing listens until Run.
func New(cfg Config, log *slog.Logger) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	creds, err := rpc.LoadCredentials(cfg.Cluster, cfg.TLS)
	if err != nil {
		return nil, err
	}
	if creds.Principal.Kind != pki.KindCurator {
		return nil, fmt.Errorf("certificate %s is for %s, not the curator", cfg.TLS.Cert, creds.Principal)
	}
	keyPEM, err := os.ReadFile(cfg.CAKey)
	if err != nil {
		return nil, fmt.Errorf("read CA key: %w", err)
	}
	ca, err := pki.LoadCA(creds.CAPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load cluster CA: %w", err)
	}
	log = log.With("component", "curator", "replica", cfg.Name)
	pin := etcdpin.New(0)
	etcdConfig := clientv3.Config{
		Endpoints:            cfg.Etcd,
		TLS:                  rpc.ClientTLSConfig(creds, []pki.Kind{pki.KindMember}),
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    rpc.KeepAliveTime,
		DialKeepAliveTimeout: rpc.KeepAliveTimeout,
		// Both clients refuse the answers of another etcd cluster than
		// the pinned one (a cluster a recovery superseded).
		DialOptions: append([]grpc.DialOption{grpc.WithConnectParams(rpc.Reconnect)}, pin.DialOptions()...),
		// No AutoSyncInterval: probeEndpoints keeps the clients on the
		// voters that answer for the pinned cluster (endpoints.go).
		Logger: zap.NewNop(),
	}
	cli, err := clientv3.New(etcdConfig)
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	// The election session renews its lease on a connection of its own:
	// no queue of the serving client (heartbeat flushes, watch loads,
	// GetNodes reads) can delay the renewal that keeps this replica
	// leading.
	sessionCli, err := clientv3.New(etcdConfig)
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("etcd client for the election session: %w", err)
	}
	// Calls to one member (Status, Defragment, MoveLeader, a snapshot)
	// go through a client whose endpoints never change: etcd's client
	// reads its endpoint list unguarded when it dials one member (v3.7.3,
	// Client.dial), which races with probeEndpoints' SetEndpoints (the
	// race detector found it).
	memberCli, err := clientv3.New(etcdConfig)
	if err != nil {
		cli.Close()
		sessionCli.Close()
		return nil, fmt.Errorf("etcd client for calls to one member: %w", err)
	}
	s := &Service{cfg: cfg, log: log, creds: creds, etcd: cli, nodes: nodestore.Store{KV: cli}, sessionEtcd: sessionCli, memberEtcd: memberCli, pin: pin}
	// Pin the cluster and choose the endpoints before anything reads or
	// writes: if a recovery superseded the cluster some of --etcd still
	// answer for, the first round follows it (endpoints.go).
	s.chooseEndpoints(context.Background())
	if pin.ID() == 0 {
		log.Warn("etcd cluster id not learnt yet: no etcd member answered", "etcd", cfg.Etcd)
	}
	// The CA of the trust bundle (--ca) whose key --ca-key holds issues and
	// signs the CRL; the whole bundle (two CAs during a rotation) is
	// trusted.
	trusted, err := pki.ParseCertsPEM(creds.CAPEM)
	if err != nil {
		return nil, err
	}
	s.crl = crl.New(trusted, log.With("part", "crl"))
	s.lead = newLeadership(cli, sessionCli, creds, log, leaderValue{Name: cfg.Name, Address: cfg.Advertise}, cfg.SessionTTL, s.becameLeader)
	s.consensus = newConsensusPool(cfg.Consensus, cli, creds)
	s.certs = &certs.Issuer{
		Cluster: cfg.Cluster, Validity: cfg.CertValidity, CA: ca, Trusted: trusted, Pool: creds.CAPool,
		Etcd: cli, Lead: s.lead, CRL: s.crl, Log: log.With("part", "certificates"),
	}
	s.audit = auditlog.New(cli, s.lead, cfg.Name, cfg.Audit, log.With("part", "audit"))
	s.config = clusterconfig.New(cli, s.lead, s.audit, log.With("part", "cluster-config"))
	s.watch = nodewatch.NewHub(cli, cfg.Watch, log)
	s.snaps, err = snaps.New(cfg.Snapshots, snaps.Deps{
		Etcd: cli, Member: memberCli, Lead: s.lead, Cluster: cfg.Cluster, Name: cfg.Name,
		Audit: func(ctx context.Context, why string) error {
			return s.audit.Record(ctx, auditv1.AuditAction_AUDIT_ACTION_SNAPSHOT, why)
		},
	}, log.With("part", "snapshots"))
	if err != nil {
		cli.Close()
		sessionCli.Close()
		memberCli.Close()
		return nil, err
	}
	s.defrag = etcdmaint.New(cfg.Defrag, etcdmaint.Deps{
		Observer: etcdmaint.Observer{Etcd: cli, Member: memberCli, Log: log.With("part", "etcd-maintenance")},
		Leads: func() (int64, bool) {
			_, term, ok := s.lead.Ours()
			return term, ok
		},
		Audit: s.audit.Record,
	})
	s.registry = &registry.Registry{
		Cluster: cfg.Cluster, Name: cfg.Name, CAPEM: creds.CAPEM,
		Etcd: cli, Nodes: s.nodes, Lead: s.lead, Consensus: s.consensus, Certs: s.certs, Audit: s.audit,
		Log: log.With("part", "registry"),
	}
	s.maint = &maintenance.Maintenance{
		Etcd: cli, Nodes: s.nodes, Lead: s.lead, Members: s.defrag, Audit: s.audit,
		Log: log.With("part", "maintenance"), UpdateRoles: s.registry.UpdateRoles,
	}
	limit := newEnrolmentLimit(cfg.EnrolmentRate, cfg.EnrolmentBurst)
	srv, err := rpc.NewServer(rpc.ServerConfig{
		Credentials:        creds,
		Policy:             policy(),
		Logger:             log.With("part", "grpc"),
		AllowEnrolling:     true,
		IsRevoked:          s.crl.IsRevoked,
		TrustForwardedFrom: []pki.Kind{pki.KindCurator},
		UnaryInterceptors:  []grpc.UnaryServerInterceptor{limit.unary, s.lead.forwardUnary},
		StreamInterceptors: []grpc.StreamServerInterceptor{limit.stream, s.lead.forwardStream},
	})
	if err != nil {
		cli.Close()
		sessionCli.Close()
		memberCli.Close()
		return nil, err
	}
	curatorv1.RegisterCuratorServer(srv.GRPC(), &curatorServer{s: s})
	curatorv1.RegisterManagementServer(srv.GRPC(), &managementServer{s: s})
	curatorv1.RegisterLeasesServer(srv.GRPC(), leases.New(cli, s.lead, log.With("part", "leases")))
	curatorv1.RegisterReconciliationServer(srv.GRPC(), &reconciliationServer{s: s})
	s.rpc = srv
	if err := s.registerMetrics(srv.Registry()); err != nil {
		cli.Close()
		sessionCli.Close()
		memberCli.Close()
		return nil, err
	}
	return s, nil
}

// Run serves until ctx ends; on the way out a leader resigns, so that a
// follower leads at once.
//
// Health (gRPC, and /healthz with --listen-metrics) is SERVING once the
// replica can answer for the cluster: it listens, it reached etcd (its
// election session exists, so it campaigns), it knows who leads (itself or
// another replica it forwards to), and its watch hub loaded the nodes. It
// turns NOT_SERVING when the replica stops.
func (s *Service) Run(ctx context.Context) error {
	defer s.etcd.Close()
	defer s.sessionEtcd.Close()
	defer s.memberEtcd.Close()
	defer s.consensus.close()
	defer s.lead.closeConns()
	lis, mlis, err := rpc.Listen(s.cfg.Listen, s.cfg.ListenMetrics)
	if err != nil {
		return err
	}
	var g run.Group
	g.AddReady("grpc", func(ctx context.Context) error { return s.rpc.Serve(ctx, lis) })
	g.Add("election", func(ctx context.Context) error { return s.lead.campaign(ctx, func() { g.Ready("election") }) })
	g.Add("observe", func(ctx context.Context) error { return s.lead.observe(ctx, func() { g.Ready("observe") }) })
	s.watch.OnLoad = func() { g.Ready("watch") }
	g.Add("watch", s.watch.Run)
	g.AddReady("etcd-endpoints", s.probeEndpoints)
	g.AddReady("crl", func(ctx context.Context) error { return s.crl.Run(ctx, s.etcd) })
	g.AddReady("audit-retention", s.audit.RunRetention)
	if s.cfg.Snapshots.Dir != "" {
		g.AddReady("snapshots", s.snaps.Run)
	}
	g.AddReady("defrag", s.defrag.Run)
	g.AddReady("maintenance", s.maint.RunExpiry)
	if s.cfg.ListenHTTP != "" {
		hl, err := net.Listen("tcp", s.cfg.ListenHTTP)
		if err != nil {
			return fmt.Errorf("listen %s: %w", s.cfg.ListenHTTP, err)
		}
		g.AddReady("connect", func(ctx context.Context) error { return s.serveConnect(ctx, hl) })
	}
	if mlis != nil {
		g.AddReady("metrics", func(ctx context.Context) error { return rpc.ServeMetrics(ctx, mlis, s.rpc.Registry(), s.rpc.Health()) })
	}
	g.Add("health", rpc.Readiness(s.rpc.Health(), &g, "health",
		curatorv1.Curator_ServiceDesc.ServiceName, curatorv1.Management_ServiceDesc.ServiceName, curatorv1.Leases_ServiceDesc.ServiceName,
		curatorv1.Reconciliation_ServiceDesc.ServiceName))
	s.log.Info("curator serving", "listen", lis.Addr().String(), "advertise", s.cfg.Advertise)
	return g.Run(ctx)
}
