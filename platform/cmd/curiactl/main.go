// Command curiactl is the operator's command line for a curia cluster: it
// talks to the curators' Management API over mutual TLS with an admin
// certificate, as grpcurl does in the README, but with one command per task,
// tables for people and JSON (or YAML) for scripts. docs/curiactl.md
// describes every command.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs curiactl with args and returns its exit code (exitcodes.go).
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cmd, a := newRoot(getenv, stdout, stderr)
	defer a.close()
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	if strings.HasPrefix(err.Error(), "unknown command ") {
		err = usageError{err}
	}
	return renderError(stderr, err)
}
