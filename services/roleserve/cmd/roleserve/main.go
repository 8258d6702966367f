// Command roleserve runs the node agent: one per node. It enrols the node
// in the cluster, watches its roles and runs what they ask for on the
// node's local consensus service.
package main

import (
	"flag"
	"log/slog"

	"curia.dev/platform/run"
	"curia.dev/services/roleserve"
)

func main() {
	cfg := roleserve.DefaultConfig()
	run.Main("roleserve", func(fs *flag.FlagSet) { cfg.AddFlags(fs) }, func(log *slog.Logger) (run.Service, error) {
		return roleserve.New(cfg, log)
	})
}
