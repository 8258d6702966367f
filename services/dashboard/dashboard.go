// Package dashboard is curia's web dashboard, a local command in the style
// of `kubectl proxy`: it listens on a loopback address only, holds the
// operator's admin credentials, serves server-rendered pages, and makes the
// admin API calls the pages ask for on any curator over mutual TLS.
//
//	browser ── HTTP, loopback only ──▶ dashboard ── mTLS, admin ──▶ curator ×N (any; fails over)
//	   ▲  pages (html/template),          │ view.go: Watch(all_nodes),    └─▶ reconciler ×N
//	   │  forms → http.go's actions       │ WatchAuditLog, GetCurrentLeader
//	   └── server-sent events ◀───────────┘ streams; the rest asked on change
//
// The view (view.go) follows the curators' streams and asks for what no
// stream carries (etcd membership and lag, the reconcilers' status and
// plan) whenever a stream reports a change, and every Refresh. Pages render
// from the view in memory; each page's live part is rendered again and sent
// as a server-sent event when the view changes (http.go), so a page
// follows the cluster without reloading. The membership timeline is the
// audit stream's membership events; the failure tolerance chart is the
// polled consensus status, sampled into a bounded ring in memory.
//
// Nothing but the loopback interface reaches the dashboard, and on it a
// request must name the dashboard's own address as its Host (no DNS
// rebinding) and a write must carry the token of a page the dashboard
// served (no cross-site request from another page in the browser).
//
// Files: dashboard.go (config, run), view.go (what the streams and polls
// know), http.go (routes, guard, event streams, actions), pages.go (the
// pages' data and templates), timeline.go (membership timeline, learners'
// catch-up, maintenance), history.go (the sample ring and its chart),
// api.go (the history views as JSON); the templates and assets in web/.
package dashboard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/run"
)

// Config configures the dashboard.
type Config struct {
	// Cluster is the cluster name (trust domain).
	Cluster string
	// TLS are the admin's certificate files.
	TLS rpc.TLSFiles
	// Listen is the loopback address the pages are served on.
	Listen string
	// Curators and Reconcilers are their replicas' gRPC addresses.
	Curators, Reconcilers []string
	// Refresh is how often what no stream carries is asked again when
	// nothing changed.
	Refresh time.Duration
	// AuditEvents is how many audit events the view keeps (newest).
	AuditEvents int
	// TimelineEvents is how many of the newest membership audit events
	// (the membership timeline's) the view keeps, out of the whole
	// backlog the curator sends (its newest 10000 events at most).
	TimelineEvents int
	// History is how long the failure tolerance chart reaches back: the
	// view keeps a sample of the consensus status every Refresh (and at
	// every change) for that long, in memory.
	History time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Cluster: "curia", Listen: "127.0.0.1:7000", Refresh: 2 * time.Second, AuditEvents: 500, TimelineEvents: 200, History: time.Hour}
}

// AddFlags registers the flags.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Cluster, "cluster", c.Cluster, "cluster name (trust domain of every identity)")
	c.TLS.AddFlags(fs, "")
	fs.StringVar(&c.Listen, "listen", c.Listen, "loopback address to serve the pages on (host:port; no other interface is accepted)")
	run.ListFlag(fs, "curator", "curator address host:port", &c.Curators)
	run.ListFlag(fs, "reconciler", "reconciler address host:port", &c.Reconcilers)
	fs.DurationVar(&c.Refresh, "refresh", c.Refresh, "how often etcd membership and the reconcilers' status are asked again when no stream reports a change")
	fs.IntVar(&c.AuditEvents, "audit-events", c.AuditEvents, "how many of the newest audit events the audit page keeps")
	fs.IntVar(&c.TimelineEvents, "timeline-events", c.TimelineEvents, "how many of the newest membership audit events the membership timeline keeps")
	fs.DurationVar(&c.History, "history", c.History, "how far back the failure tolerance chart reaches (sampled every --refresh, in memory, at most 10000 samples)")
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	if err := pki.ValidateCluster(c.Cluster); err != nil {
		return err
	}
	if c.TLS.CA == "" || c.TLS.Cert == "" || c.TLS.Key == "" {
		return errors.New("--ca, --cert and --key are required: an admin certificate")
	}
	if err := CheckLoopback(c.Listen); err != nil {
		return err
	}
	if len(c.Curators) == 0 {
		return errors.New("--curator is required")
	}
	if c.Refresh <= 0 || c.AuditEvents <= 0 || c.TimelineEvents <= 0 || c.History <= 0 {
		return errors.New("--refresh, --audit-events, --timeline-events and --history must be positive")
	}
	return nil
}

// ErrNotLoopback refuses a listen address other than a loopback one.
var ErrNotLoopback = errors.New("not a loopback address: the dashboard acts with the admin's credentials for whoever reaches it, so it listens on loopback only (127.0.0.1, ::1 or localhost)")

// CheckLoopback accepts host:port whose host is a loopback IP or
// "localhost", and nothing else: no empty host (every interface), no other
// name (it could resolve anywhere).
func CheckLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--listen %q: %w", addr, ErrNotLoopback)
	}
	return nil
}

// Dashboard is the running command.
type Dashboard struct {
	cfg     Config
	log     *slog.Logger
	curator *grpc.ClientConn
	recs    []*grpc.ClientConn
	view    *view
	ln      net.Listener
	csrf    string
	handler http.Handler
	pages   *pages
}

// New dials the curators and reconcilers (lazily) and listens.
func New(cfg Config, log *slog.Logger) (*Dashboard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	creds, err := rpc.LoadCredentials(cfg.Cluster, cfg.TLS)
	if err != nil {
		return nil, err
	}
	if creds.Principal.Kind != pki.KindAdmin {
		return nil, fmt.Errorf("certificate %s is for %s, not an admin", cfg.TLS.Cert, creds.Principal)
	}
	log = log.With("component", "dashboard")
	cur, err := rpc.DialAny(cfg.Curators, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		return nil, err
	}
	d := &Dashboard{cfg: cfg, log: log, curator: cur}
	var recs []reconcilerv1.ReconcilerClient
	for _, addr := range cfg.Reconcilers {
		cc, err := rpc.Dial(addr, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindReconciler}})
		if err != nil {
			d.close()
			return nil, err
		}
		d.recs = append(d.recs, cc)
		recs = append(recs, reconcilerv1.NewReconcilerClient(cc))
	}
	d.view = newView(cfg, log.With("part", "view"), curatorv1.NewCuratorClient(cur), curatorv1.NewManagementClient(cur), cfg.Reconcilers, recs)
	token := make([]byte, 32)
	if _, err := rand.Read(token); err != nil {
		d.close()
		return nil, err
	}
	d.csrf = hex.EncodeToString(token)
	// The address must be loopback once bound too: "localhost" resolves.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		d.close()
		return nil, fmt.Errorf("listen: %w", err)
	}
	if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		ln.Close()
		d.close()
		return nil, fmt.Errorf("--listen %q bound %s: %w", cfg.Listen, ip, ErrNotLoopback)
	}
	d.ln = ln
	d.pages = newPages(d)
	d.handler = d.routes()
	return d, nil
}

// URL is where the pages are, e.g. http://127.0.0.1:7000.
func (d *Dashboard) URL() string { return "http://" + d.ln.Addr().String() }

// Handler serves the pages (the same handler Run serves).
func (d *Dashboard) Handler() http.Handler { return d.handler }

func (d *Dashboard) close() {
	if d.curator != nil {
		d.curator.Close()
	}
	for _, cc := range d.recs {
		cc.Close()
	}
}

// Run follows the cluster and serves the pages until ctx ends.
func (d *Dashboard) Run(ctx context.Context) error {
	defer d.close()
	var g run.Group
	d.view.addParts(&g)
	g.AddReady("http", func(ctx context.Context) error {
		srv := &http.Server{Handler: d.handler, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(d.ln) }()
		d.log.Info("dashboard serves", "url", d.URL())
		select {
		case err := <-errc:
			return fmt.Errorf("serve: %w", err)
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx) // event streams end with ctx
		return nil
	})
	return g.Run(ctx)
}
