// Command consensus runs a node's consensus service: its embedded etcd member
// and the gRPC API that changes membership under fences.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"curia.dev/platform/logging"
	"curia.dev/services/consensus"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "consensus:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("consensus", flag.ContinueOnError)
	cfg := consensus.DefaultConfig()
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
	svc, err := consensus.New(cfg, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return svc.Run(ctx)
}
