// Package roleserve is the node agent (DESIGN §7): one per node. It gives
// the node its identity, enrols it in the cluster, watches the node's roles
// on the curator and runs what they ask for — today the node's consensus
// member, through the local consensus service's Start and Leave.
//
//	                   curator (any replica; DialAny)
//	   Register, Commit ▲    ▲ Watch(node_id=self),  ▲ Heartbeat,
//	   (self-signed)    │    │ resumable             │ UpdateNodeStatus
//	┌───────────────────┴────┴───────────────────────┴──────────────────┐
//	│ enrolment: state machine NEW → … → RUNNING, persisted (state.go)  │
//	│    │ RUNNING                                                      │
//	│    ▼                                                              │
//	│ roles: last roles seen, persisted ┐                               │
//	│ bootstrap data, CA, --consensus ──┴▶ reduce ─▶ control ─▶ launcher│
//	│ heartbeat, status reports           (pure)   (flip or member)  │  │
//	│ api: RoleServer/GetStatus                                      │  │
//	└────────────────────────────────────────────────────────────────┼──┘
//	                                          Start / Leave / Status │
//	                                                                 ▼
//	                                                  local consensus service
//
// Files: roleserve.go (config, run), identity.go (the node key, the
// certificate and the data directory), state.go (the enrolment state
// machine), enrolment.go (what each enrolment state does), roles.go
// (watching the node's roles), launcher.go (the reduce's decision carried
// out on the local consensus), heartbeat.go (heartbeats and status
// reports), api.go (GetStatus), errors.go (which errors are worth a
// retry), certificates.go (keeping the node's and its consensus process's
// certificates fresh), metrics.go, internal/reduce/ (the pure control-plane
// reduce).
package roleserve

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	roleservev1 "curia.dev/gen/curia/roleserve/v1"
	"curia.dev/platform/crl"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/run"
	"curia.dev/services/roleserve/internal/reduce"
)

// Config configures one node agent.
type Config struct {
	// Cluster is the cluster name, the trust domain of every identity.
	Cluster string
	// DataDir holds the node's identity, certificate and enrolment state.
	DataDir string
	// CA is the cluster CA certificate (PEM file).
	CA string
	// Curators are the curator replicas (host:port).
	Curators []string
	// NodeKey, if set, is the ed25519 key (PKCS#8 PEM) the node takes on
	// its first start instead of generating one.
	NodeKey string
	// Bootstrap makes the first node of a new cluster, with a node/<id>
	// certificate of the CA for this node's id (BootstrapCert, BootstrapKey).
	Bootstrap     bool
	BootstrapCert string
	BootstrapKey  string
	// RegisterTicket (base64, as the API shows it) or RegisterTicketFile
	// (the raw ticket) is the cluster's register ticket for other nodes.
	RegisterTicket     string
	RegisterTicketFile string
	// Consensus is the local consensus service's API (host:port); empty
	// when this node cannot run consensus.
	Consensus string
	// Address is the address reported to the curator.
	Address string
	// Listen is the RoleServer API address.
	Listen string
	// ListenMetrics serves Prometheus metrics (/metrics) and health
	// (/healthz) over plain HTTP when set (meant for loopback). Unlike the
	// API, it serves before the node has its certificate.
	ListenMetrics string
	// Labels are requested at registration (the bootstrap node's are
	// recorded when it bootstraps the cluster).
	Labels map[string]string
	// HeartbeatInterval is the heartbeat interval until the curator names
	// its own.
	HeartbeatInterval time.Duration
	// StatusInterval is how often the local consensus is looked at for
	// the status reported to the curator.
	StatusInterval time.Duration
	// RetryMax is the longest wait between attempts of a failing step.
	RetryMax time.Duration
	// RenewCheck is how often the certificates are checked for renewal
	// (certificates.go).
	RenewCheck time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Cluster:           "curia",
		DataDir:           "roleserve-data",
		Listen:            "127.0.0.1:7400",
		HeartbeatInterval: 5 * time.Second,
		StatusInterval:    2 * time.Second,
		RetryMax:          10 * time.Second,
		RenewCheck:        10 * time.Second,
	}
}

// AddFlags registers the agent's flags.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Cluster, "cluster", c.Cluster, "cluster name (trust domain of every identity)")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for the node's key, certificate and enrolment state (0700)")
	fs.StringVar(&c.CA, "ca", c.CA, "path of the cluster CA certificate (PEM)")
	run.ListFlag(fs, "curator", "curator address host:port", &c.Curators)
	fs.StringVar(&c.NodeKey, "node-key", c.NodeKey, "ed25519 node key (PKCS#8 PEM, e.g. node-<id>.ed25519.key from curia-pki) taken on first start instead of a generated one")
	fs.BoolVar(&c.Bootstrap, "bootstrap", c.Bootstrap, "create a new cluster with this node as its first member")
	fs.StringVar(&c.BootstrapCert, "bootstrap-cert", c.BootstrapCert, "with --bootstrap: node/<id> certificate of this node from curia-pki (PEM)")
	fs.StringVar(&c.BootstrapKey, "bootstrap-key", c.BootstrapKey, "with --bootstrap: the key of --bootstrap-cert (PEM)")
	fs.StringVar(&c.RegisterTicket, "register-ticket", c.RegisterTicket, "the cluster's register ticket, base64 (as Management/GetRegisterTicket shows it in JSON)")
	fs.StringVar(&c.RegisterTicketFile, "register-ticket-file", c.RegisterTicketFile, "file holding the raw register ticket; read when registering, so it may appear later")
	fs.StringVar(&c.Consensus, "consensus", c.Consensus, "the local consensus service's API host:port (empty: this node cannot run consensus)")
	fs.StringVar(&c.Address, "address", c.Address, "the address reported to the curator (default: hostname)")
	fs.StringVar(&c.Listen, "listen", c.Listen, "RoleServer API address (host:port), served with the node certificate")
	fs.StringVar(&c.ListenMetrics, "listen-metrics", c.ListenMetrics, "plain-HTTP address of Prometheus metrics (/metrics) and health (/healthz), e.g. 127.0.0.1:9100 (off when empty); serves from the start")
	fs.Func("labels", "labels requested at registration or bootstrap, k=v[,k=v...] (repeatable), e.g. zone=zone-a: autopilot spreads voters across zones", func(s string) error {
		if c.Labels == nil {
			c.Labels = map[string]string{}
		}
		for _, kv := range run.SplitList(s) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || strings.TrimSpace(k) == "" {
				return fmt.Errorf("label %q: want key=value", kv)
			}
			c.Labels[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
		return nil
	})
	fs.DurationVar(&c.HeartbeatInterval, "heartbeat-interval", c.HeartbeatInterval, "heartbeat interval until the curator names its own")
	fs.DurationVar(&c.StatusInterval, "status-interval", c.StatusInterval, "how often the local consensus is checked for the status reported to the curator")
	fs.DurationVar(&c.RetryMax, "retry-max", c.RetryMax, "longest wait between attempts of a failing step")
	fs.DurationVar(&c.RenewCheck, "renew-check", c.RenewCheck, "how often the node's and its consensus process's certificates are checked; they are renewed after two thirds of their life")
}

// withDefaults returns c with its derived defaults filled in: the
// address others reach this node at, by default its hostname.
func (c Config) withDefaults() (Config, error) {
	if c.Address == "" {
		host, err := os.Hostname()
		if err != nil {
			return c, fmt.Errorf("--address not given and no hostname: %w", err)
		}
		c.Address = host
	}
	return c, nil
}

// Validate checks the configuration, its derived defaults included; it
// changes nothing (New fills them in).
func (c Config) Validate() error {
	if err := pki.ValidateCluster(c.Cluster); err != nil {
		return err
	}
	if c.DataDir == "" {
		return errors.New("--data-dir is required")
	}
	if c.CA == "" {
		return errors.New("--ca is required: the cluster CA certificate")
	}
	if len(c.Curators) == 0 {
		return errors.New("--curator is required: at least one curator address")
	}
	for _, a := range c.Curators {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("--curator %q: %w", a, err)
		}
	}
	if c.Bootstrap {
		if c.BootstrapCert == "" || c.BootstrapKey == "" {
			return errors.New("--bootstrap needs --bootstrap-cert and --bootstrap-key: a node/<id> certificate of this node")
		}
		if c.Consensus == "" {
			return errors.New("--bootstrap needs --consensus: the first node runs the cluster's first etcd member")
		}
	}
	if c.RegisterTicket != "" && c.RegisterTicketFile != "" {
		return errors.New("--register-ticket and --register-ticket-file exclude each other")
	}
	if c.RegisterTicket != "" {
		if _, err := decodeTicket(c.RegisterTicket); err != nil {
			return err
		}
	}
	if c.Consensus != "" {
		if _, _, err := net.SplitHostPort(c.Consensus); err != nil {
			return fmt.Errorf("--consensus %q: %w", c.Consensus, err)
		}
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--listen %q: %w", c.Listen, err)
	}
	if _, err := c.withDefaults(); err != nil {
		return err
	}
	if c.HeartbeatInterval <= 0 || c.StatusInterval <= 0 || c.RetryMax <= 0 || c.RenewCheck <= 0 {
		return errors.New("--heartbeat-interval, --status-interval, --retry-max and --renew-check must be positive")
	}
	return nil
}

// expired reports whether the certificate in path has expired.
func expired(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	c, err := pki.ParseCertPEM(b)
	return err == nil && time.Now().After(c.NotAfter)
}

// decodeTicket decodes a base64 register ticket (padded or not).
func decodeTicket(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil && len(b) > 0 {
			return b, nil
		}
	}
	return nil, errors.New("--register-ticket: not base64 (give the ticket as the API shows it in JSON, or the raw ticket with --register-ticket-file)")
}

// Service is one node agent.
type Service struct {
	cfg   Config
	log   *slog.Logger
	files dataFiles
	caPEM []byte
	// caCerts is the trust bundle (--ca): two CAs during a rotation.
	caCerts []*x509.Certificate
	key     ed25519.PrivateKey
	id      string

	machine *machine
	// crl is the cluster's revocation list, followed from the curators and
	// enforced on the agent's API.
	crl *crl.Watcher
	// bootstrapCreds are the --bootstrap-cert credentials of a NEW node.
	bootstrapCreds *nodeCreds

	// enrolled is closed when the machine reaches RUNNING.
	enrolled chan struct{}
	// credsReady is closed when the node has its certificate.
	credsReady chan struct{}
	// kick asks the control loop to decide again; statusKick asks for a
	// status report now.
	kick       chan struct{}
	statusKick chan struct{}
	// certKick asks for a certificate check now (the roles changed).
	certKick chan struct{}

	// health and registry are the API server's, made before it (which
	// waits for the node certificate) so that /healthz and /metrics
	// answer from the start.
	health   *health.Server
	registry *prometheus.Registry

	connMu    sync.Mutex
	creds     *rpc.Credentials
	curator   *grpc.ClientConn
	consensus *grpc.ClientConn

	mu sync.Mutex
	st agentState
}

// agentState is what GetStatus reports besides the machine's record.
type agentState struct {
	// roles as last seen; rolesKnown once the curator sent the node's
	// record (now or in an earlier run: rolesSource "curator" or "disk").
	node        *curatorv1.Node
	rolesKnown  bool
	rolesSource string

	decision reduce.Decision
	since    time.Time
	ignored  string

	launcher launcherState

	connected     bool
	lastHeartbeat time.Time
	reported      *curatorv1.NodeStatus
}

// launcherState is the launcher's progress.
type launcherState struct {
	phase     string
	lastError string
	attempts  int64
}

// New prepares the agent: it creates or loads the node's identity and its
// enrolment state. Nothing connects until Run.
func New(cfg Config, log *slog.Logger) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(cfg.CA)
	if err != nil {
		return nil, fmt.Errorf("read cluster CA: %w", err)
	}
	caCerts, err := pki.ParseCertsPEM(caPEM)
	if err != nil {
		return nil, fmt.Errorf("cluster CA %s: %w", cfg.CA, err)
	}
	files, err := prepareDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	key, err := loadOrCreateKey(files.identityKey, cfg.NodeKey)
	if err != nil {
		return nil, err
	}
	id := pki.NodeID(key.Public().(ed25519.PublicKey))
	log = log.With("component", "roleserve", "node", id)
	m, err := loadMachine(files.enrolment, id, log.With("part", "enrolment"))
	if err != nil {
		return nil, err
	}
	s := &Service{
		cfg: cfg, log: log, files: files, caPEM: caPEM, caCerts: caCerts, key: key, id: id, machine: m,
		enrolled:   make(chan struct{}),
		credsReady: make(chan struct{}),
		kick:       make(chan struct{}, 1),
		statusKick: make(chan struct{}, 1),
		certKick:   make(chan struct{}, 1),
		crl:        crl.New(caCerts, log.With("part", "crl")),
		health:     health.NewServer(),
		registry:   rpc.NewRegistry(),
	}
	s.st.launcher.phase = phaseNone
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	if err := s.registerMetrics(); err != nil {
		return nil, err
	}

	switch st := m.State(); st {
	case StateNew:
		switch {
		case cfg.Bootstrap:
			// Checked now, so that a wrong certificate stops the process
			// with the reason instead of failing the node for good.
			c, err := loadNodeCreds(cfg.Cluster, caPEM, cfg.BootstrapCert, cfg.BootstrapKey, id)
			if err != nil {
				return nil, fmt.Errorf("--bootstrap-cert: %w", err)
			}
			s.bootstrapCreds = c
		case cfg.RegisterTicket == "" && cfg.RegisterTicketFile == "":
			return nil, errors.New("a new node needs --bootstrap (first node of a new cluster) or --register-ticket / --register-ticket-file")
		}
	case StateRegistering:
		if cfg.RegisterTicket == "" && cfg.RegisterTicketFile == "" {
			return nil, errors.New("the node is registering: it needs --register-ticket or --register-ticket-file")
		}
	default:
		if cfg.Bootstrap {
			log.Info("--bootstrap ignored: enrolment went past NEW", "state", st)
		}
	}
	if c, err := loadNodeCreds(cfg.Cluster, caPEM, files.nodeCert, files.nodeKey, id); err == nil {
		s.setCreds(c.creds)
	} else if st := m.State(); st == StateRunning && expired(files.nodeCert) {
		// Renewed after two thirds of its life, but only while the agent
		// runs: runEnrolment commits again (recommitExpired).
		log.Warn("the node certificate expired while the agent was down", "cert", files.nodeCert)
	} else if st == StateRunning || st == StateBootstrapping {
		return nil, fmt.Errorf("enrolment is %s but the node certificate in %s is unusable: %w", st, cfg.DataDir, err)
	}
	if n, err := loadNodeRecord(files.nodeRecord); err != nil {
		return nil, err
	} else if n != nil {
		s.st.node, s.st.rolesKnown, s.st.rolesSource = n, true, "disk"
	}
	return s, nil
}

// NodeID is this node's id.
func (s *Service) NodeID() string { return s.id }

// Run enrols the node and then follows its roles until ctx ends.
//
// Health (gRPC on the API, and /healthz with --listen-metrics) is SERVING
// once the agent's API serves, which takes the node certificate: at once for
// an enrolled node, after the commit for a new one (while it waits for
// approval it is NOT_SERVING). It turns NOT_SERVING when the agent stops.
func (s *Service) Run(ctx context.Context) error {
	defer s.closeConns()
	mlis, err := rpc.ListenMetrics(s.cfg.ListenMetrics)
	if err != nil {
		return err
	}
	s.log.Info("node agent starting", "state", s.machine.State(), "data_dir", s.cfg.DataDir, "curators", strings.Join(s.cfg.Curators, ","), "consensus", s.cfg.Consensus)
	var g run.Group
	g.AddReady("enrolment", s.runEnrolment)
	g.Add("api", func(ctx context.Context) error { return s.serveAPI(ctx, func() { g.Ready("api") }) })
	g.AddReady("roles", s.watchRoles)
	g.AddReady("control", s.control)
	g.AddReady("heartbeat", s.heartbeat)
	g.AddReady("status", s.reportStatus)
	g.AddReady("crl", s.followCRL)
	g.AddReady("certificates", s.certificates)
	if mlis != nil {
		g.AddReady("metrics", func(ctx context.Context) error { return rpc.ServeMetrics(ctx, mlis, s.registry, s.health) })
	}
	g.Add("health", rpc.Readiness(s.health, &g, "health", roleservev1.RoleServer_ServiceDesc.ServiceName))
	return g.Run(ctx)
}

// followCRL follows the revocation list from the curators once the node has
// its certificate.
func (s *Service) followCRL(ctx context.Context) error {
	if !waitFor(ctx, s.credsReady) {
		return nil
	}
	return s.crl.Follow(ctx, s.curatorClient)
}

// setCreds makes the node certificate the agent's identity from now on.
func (s *Service) setCreds(c *rpc.Credentials) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.creds != nil {
		return
	}
	s.creds = c
	close(s.credsReady)
}

// conns returns the connections made with the node certificate: to the
// curators (any replica) and to the local consensus (nil when none is
// configured). They are dialled once, when first needed.
func (s *Service) conns() (cur, cons *grpc.ClientConn, err error) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.creds == nil {
		return nil, nil, errors.New("the node has no certificate yet")
	}
	if s.curator == nil {
		s.curator, err = rpc.DialAny(s.cfg.Curators, rpc.ClientConfig{Credentials: s.creds, ServerKinds: []pki.Kind{pki.KindCurator}})
		if err != nil {
			return nil, nil, fmt.Errorf("dial curators: %w", err)
		}
	}
	if s.consensus == nil && s.cfg.Consensus != "" {
		// A consensus process that has no certificate yet serves with a
		// self-signed one: the agent installs its first (certificates.go).
		// Nothing secret goes to it, and consensusStatus checks it is this
		// node's.
		s.consensus, err = rpc.Dial(s.cfg.Consensus, rpc.ClientConfig{Credentials: s.creds, ServerKinds: []pki.Kind{pki.KindConsensus}, AllowSelfSignedServer: true})
		if err != nil {
			return nil, nil, fmt.Errorf("dial local consensus: %w", err)
		}
	}
	return s.curator, s.consensus, nil
}

func (s *Service) closeConns() {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	for _, cc := range []*grpc.ClientConn{s.curator, s.consensus} {
		if cc != nil {
			cc.Close()
		}
	}
	s.curator, s.consensus = nil, nil
}

// curatorClient is the Curator API with the node certificate.
func (s *Service) curatorClient() (curatorv1.CuratorClient, error) {
	cur, _, err := s.conns()
	if err != nil {
		return nil, err
	}
	return curatorv1.NewCuratorClient(cur), nil
}

// signal wakes a loop waiting on ch (without blocking).
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// sortedLabels renders labels for logs.
func sortedLabels(m map[string]string) string {
	var kv []string
	for k, v := range m {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return strings.Join(kv, ",")
}
