// Command curia-kube is curia's helper on Kubernetes (deploy/kubernetes):
//
//	curia-kube bootstrap   the one-shot Job: the PKI into Secrets, then the cluster's first shape
//	curia-kube node-key    a curia-node pod's init container: the node's key, made once, and its id
//	curia-kube roll        the operator's: restart every curia pod of a namespace, one at a time (docs/operating/upgrading.md)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"curia.dev/deploy/kubernetes"
	"curia.dev/platform/logging"
	"curia.dev/platform/version"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "curia-kube:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("want a command: bootstrap, node-key or roll (or --version)")
	}
	cmd, args := args[0], args[1:]
	if cmd == "--version" || cmd == "-version" || cmd == "version" {
		version.Print(os.Stdout, "curia-kube")
		return nil
	}
	fs := flag.NewFlagSet("curia-kube "+cmd, flag.ContinueOnError)
	lc := logging.DefaultConfig()
	lc.AddFlags(fs)
	switch cmd {
	case "bootstrap":
		cfg := kubernetes.DefaultBootstrapConfig()
		cfg.AddFlags(fs)
		if err := parse(fs, args); err != nil {
			return err
		}
		if err := cfg.Validate(); err != nil {
			return err
		}
		log, err := logging.New(os.Stderr, lc)
		if err != nil {
			return err
		}
		api, err := kubernetes.InClusterAPI()
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return kubernetes.Bootstrap(ctx, cfg, api, os.Stdout, log)
	case "roll":
		cfg := kubernetes.DefaultRollConfig()
		cfg.AddFlags(fs)
		if err := parse(fs, args); err != nil {
			return err
		}
		if err := cfg.Validate(); err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		report, err := kubernetes.Roll(ctx, cfg, os.Stdout)
		if report != nil {
			fmt.Println("curia-kube roll:", report)
		}
		return err
	case "node-key":
		var cfg kubernetes.NodeKeyConfig
		cfg.AddFlags(fs)
		if err := parse(fs, args); err != nil {
			return err
		}
		id, err := kubernetes.NodeKey(cfg)
		if err != nil {
			return err
		}
		fmt.Println("node", id)
		return nil
	}
	return fmt.Errorf("unknown command %q: want bootstrap, node-key or roll", cmd)
}

// parse parses the flags; positional arguments are refused.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return nil
}
