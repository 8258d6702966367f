// Command consensus runs a node's consensus service: its embedded etcd member
// and the gRPC API that changes membership under fences.
package main

import (
	"flag"
	"log/slog"

	"curia.dev/platform/run"
	"curia.dev/services/consensus"
)

func main() {
	cfg := consensus.DefaultConfig()
	run.Main("consensus", func(fs *flag.FlagSet) { cfg.AddFlags(fs) }, func(log *slog.Logger) (run.Service, error) {
		return consensus.New(cfg, log)
	})
}
