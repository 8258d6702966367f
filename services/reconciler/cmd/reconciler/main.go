// Command reconciler runs one reconciler replica: it keeps node roles and
// etcd membership in agreement while it holds the curator lease.
package main

import (
	"flag"
	"log/slog"

	"curia.dev/platform/run"
	"curia.dev/services/reconciler"
)

func main() {
	cfg := reconciler.DefaultConfig()
	run.Main("reconciler", func(fs *flag.FlagSet) { cfg.AddFlags(fs) }, func(log *slog.Logger) (run.Service, error) {
		return reconciler.New(cfg, log)
	})
}
