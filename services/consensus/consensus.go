// Package consensus is the consensus service: one per control-plane node, it
// owns that node's embedded etcd member and is the only place where etcd
// membership changes.
//
//	roleserve (own node) ── Start / Leave / ────────┐
//	                        SetCredentials          │
//	curator, reconciler ─── AddNode / Promote /     ▼
//	                        RemoveMember + Fence ─▶ server ──▶ fence txn in etcd
//	admin, anyone trusted ─ Status / ListMembers    │          (check, bump epoch, audit)
//	                                                ▼
//	                                        member (embedded etcd, data dir)
//
// Files: consensus.go (config, run), member.go (etcd lifecycle),
// api_status.go, api_membership.go (fenced changes and quorum guards),
// pending.go (one change at a time, cluster-wide), api_lifecycle.go
// (Start, Leave, SetCredentials), identity.go (this process's key and its
// consensus and member certificates), policy.go (who may call what),
// errors.go (the one mapping to gRPC codes), recover.go (quorum-loss
// recovery: Recover, RestoreSnapshot), peergate.go (etcd's peer port:
// closes the connections of revoked certificates), metrics.go (the
// curia_consensus_* gauges).
//
// Metrics (--listen-metrics): /metrics serves this process's own series
// (its API's grpc_server_*, go_*, process_*, curia_build_info and
// curia_consensus_*: voters, learners, failure tolerance, pending change
// age, certificate expiry); /metrics/etcd serves the embedded etcd's
// registry in full and unchanged (etcd_*, and the grpc_server_* of etcd's
// client port), for etcd's own alerts and dashboards. Scrape both
// (docs/metrics.md).
package consensus

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/crl"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/logging"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/run"
)

// Config configures one consensus process.
type Config struct {
	// Cluster is the cluster name, the trust domain of every identity.
	Cluster string
	// DataDir holds the etcd data and what the service remembers.
	DataDir string
	// TLS names the cluster CA (required) and, optionally, this process's
	// key and consensus certificate (the deployment's, for the bootstrap
	// node). Without a key, the process makes one in DataDir; its
	// certificates come from the curator through the node's agent
	// (SetCredentials). See identity.go.
	TLS rpc.TLSFiles
	// MemberCert optionally names the member certificate the deployment
	// issued for the key (the bootstrap node's).
	MemberCert string
	// NodeID (or NodeIDFile, a file holding it) is the node this process
	// serves; without either, it is read from TLS.Cert.
	NodeID     string
	NodeIDFile string

	// CRL is the cluster CA's revocation list (PEM file) the member starts
	// with when it has none of its own yet: the deployment's initial list
	// (curia-pki writes one with the CA). etcd's ports check revocation
	// only if they start with a list; afterwards it follows the newest.
	CRL string
	// Curators are the curator replicas (host:port), from which the
	// revocation list is followed when no local member runs.
	Curators []string
	// RestartCRLWait bounds how long a member kept on disk waits, before
	// it restarts, for the curators' revocation list (with Curators).
	RestartCRLWait time.Duration

	// ListenAPI is the gRPC API address (host:port).
	ListenAPI string
	// ListenPeer and ListenClient are etcd's peer and client addresses.
	ListenPeer   string
	ListenClient string
	// AdvertisePeerURL and AdvertiseClientURL are the URLs others reach
	// etcd at; the peer URL is part of the membership and must not change.
	// Default: https:// and the listen address.
	AdvertisePeerURL   string
	AdvertiseClientURL string
	// ListenMetrics serves Prometheus metrics (/metrics: this process's;
	// /metrics/etcd: the embedded etcd's own, in full) and health
	// (/healthz) over plain HTTP when set (meant for loopback).
	ListenMetrics string
	// EtcdLogLevel holds etcd's own lines at or above this level (a
	// --log-level name); empty: the process's --log-level alone decides.
	// etcd's lines always take the process's --log-format.
	EtcdLogLevel string

	// TickInterval and ElectionTimeout are etcd's heartbeat interval and
	// election timeout.
	TickInterval    time.Duration
	ElectionTimeout time.Duration
	// QuotaBackendBytes is etcd's backend quota: past it etcd raises its
	// NOSPACE alarm and refuses writes until the curator leader compacts,
	// defragments and disarms it. 0: etcd's default (2 GiB).
	QuotaBackendBytes int64
	// StartTimeout bounds how long Start waits for etcd to serve.
	StartTimeout time.Duration
	// HealthTimeout bounds each voter health probe of the quorum guard.
	HealthTimeout time.Duration
	// MemberCallTimeout bounds the etcd member call of a membership change
	// after its fenced start: once it passed, this process no longer makes
	// the call, and another process may resolve the pending change after
	// twice as long.
	MemberCallTimeout time.Duration
	// MaxMemberCallTimeout is the longest MemberCallTimeout any consensus
	// process of the cluster uses. A pending record that cannot be read
	// names no deadline: it is cleared after twice this, when no recorder
	// can still be making its call.
	MaxMemberCallTimeout time.Duration
	// UnsafeNoFsync turns off fsync in etcd. Tests only.
	UnsafeNoFsync bool
	// UnsafeNoStrictReconfig turns off etcd's own checks before a
	// membership change (its voters in contact for 5s, the change keeping
	// an active quorum). Tests only: they prove curia's own guards without
	// etcd's behind them, and want many changes in a short run.
	UnsafeNoStrictReconfig bool

	// nodeID is derived from the certificate in New.
	nodeID string
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Cluster:              "curia",
		DataDir:              "consensus-data",
		ListenAPI:            "127.0.0.1:7100",
		ListenPeer:           "127.0.0.1:2380",
		ListenClient:         "127.0.0.1:2379",
		TickInterval:         100 * time.Millisecond,
		ElectionTimeout:      1000 * time.Millisecond,
		StartTimeout:         time.Minute,
		HealthTimeout:        2 * time.Second,
		MemberCallTimeout:    10 * time.Second,
		MaxMemberCallTimeout: time.Minute,
		RestartCRLWait:       3 * time.Second,
	}
}

// AddFlags registers the flags of the consensus service.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Cluster, "cluster", c.Cluster, "cluster name (trust domain of every identity)")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for etcd data and member state")
	fs.StringVar(&c.TLS.CA, "ca", c.TLS.CA, "path of the cluster CA certificate (PEM)")
	fs.StringVar(&c.TLS.Key, "key", c.TLS.Key, "this process's ed25519 key (PKCS#8 PEM); default: <data-dir>/identity.key, made on the first start")
	fs.StringVar(&c.TLS.Cert, "cert", c.TLS.Cert, "consensus/<node-id> certificate of the key, taken on the first start (the bootstrap node's, from the deployment); others come from the curator through the node's agent")
	fs.StringVar(&c.MemberCert, "member-cert", c.MemberCert, "member/<node-id> certificate of the key, taken on the first start (the bootstrap node's, from the deployment)")
	fs.StringVar(&c.NodeID, "node-id", c.NodeID, "the node this process serves (default: from --node-id-file or --cert)")
	fs.StringVar(&c.NodeIDFile, "node-id-file", c.NodeIDFile, "file holding the node id")
	fs.StringVar(&c.CRL, "crl", c.CRL, "the cluster CA's initial revocation list (PEM, e.g. crl.pem from curia-pki), used until a newer one is known; etcd's ports check revocation only with one")
	run.ListFlag(fs, "curator", "curator address host:port, to follow the revocation list from while no local member runs", &c.Curators)
	fs.DurationVar(&c.RestartCRLWait, "restart-crl-wait", c.RestartCRLWait, "with --curator: how long a member kept on disk waits for the curators' revocation list before it restarts (a member revoked meanwhile, e.g. dropped by a quorum-loss recovery, is not restarted); the wait ends at the first list")
	fs.StringVar(&c.ListenAPI, "listen", c.ListenAPI, "gRPC API address (host:port)")
	fs.StringVar(&c.ListenPeer, "listen-peer", c.ListenPeer, "etcd peer address (host:port)")
	fs.StringVar(&c.ListenClient, "listen-client", c.ListenClient, "etcd client address (host:port)")
	fs.StringVar(&c.AdvertisePeerURL, "advertise-peer-url", c.AdvertisePeerURL, "etcd peer URL others reach this member at (default https://<listen-peer>); must stay fixed")
	fs.StringVar(&c.AdvertiseClientURL, "advertise-client-url", c.AdvertiseClientURL, "etcd client URL (default https://<listen-client>)")
	fs.StringVar(&c.ListenMetrics, "listen-metrics", c.ListenMetrics, "plain-HTTP address of Prometheus metrics (/metrics, this process's; /metrics/etcd, the embedded etcd's) and health (/healthz), e.g. 127.0.0.1:9100 (off when empty)")
	fs.StringVar(&c.EtcdLogLevel, "etcd-log-level", c.EtcdLogLevel, "hold etcd's own log lines at or above this level (debug, info, warn, error); default: --log-level alone decides")
	fs.DurationVar(&c.TickInterval, "etcd-tick", c.TickInterval, "etcd heartbeat interval")
	fs.DurationVar(&c.ElectionTimeout, "etcd-election-timeout", c.ElectionTimeout, "etcd election timeout")
	fs.Int64Var(&c.QuotaBackendBytes, "etcd-quota-backend-bytes", c.QuotaBackendBytes, "etcd's backend quota in bytes: past it etcd raises NOSPACE and refuses writes (0: etcd's default, 2 GiB)")
	fs.DurationVar(&c.StartTimeout, "start-timeout", c.StartTimeout, "how long Start waits for etcd to serve")
	fs.DurationVar(&c.HealthTimeout, "health-timeout", c.HealthTimeout, "timeout of each voter health probe before a removal")
	fs.DurationVar(&c.MemberCallTimeout, "member-call-timeout", c.MemberCallTimeout, "deadline of the etcd member call of a membership change; a change left pending by a dead process is resolved after twice this")
	fs.DurationVar(&c.MaxMemberCallTimeout, "max-member-call-timeout", c.MaxMemberCallTimeout, "the longest --member-call-timeout of any consensus process of the cluster: an unreadable pending membership record is cleared after twice this")
	fs.BoolVar(&c.UnsafeNoFsync, "unsafe-no-fsync", c.UnsafeNoFsync, "turn off fsync in etcd: data loss on power failure; for tests only")
	fs.BoolVar(&c.UnsafeNoStrictReconfig, "unsafe-no-strict-reconfig", c.UnsafeNoStrictReconfig, "turn off etcd's own quorum checks before membership changes (curia's guards still run); for tests only")
}

// withDefaults returns c with its derived defaults filled in: the
// advertised URLs from the listen addresses.
func (c Config) withDefaults() Config {
	if c.AdvertisePeerURL == "" {
		c.AdvertisePeerURL = "https://" + c.ListenPeer
	}
	if c.AdvertiseClientURL == "" {
		c.AdvertiseClientURL = "https://" + c.ListenClient
	}
	return c
}

// Validate checks the configuration, its derived defaults included; it
// changes nothing (New fills them in).
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := pki.ValidateCluster(c.Cluster); err != nil {
		return err
	}
	if c.DataDir == "" {
		return errors.New("--data-dir is required")
	}
	if c.TLS.CA == "" {
		return errors.New("--ca is required: the cluster CA certificate")
	}
	if c.NodeID != "" && c.NodeIDFile != "" {
		return errors.New("--node-id and --node-id-file exclude each other")
	}
	if c.NodeID == "" && c.NodeIDFile == "" && c.TLS.Cert == "" {
		return errors.New("--node-id (or --node-id-file) is required: the node this process serves")
	}
	for _, a := range c.Curators {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("--curator %q: %w", a, err)
		}
	}
	for name, addr := range map[string]string{"--listen": c.ListenAPI, "--listen-peer": c.ListenPeer, "--listen-client": c.ListenClient} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("%s %q: %w", name, addr, err)
		}
	}
	for name, u := range map[string]string{"--advertise-peer-url": c.AdvertisePeerURL, "--advertise-client-url": c.AdvertiseClientURL} {
		if err := validatePeerURL(u); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	if c.TickInterval <= 0 || c.ElectionTimeout < 5*c.TickInterval {
		return fmt.Errorf("etcd election timeout (%v) must be at least 5 heartbeat intervals (%v)", c.ElectionTimeout, c.TickInterval)
	}
	if c.QuotaBackendBytes < 0 {
		return fmt.Errorf("--etcd-quota-backend-bytes %d: 0 (etcd's default) or positive", c.QuotaBackendBytes)
	}
	if c.StartTimeout <= 0 || c.HealthTimeout <= 0 || c.MemberCallTimeout <= 0 {
		return errors.New("--start-timeout, --health-timeout and --member-call-timeout must be positive")
	}
	if c.MemberCallTimeout > c.MaxMemberCallTimeout {
		return fmt.Errorf("--member-call-timeout %v is longer than --max-member-call-timeout %v, the longest any process of the cluster may use: raise the maximum on every consensus process first", c.MemberCallTimeout, c.MaxMemberCallTimeout)
	}
	if c.EtcdLogLevel != "" {
		if _, err := logging.ParseLevel(c.EtcdLogLevel); err != nil {
			return fmt.Errorf("--etcd-log-level: %w", err)
		}
	}
	return nil
}

// etcdLevel is the level etcd's own log lines are held at: EtcdLogLevel,
// or below every level when unset (the process's level decides).
func (c Config) etcdLevel() slog.Level {
	if l, err := logging.ParseLevel(c.EtcdLogLevel); c.EtcdLogLevel != "" && err == nil {
		return l
	}
	return slog.LevelDebug - 1
}

// validatePeerURL checks an etcd URL flag: https, host and port, nothing
// else. (Requests carry the same rule in their contract,
// curia.validate.v1.https_host_port.)
func validatePeerURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("URL %q: %w", s, err)
	}
	if u.Scheme != "https" || u.Hostname() == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("URL %q: want https://host:port and nothing else", s)
	}
	return nil
}

// Service is a running consensus process.
type Service struct {
	cfg    Config
	log    *slog.Logger
	creds  *rpc.Credentials
	member *member
	rpc    *rpc.Server
	crl    *crl.Watcher
	// trusted is the cluster CA bundle (--ca), for the peer gate.
	trusted *x509.CertPool
	// curators is a connection to the curators (nil without --curator),
	// with the API's credentials.
	curators *grpc.ClientConn
	// pending is when this process first saw each pending change.
	pending *pendingClock
}

// New prepares the service; nothing listens until Run.
func New(cfg Config, log *slog.Logger) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	var err error
	if cfg.nodeID, err = nodeID(cfg); err != nil {
		return nil, err
	}
	log = log.With("component", "consensus", "node", cfg.nodeID)
	caPEM, err := os.ReadFile(cfg.TLS.CA)
	if err != nil {
		return nil, fmt.Errorf("read --ca: %w", err)
	}
	cas, err := pki.ParseCertsPEM(caPEM)
	if err != nil {
		return nil, fmt.Errorf("--ca: %w", err)
	}
	revocations := crl.New(cas, log.With("part", "crl"))
	m, err := newMember(cfg, revocations, log.With("part", "member"), log.With("part", "etcd"))
	if err != nil {
		return nil, err
	}
	creds := m.id.api
	s := &Service{cfg: cfg, log: log, creds: creds, member: m, crl: revocations, pending: newPendingClock(), trusted: x509.NewCertPool()}
	for _, ca := range cas {
		s.trusted.AddCert(ca)
	}
	if len(cfg.Curators) > 0 {
		// A process that has no consensus certificate yet presents a
		// self-signed one, which the curators admit for the CRL alone.
		if s.curators, err = rpc.DialAny(cfg.Curators, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}}); err != nil {
			return nil, fmt.Errorf("dial curators: %w", err)
		}
	}
	srv, err := rpc.NewServer(rpc.ServerConfig{
		Credentials: creds,
		Policy:      policy(cfg.nodeID),
		Logger:      log.With("part", "grpc"),
		IsRevoked:   s.crl.IsRevoked,
	})
	if err != nil {
		return nil, err
	}
	consensusv1.RegisterConsensusServer(srv.GRPC(), &server{s: s})
	s.rpc = srv
	if err := s.registerMetrics(srv.Registry()); err != nil {
		return nil, err
	}
	return s, nil
}

// nodeID is the node the process serves: --node-id, the file
// --node-id-file names, or the principal of --cert.
func nodeID(cfg Config) (string, error) {
	id := cfg.NodeID
	switch {
	case cfg.NodeIDFile != "":
		b, err := os.ReadFile(cfg.NodeIDFile)
		if err != nil {
			return "", fmt.Errorf("--node-id-file: %w", err)
		}
		id = strings.TrimSpace(string(b))
	case id == "":
		b, err := os.ReadFile(cfg.TLS.Cert)
		if err != nil {
			return "", fmt.Errorf("--cert: %w", err)
		}
		cert, err := pki.ParseCertPEM(b)
		if err != nil {
			return "", fmt.Errorf("--cert: %w", err)
		}
		p, err := pki.PrincipalFromCert(cert, cfg.Cluster)
		if err != nil {
			return "", fmt.Errorf("--cert %s: %w", cfg.TLS.Cert, err)
		}
		if p.Kind != pki.KindConsensus {
			return "", fmt.Errorf("--cert %s is for %v, not a consensus/<node-id>", cfg.TLS.Cert, p)
		}
		id = p.Name
	}
	if err := (pki.Principal{Kind: pki.KindConsensus, Name: id}).Validate(); err != nil {
		return "", fmt.Errorf("node id: %w", err)
	}
	return id, nil
}

// NodeID is the node this process serves.
func (s *Service) NodeID() string { return s.cfg.nodeID }

// Run serves until ctx ends. A node with a member on disk restarts it at
// once; otherwise the member waits idle for Start.
//
// Health (gRPC, and /healthz with --listen-metrics) is SERVING once the API
// listens and the member is settled:
//
//   - no member on disk (a worker, or a node before its first Start): at
//     once — the API's job is then to take Start, Leave and Status;
//   - a member on disk: once the restarted etcd serves (RUNNING). While it
//     waits for its quorum, or if the restart failed, the process says
//     NOT_SERVING (Status tells why);
//   - a member whose certificate is revoked (not restarted on purpose): at
//     once — what is left to do is Leave.
//
// Health is a start gate: a member that Start or Leave moves later does not
// flip it (Status and curia_consensus_member_running do). It turns
// NOT_SERVING when the process stops.
func (s *Service) Run(ctx context.Context) error {
	lis, mlis, err := rpc.Listen(s.cfg.ListenAPI, s.cfg.ListenMetrics)
	if err != nil {
		return err
	}
	gate, err := newPeerGate(s.cfg.ListenPeer, s.member.peerSocket, s.trusted, s.member.id.memberCertPath(), s.member.id.keyPath, s.crl, s.log.With("part", "peer-gate"))
	if err != nil {
		lis.Close()
		if mlis != nil {
			mlis.Close()
		}
		return err
	}
	if dir := s.member.peerSocketDir; dir != "" {
		defer os.RemoveAll(dir)
	}
	var g run.Group
	g.AddReady("grpc", func(ctx context.Context) error { return s.rpc.Serve(ctx, lis) })
	g.AddReady("peer-gate", gate.run)
	g.Add("member", func(ctx context.Context) error { return s.runMember(ctx, func() { g.Ready("member") }) })
	g.AddReady("crl", s.followCRL)
	g.AddReady("crl-file", s.member.keepCRLFile)
	if s.curators != nil {
		defer s.curators.Close()
		g.AddReady("crl-curators", func(ctx context.Context) error {
			return s.crl.Follow(ctx, func() (curatorv1.CuratorClient, error) { return curatorv1.NewCuratorClient(s.curators), nil })
		})
	}
	g.AddReady("pending", s.followPending)
	if mlis != nil {
		// etcd registers its metrics (etcd_*) on the default registry,
		// with its own go_* and grpc_server_* (its client port's): served
		// apart, in full, on /metrics/etcd (metrics.go).
		etcd := rpc.MetricsPath{Path: etcdMetricsPath, Gatherer: prometheus.DefaultGatherer}
		g.AddReady("metrics", func(ctx context.Context) error {
			return rpc.ServeMetrics(ctx, mlis, s.rpc.Registry(), s.rpc.Health(), etcd)
		})
	}
	g.Add("health", rpc.Readiness(s.rpc.Health(), &g, "health", consensusv1.Consensus_ServiceDesc.ServiceName))
	s.log.Info("consensus serving", "api", lis.Addr().String(), "peer_url", s.cfg.AdvertisePeerURL, "client_url", s.cfg.AdvertiseClientURL)
	return g.Run(ctx)
}

// runMember restarts a member found on disk, then keeps etcd until ctx
// ends. It calls ready once the member is settled (see Run).
func (s *Service) runMember(ctx context.Context, ready func()) error {
	s.member.lifeMu.Lock()
	restarting := false
	hasData := s.member.hasData()
	var behind string
	if hasData {
		behind = s.awaitCuratorsCRL(ctx)
	}
	switch {
	case !hasData:
	case behind != "":
		// Fail closed: a revocation of this member made since the
		// cluster's state stepped back may be numbered below the list
		// kept, which refuses it as older (issue 29, N2).
		s.member.setState(consensusv1.LifecycleState_LIFECYCLE_STATE_STOPPED, behind)
		s.log.Warn("the curators' revocation list is older than the one kept: etcd not restarted", "reason", behind)
	case s.member.id.memberRevoked():
		// The node lost ConsensusMember while this process was down: its
		// member is (being) removed, and the peers refuse its certificate.
		s.member.setState(consensusv1.LifecycleState_LIFECYCLE_STATE_STOPPED, "the member certificate is revoked (the node lost ConsensusMember): etcd is not restarted; Leave wipes the data once the member is gone")
		s.log.Warn("member certificate revoked: etcd not restarted")
	default:
		// Not waited for: Start and Leave are not held up while a
		// member that may never be let back in restarts (its state says
		// STARTING meanwhile).
		restarting = true
		sctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := s.member.start(sctx, modeRestart, ""); err != nil && !errors.Is(err, context.Canceled) {
			// The API keeps serving so an operator can see why.
			s.log.Error("restart from disk failed", "err", err)
		}
	}
	s.member.lifeMu.Unlock()
	if restarting {
		select {
		case <-s.member.ranOnce:
		case <-ctx.Done():
		}
	}
	ready()
	s.finishRecording(ctx)
	<-ctx.Done()
	s.member.stop()
	return nil
}

// awaitCuratorsCRL waits (at most RestartCRLWait) for the curators'
// revocation list, before a member kept on disk restarts. The list on disk
// may be older than the cluster: after a quorum-loss recovery, the
// reconciler revokes the member certificates of the members the recovery
// dropped, and two of them that come back together with their data would
// otherwise make the old cluster's quorum between themselves. With the
// curators' list, a revoked member is not restarted (its node's agent
// wipes it). The wait is bounded because when the whole control plane
// restarts, the curators have no list to give until etcd runs.
//
// A list of the curators older than the one kept does not end the wait
// (crl.Watcher.Heard): the cluster's state stepped back (etcd restored or
// recovered from an older state), and the curators' list may revoke this
// member under a number the kept list refuses. If no list at least as new
// comes within the wait, it returns why the member must stay stopped.
func (s *Service) awaitCuratorsCRL(ctx context.Context) (behind string) {
	if s.curators == nil || s.cfg.RestartCRLWait <= 0 || failpoint.Mutated(failpoint.NoOldMemberCRLWait) {
		return ""
	}
	t := time.NewTimer(s.cfg.RestartCRLWait)
	defer t.Stop()
	select {
	case <-s.crl.Heard():
	case <-t.C:
		if theirs, held := s.crl.CuratorsBehind(); theirs != nil {
			return fmt.Sprintf("the curators' revocation list (number %s) is older than the one this member kept (number %s): the cluster's state stepped back (a restore or a recovery), and a revocation of this member may be numbered below the kept list; etcd is not restarted (Leave wipes the data once the member is gone)", theirs, held)
		}
		s.log.Warn("no revocation list from the curators: restarting the member with the list kept on disk", "waited", s.cfg.RestartCRLWait)
	case <-ctx.Done():
	}
	return ""
}

// finishRecording records a recovery whose process stopped after the
// swap and before the record (recovery.go), once the member runs.
func (s *Service) finishRecording(ctx context.Context) {
	for ctx.Err() == nil {
		if _, err := os.Stat(s.member.recoveryPath()); err != nil {
			return
		}
		if _, _, err := s.member.running(); err == nil {
			rctx, cancel := context.WithTimeout(ctx, finishTimeout)
			_, err := s.recordRecovery(rctx)
			cancel()
			if err == nil {
				return
			}
			s.log.Warn("record the interrupted recovery; retrying", "err", err)
		}
		run.Sleep(ctx, time.Second)
	}
}

// followCRL follows the cluster's revocation list in etcd while the local
// member runs (through the member's client). The list is enforced on this
// API, on etcd's client port for every call (etcdConfig) and, through the
// file keepCRLFile writes, on etcd's ports for every new connection.
func (s *Service) followCRL(ctx context.Context) error {
	for ctx.Err() == nil {
		if _, cli, err := s.member.running(); err == nil {
			if err := s.crl.Run(ctx, cli); err != nil {
				return fmt.Errorf("follow the CRL: %w", err)
			}
		}
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}
