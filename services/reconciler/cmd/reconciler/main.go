// Command reconciler runs one reconciler replica: it keeps node roles and
// etcd membership in agreement while it holds the curator lease.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"curia.dev/platform/logging"
	"curia.dev/services/reconciler"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "reconciler:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("reconciler", flag.ContinueOnError)
	cfg := reconciler.DefaultConfig()
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
	svc, err := reconciler.New(cfg, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return svc.Run(ctx)
}
