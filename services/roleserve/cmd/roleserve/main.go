// Command roleserve runs the node agent: one per node. It enrols the node
// in the cluster, watches its roles and runs what they ask for on the
// node's local consensus service.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"curia.dev/platform/logging"
	"curia.dev/services/roleserve"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "roleserve:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("roleserve", flag.ContinueOnError)
	cfg := roleserve.DefaultConfig()
	cfg.AddFlags(fs)
	lc := logging.DefaultConfig()
	lc.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := logging.New(os.Stderr, lc)
	if err != nil {
		return err
	}
	svc, err := roleserve.New(cfg, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return svc.Run(ctx)
}
