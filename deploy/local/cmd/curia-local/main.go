// Command curia-local runs a whole curia cluster as local processes on
// loopback addresses: the README's main command (make run).
//
//	curia-local [run]   start the cluster and keep it running (default)
//	curia-local pki     create the PKI only (compose's one-shot pki service)
//	curia-local init    bring a running cluster to its shape and exit (compose's init service)
//	curia-local pause   do nothing until SIGTERM: holds a compose node's network namespace
//	curia-local dashboard [--stop]
//	                    (re)start the compose cluster's dashboard on the host, detached, and
//	                    print its URL (make up); or stop it (make down)
//	curia-local upgrade replace the running cluster's processes one at a time (make upgrade)
//	curia-local compose-upgrade
//	                    the same for the compose cluster, onto an image (make upgrade-compose)
//	curia-local recover rebuild a cluster that lost a majority of its voters for good
//	                    (from the most up-to-date survivor, or --snapshot FILE); it says
//	                    what it would do, and does it with --confirm <node>
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"curia.dev/deploy/local"
	"curia.dev/platform/logging"
	"curia.dev/platform/version"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "curia-local:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "dashboard":
		return dashboard(args)
	case "compose-upgrade":
		return composeUpgrade(args)
	}
	fs := flag.NewFlagSet("curia-local "+cmd, flag.ContinueOnError)
	cfg := local.Config{Cluster: "curia", ControlPlane: 3, Workers: 1, Curators: 2, Reconcilers: 2, Out: os.Stdout}
	fs.StringVar(&cfg.State, "state", ".curia", "state directory: PKI, data, logs, env file")
	fs.StringVar(&cfg.Bin, "bin", "bin", "directory with the consensus, curator, reconciler and roleserve binaries")
	fs.StringVar(&cfg.Cluster, "cluster", cfg.Cluster, "cluster name")
	fs.StringVar(&cfg.Subnet, "subnet", "127.0.0", "loopback /24 for the processes' addresses (first three octets)")
	fs.IntVar(&cfg.ControlPlane, "control-plane", cfg.ControlPlane, "control-plane nodes (consensus + roleserve)")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "worker nodes (their consensus stays idle)")
	fs.IntVar(&cfg.Curators, "curators", cfg.Curators, "curator replicas")
	fs.IntVar(&cfg.Reconcilers, "reconcilers", cfg.Reconcilers, "reconciler replicas")
	fs.BoolVar(&cfg.Dashboard, "dashboard", true, "start the web dashboard (curia-dashboard in --bin) on <subnet>.1:7000")
	fresh := fs.Bool("fresh", false, "delete the state directory first and start a new cluster")
	fs.BoolVar(&cfg.Compose, "compose", false, "lay the cluster out for deploy/compose (host names instead of loopback addresses)")
	fs.StringVar(&cfg.Grpcurl, "grpcurl", "", "the grpcurl whose directory the env file puts first on PATH (make run: the pinned one)")
	fs.Func("san", "further host name or IP of the curator and reconciler certificates, where operators reach them (repeatable; used when the PKI is made)", func(s string) error {
		if s == "" {
			return errors.New("empty SAN")
		}
		cfg.SANs = append(cfg.SANs, s)
		return nil
	})
	var ro local.RecoverOptions
	var to string
	if cmd == "upgrade" {
		fs.StringVar(&to, "to", "", "directory with the new consensus, curator, reconciler and roleserve binaries, installed into --bin (default: --bin itself: a rolling restart)")
	}
	if cmd == "recover" {
		fs.StringVar(&ro.Confirm, "confirm", "", "consent: the node whose data becomes the cluster (the survivor recover names, or the node to restore --snapshot on)")
		fs.StringVar(&ro.Snapshot, "snapshot", "", "restore this snapshot file (Management/GetSnapshot's, or <state>/snapshots/*.db) instead of a survivor's data")
		fs.StringVar(&ro.Reason, "reason", "", "why, for the report and the audit log")
		fs.DurationVar(&ro.Wait, "wait", 5*time.Minute, "how long to wait for the control plane to grow back (0: do not wait)")
		fs.DurationVar(&ro.Settle, "settle", 10*time.Second, "how long the survivors may take to notice the loss before a leader seen means a quorum is reachable")
	}
	lc := logging.DefaultConfig()
	lc.AddFlags(fs)
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		version.Print(os.Stdout, "curia-local")
		return nil
	}
	if cfg.ControlPlane < 1 || cfg.ControlPlane > 9 || cfg.Workers < 0 || cfg.Workers > 9 || cfg.Curators < 1 || cfg.Curators > 9 || cfg.Reconcilers < 1 || cfg.Reconcilers > 9 {
		return fmt.Errorf("counts: 1..9 control-plane nodes, curators and reconcilers, 0..9 workers")
	}
	if cfg.Grpcurl != "" {
		if st, err := os.Stat(cfg.Grpcurl); err != nil || st.IsDir() || st.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("--grpcurl %s: no such executable (make tools installs it)", cfg.Grpcurl)
		}
	}
	log, err := logging.New(os.Stderr, lc)
	if err != nil {
		return err
	}
	cfg.Log = log
	if *fresh {
		if err := os.RemoveAll(cfg.State); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := local.New(cfg)
	switch cmd {
	case "run":
		return c.Run(ctx)
	case "pki":
		return c.PKI()
	case "init":
		// The PKI job made the node ids (public/); init holds no CA key.
		if err := c.ReadIDs(); err != nil {
			return err
		}
		admin, err := c.AdminConn()
		if err != nil {
			return err
		}
		defer admin.Close()
		if err := c.Init(ctx, admin); err != nil {
			return err
		}
		fmt.Println("curia-local: cluster ready")
		return nil
	case "recover":
		if err := c.ReadIDs(); err != nil {
			return err
		}
		_, err := c.Recover(ctx, ro)
		if errors.Is(err, local.ErrNoConsent) {
			fmt.Fprintln(os.Stderr, "curia-local:", err)
			os.Exit(2)
		}
		return err
	case "upgrade":
		if to == "" {
			to = cfg.Bin
		}
		r, err := c.Upgrade(ctx, to)
		if r != nil {
			fmt.Println("curia-local upgrade:", r)
		}
		return err
	case "pause":
		// A node's consensus and roleserve containers join this one's
		// network namespace; it never crashes, so they can restart on
		// their own without losing the network.
		<-ctx.Done()
		return nil
	}
	return fmt.Errorf("unknown command %q: want run, pki, init, recover, upgrade, compose-upgrade, pause or dashboard", cmd)
}

// dashboard starts the compose cluster's dashboard, detached, against the
// ports its env file names, or stops it (--stop): see
// deploy/local/dashboard_detached.go.
func dashboard(args []string) error {
	fs := flag.NewFlagSet("curia-local dashboard", flag.ContinueOnError)
	d := local.Detached{Cluster: "curia"}
	fs.StringVar(&d.Dir, "state", ".curia-compose", "the compose cluster's directory on the host (make up's env file; the dashboard's pid file and log go there)")
	fs.StringVar(&d.Bin, "bin", "bin", "directory with curia-dashboard")
	fs.StringVar(&d.Cluster, "cluster", d.Cluster, "cluster name")
	fs.StringVar(&d.Listen, "listen", "127.0.0.1:7001", "loopback address to serve the pages on")
	stop := fs.Bool("stop", false, "stop the dashboard the pid file names, if it runs, and start none")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("dashboard: unexpected arguments %q", fs.Args())
	}
	if *stop {
		return d.Stop()
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	url, err := d.Start(ctx)
	if err != nil {
		return err
	}
	local.PrintDashboard(os.Stdout, url)
	return nil
}

// composeUpgrade rolls the compose cluster onto an image, one container
// at a time: see deploy/local/compose_upgrade.go. Its environment names
// the compose project (COMPOSE_FILE, COMPOSE_PROJECT_NAME; make
// upgrade-compose sets them) and the compose command (COMPOSE).
func composeUpgrade(args []string) error {
	fs := flag.NewFlagSet("curia-local compose-upgrade", flag.ContinueOnError)
	u := local.ComposeUpgrade{Cluster: "curia", Out: os.Stdout, Env: os.Environ()}
	fs.StringVar(&u.Dir, "state", ".curia-compose", "the compose cluster's directory on the host (make up's env file and the admin's files)")
	fs.StringVar(&u.Cluster, "cluster", u.Cluster, "cluster name")
	fs.StringVar(&u.Image, "image", "curia:dev", "the image to roll every container onto (the image the cluster runs: a rolling restart)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("compose-upgrade: unexpected arguments %q", fs.Args())
	}
	u.Compose = strings.Fields(os.Getenv("COMPOSE"))
	if len(u.Compose) == 0 {
		u.Compose = []string{"docker", "compose"}
		if exec.Command("docker", "compose", "version").Run() != nil {
			u.Compose = []string{"docker-compose"}
		}
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	r, err := u.Run(ctx)
	if r != nil {
		fmt.Println("curia-local compose-upgrade:", r)
	}
	return err
}
