// Command curator runs one curator replica: the node registry, the admin API
// and the leases, leader-elected through etcd.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"curia.dev/platform/logging"
	"curia.dev/services/curator"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "curator:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("curator", flag.ContinueOnError)
	cfg := curator.DefaultConfig()
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
	svc, err := curator.New(cfg, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return svc.Run(ctx)
}
