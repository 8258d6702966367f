// Package reconciler keeps node roles and etcd membership in agreement
// (DESIGN §6). N replicas run; the one holding the curator lease
// "reconciler" acts, the others stand by. etcd membership is the source of
// truth; every change is fenced on the lease, the term that granted it, and
// the membership epoch the plan was made from.
//
//	trigger (node watch event, membership epoch change, cluster config
//	         change, tick, previous action, the plan's next deadline:
//	         plan.Recheck)
//	   │
//	   ▼
//	observe ── consensus ListMembers (epoch, members) ─┐
//	   │    └─ curator Watch snapshot (nodes) ─────────┤
//	   ▼                                               │
//	plan.Plan(observed) → one action (pure, package plan)
//	   │
//	   ▼
//	act ── curator Management.TakeSnapshot before a membership change (bounded, best effort)
//	    ├─ consensus RemoveMember / PromoteMember / AddNode  (fence + epoch)
//	    └─ curator Reconciliation.ReconcileNodeRoles         (fence + epoch + node revision)
//
// Files: reconciler.go (config, run), lease.go (holding the lease),
// observe.go, act.go, api.go (GetStatus, Plan, Pause, Resume), view.go (the
// replica's copy of the nodes, kept by one Watch), metrics.go, internal/plan/.
package reconciler

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/crl"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/run"
	"curia.dev/services/reconciler/internal/plan"
)

// Config configures one reconciler replica.
type Config struct {
	// Cluster is the cluster name, the trust domain of every identity.
	Cluster string
	// Name is this replica's name; it asks for the lease as the name and a
	// random per-process incarnation.
	Name string
	// TLS is a reconciler certificate.
	TLS rpc.TLSFiles
	// Listen is the gRPC API address.
	Listen string
	// ListenMetrics serves Prometheus metrics (/metrics) and health
	// (/healthz) over plain HTTP when set (meant for loopback).
	ListenMetrics string
	// Curator and Consensus are the addresses (host:port) of the curator
	// replicas and of consensus services.
	Curator   []string
	Consensus []string
	// LeaseTTL is the lease's TTL: how long a dead active replica blocks
	// its standbys.
	LeaseTTL time.Duration
	// Tick is the backstop between passes when nothing triggers one.
	Tick time.Duration
	// Plan's bounds. The cluster configuration (Management/
	// GetClusterConfig, read every pass) sets the target size, the dead
	// node threshold, min_quorum and the stabilisation; VoterFloor raises
	// min_quorum for this replica, and a non-zero Stabilization overrides
	// the cluster's (tests shorten it).
	VoterFloor          int
	Stabilization       time.Duration
	LearnerStartTimeout time.Duration
	// SnapshotTimeout bounds the wait for the curators' etcd snapshot
	// before each membership change (0: ask for none); the change goes on
	// without one when it passes (act.go, snapshotBefore).
	SnapshotTimeout time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		Cluster:             "curia",
		Name:                host,
		Listen:              "127.0.0.1:7300",
		LeaseTTL:            10 * time.Second,
		Tick:                5 * time.Second,
		VoterFloor:          1,
		LearnerStartTimeout: 2 * time.Minute,
		SnapshotTimeout:     5 * time.Second,
	}
}

// AddFlags registers the reconciler's flags.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Cluster, "cluster", c.Cluster, "cluster name (trust domain of every identity)")
	fs.StringVar(&c.Name, "name", c.Name, "this replica's name; it holds the lease as <name>/<random incarnation>")
	c.TLS.AddFlags(fs, "")
	fs.StringVar(&c.Listen, "listen", c.Listen, "gRPC API address (host:port)")
	fs.StringVar(&c.ListenMetrics, "listen-metrics", c.ListenMetrics, "plain-HTTP address of Prometheus metrics (/metrics) and health (/healthz), e.g. 127.0.0.1:9100 (off when empty)")
	run.ListFlag(fs, "curator", "curator address host:port", &c.Curator)
	run.ListFlag(fs, "consensus", "consensus service address host:port", &c.Consensus)
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "TTL of the reconciler lease")
	fs.DurationVar(&c.Tick, "tick", c.Tick, "time between passes when nothing triggers one")
	fs.IntVar(&c.VoterFloor, "voter-floor", c.VoterFloor, "voters no automated removal goes below (at least 1; the cluster configuration's min_quorum raises it)")
	fs.DurationVar(&c.Stabilization, "stabilization", c.Stabilization, "how long a learner stays caught up before promotion; when set, overrides the cluster configuration's stabilization")
	fs.DurationVar(&c.LearnerStartTimeout, "learner-start-timeout", c.LearnerStartTimeout, "how long a learner may stay unstarted before it is removed")
	fs.DurationVar(&c.SnapshotTimeout, "snapshot-timeout", c.SnapshotTimeout, "how long to wait for the curators' etcd snapshot before each membership change; the change goes on without one after that (0: ask for none)")
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	if err := pki.ValidateCluster(c.Cluster); err != nil {
		return err
	}
	if c.Name == "" {
		return errors.New("--name is required")
	}
	if c.TLS.CA == "" || c.TLS.Cert == "" || c.TLS.Key == "" {
		return errors.New("--ca, --cert and --key are required: a reconciler certificate")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--listen %q: %w", c.Listen, err)
	}
	if len(c.Curator) == 0 || len(c.Consensus) == 0 {
		return errors.New("--curator and --consensus are required")
	}
	if c.LeaseTTL < 2*time.Second || c.LeaseTTL > time.Minute {
		return fmt.Errorf("--lease-ttl %v: between 2s and 60s", c.LeaseTTL)
	}
	if c.Tick <= 0 || c.Stabilization < 0 || c.LearnerStartTimeout <= 0 || c.SnapshotTimeout < 0 {
		return errors.New("--tick and --learner-start-timeout must be positive, --stabilization and --snapshot-timeout not negative")
	}
	if c.VoterFloor < 1 {
		return fmt.Errorf("--voter-floor %d: at least 1 (the last voter is never removed)", c.VoterFloor)
	}
	return nil
}

// planConfig is what the planner may do under the cluster configuration
// cc and this replica's flags.
func (c Config) planConfig(cc *curatorv1.ClusterConfig) plan.Config {
	pc := plan.Config{
		VoterFloor:          max(c.VoterFloor, int(cc.GetMinQuorum())),
		Stabilization:       cc.GetStabilization().AsDuration(),
		LearnerStartTimeout: c.LearnerStartTimeout,
		TargetSize:          int(cc.GetControlPlaneSize()),
		DeadAfter:           cc.GetDeadNodeThreshold().AsDuration(),
	}
	if c.Stabilization > 0 {
		pc.Stabilization = c.Stabilization
	}
	return pc
}

// Reconciler is one replica.
type Reconciler struct {
	cfg Config
	// holder is who this process acquires the lease as: its name and a
	// random incarnation, so that a restarted process, or a second one
	// started under the same name, never shares a live lease (and fence)
	// with an earlier one that may only be paused.
	holder  string
	log     *slog.Logger
	rpc     *rpc.Server
	curator *grpc.ClientConn
	// One connection per consensus service: a pass asks them in turn, so
	// that a member which cannot answer for the cluster (e.g. the one of a
	// deleted node) is not asked again and again.
	consensus []*grpc.ClientConn
	lease     *leaseKeeper
	metrics   *metrics
	// crl is the cluster's revocation list, followed from the curators and
	// enforced on this replica's API.
	crl *crl.Watcher

	// trigger asks for a pass now.
	trigger chan struct{}
	// view is every node, kept by followNodes (view.go).
	view nodeView

	mu     sync.Mutex
	status *reconcilerv1.GetStatusResponse
	// Learner clocks, kept across passes (plan.Observed).
	learnerSince map[uint64]time.Time
	readySince   map[uint64]time.Time
	// driftSince is when the current disagreement was first seen.
	driftSince time.Time
	// consensusNext picks the consensus service to ask.
	consensusNext int
	// quietUntil is when the last failed action said to retry
	// (afterFailure): no pass runs before.
	quietUntil time.Time
}

// New prepares a replica.
func New(cfg Config, log *slog.Logger) (*Reconciler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	creds, err := rpc.LoadCredentials(cfg.Cluster, cfg.TLS)
	if err != nil {
		return nil, err
	}
	if creds.Principal.Kind != pki.KindReconciler {
		return nil, fmt.Errorf("certificate %s is for %s, not the reconciler", cfg.TLS.Cert, creds.Principal)
	}
	holder := cfg.Name + "/" + incarnation()
	if failpoint.Mutated(failpoint.NoIncarnation) {
		holder = cfg.Name
	}
	log = log.With("component", "reconciler", "replica", cfg.Name, "holder", holder)
	cur, err := rpc.DialAny(cfg.Curator, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		return nil, err
	}
	var cons []*grpc.ClientConn
	for _, addr := range cfg.Consensus {
		cc, err := rpc.Dial(addr, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindConsensus}})
		if err != nil {
			cur.Close()
			return nil, err
		}
		cons = append(cons, cc)
	}
	r := &Reconciler{
		cfg: cfg, holder: holder, log: log, curator: cur, consensus: cons,
		trigger:      make(chan struct{}, 1),
		status:       &reconcilerv1.GetStatusResponse{Name: cfg.Name, Role: reconcilerv1.Role_ROLE_STANDBY},
		learnerSince: map[uint64]time.Time{},
		readySince:   map[uint64]time.Time{},
	}
	cas, err := pki.ParseCertsPEM(creds.CAPEM)
	if err != nil {
		return nil, err
	}
	r.crl = crl.New(cas, log.With("part", "crl"))
	srv, err := rpc.NewServer(rpc.ServerConfig{Credentials: creds, Policy: policy(), Logger: log.With("part", "grpc"), IsRevoked: r.crl.IsRevoked})
	if err != nil {
		return nil, err
	}
	reconcilerv1.RegisterReconcilerServer(srv.GRPC(), &apiServer{r: r})
	r.rpc = srv
	r.metrics = newMetrics(srv.Registry())
	r.lease = newLeaseKeeper(r)
	return r, nil
}

// incarnation names this process among every process ever started under
// the same name.
func incarnation() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (r *Reconciler) leases() curatorv1.LeasesClient { return curatorv1.NewLeasesClient(r.curator) }

func (r *Reconciler) reconciliation() curatorv1.ReconciliationClient {
	return curatorv1.NewReconciliationClient(r.curator)
}

// members is the consensus service this pass talks to.
func (r *Reconciler) members() consensusv1.ConsensusClient {
	r.mu.Lock()
	defer r.mu.Unlock()
	return consensusv1.NewConsensusClient(r.consensus[r.consensusNext%len(r.consensus)])
}

// nextConsensus moves on to the next consensus service.
func (r *Reconciler) nextConsensus() {
	r.mu.Lock()
	r.consensusNext++
	r.mu.Unlock()
}

// Run serves and reconciles until ctx ends; an active replica releases its
// lease on the way out so a standby takes over at once.
//
// Health (gRPC, and /healthz with --listen-metrics) is SERVING once the
// replica listens and its lease campaign runs: the curator answered its
// first Acquire, granted (active) or refused because another replica holds
// the lease (standby). It turns NOT_SERVING when the replica stops.
func (r *Reconciler) Run(ctx context.Context) error {
	defer r.curator.Close()
	defer func() {
		for _, cc := range r.consensus {
			cc.Close()
		}
	}()
	lis, mlis, err := rpc.Listen(r.cfg.Listen, r.cfg.ListenMetrics)
	if err != nil {
		return err
	}
	var g run.Group
	g.AddReady("grpc", func(ctx context.Context) error { return r.rpc.Serve(ctx, lis) })
	g.Add("lease", func(ctx context.Context) error { return r.lease.run(ctx, func() { g.Ready("lease") }) })
	g.AddReady("watch", r.followNodes)
	g.AddReady("watch-membership", r.watchMembership)
	g.AddReady("watch-config", r.watchConfig)
	g.AddReady("loop", r.loop)
	g.AddReady("crl", func(ctx context.Context) error {
		return r.crl.Follow(ctx, func() (curatorv1.CuratorClient, error) { return curatorv1.NewCuratorClient(r.curator), nil })
	})
	if mlis != nil {
		g.AddReady("metrics", func(ctx context.Context) error { return rpc.ServeMetrics(ctx, mlis, r.rpc.Registry(), r.rpc.Health()) })
	}
	g.Add("health", rpc.Readiness(r.rpc.Health(), &g, "health", reconcilerv1.Reconciler_ServiceDesc.ServiceName))
	r.log.Info("reconciler serving", "listen", lis.Addr().String())
	return g.Run(ctx)
}

// kick asks for a pass as soon as possible.
func (r *Reconciler) kick() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// loop runs passes on triggers and ticks. After an action it runs the next
// pass at once, so k drifts converge in about k round trips, not k ticks.
// A plan that time alone changes (a learner's stabilisation window ends, a
// node has been silent for the dead node threshold; plan.Recheck) has no
// event to trigger its pass, so the loop also wakes at that instant when it
// comes before the next tick: the change happens then, not up to a tick
// later. Each pass sets the wake-up anew from what it observed. After an
// action refused with a retry delay, no pass runs until it has passed.
func (r *Reconciler) loop(ctx context.Context) error { return r.runPasses(ctx, r.pass) }

// runPasses is loop with its pass given: tests give one that reports what
// they script.
func (r *Reconciler) runPasses(ctx context.Context, pass func(context.Context) (acted bool, recheck time.Time)) error {
	tick := time.NewTicker(r.cfg.Tick)
	defer tick.Stop()
	recheck := time.NewTimer(r.cfg.Tick)
	recheck.Stop()
	defer recheck.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-r.trigger:
		case <-recheck.C:
		}
		// An action failed with a retry delay (etcd's reconfiguration
		// window): the triggers until then are mostly its own echoes
		// (each refused membership call bumps the epoch twice), and a
		// pass would only fail again. Its own kick comes when it ends.
		r.mu.Lock()
		quiet := time.Now().Before(r.quietUntil)
		r.mu.Unlock()
		if quiet {
			continue
		}
		acted, at := pass(ctx)
		if acted {
			r.kick()
		}
		// An instant a tick or more away needs no timer: a tick's pass
		// comes first and sets it. Since Go 1.23 a stopped or reset timer
		// delivers no stale value, so no drain is needed.
		recheck.Stop()
		if d := time.Until(at); !at.IsZero() && d < r.cfg.Tick {
			recheck.Reset(d)
		}
	}
}
