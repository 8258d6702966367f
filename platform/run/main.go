package run

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"curia.dev/platform/logging"
	"curia.dev/platform/version"
)

// Service is what a curia command runs until its context ends.
type Service interface {
	Run(ctx context.Context) error
}

// ListFlag registers a flag that may be repeated or given a comma-separated
// list; every value is appended to dst.
func ListFlag(fs *flag.FlagSet, name, usage string, dst *[]string) {
	fs.Func(name, usage+" (repeatable or comma-separated)", func(s string) error {
		*dst = append(*dst, SplitList(s)...)
		return nil
	})
}

// SplitList splits a comma-separated flag value, dropping empty items.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Main is every curia service's main: it parses the flags addFlags
// registers (plus the logging flags), builds the service with the logger,
// and runs it until SIGINT or SIGTERM. It exits 1 with the error, or 2 on a
// usage error. --version prints the build (platform/version) and exits.
func Main(name string, addFlags func(*flag.FlagSet), build func(*slog.Logger) (Service, error)) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	addFlags(fs)
	lc := logging.DefaultConfig()
	lc.AddFlags(fs)
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if *showVersion {
		version.Print(os.Stdout, name)
		os.Exit(0)
	}
	err := func() error {
		log, err := logging.New(os.Stderr, lc)
		if err != nil {
			return err
		}
		svc, err := build(log)
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return svc.Run(ctx)
	}()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}
