// Command curator runs one curator replica: the node registry, the admin API
// and the leases, leader-elected through etcd.
package main

import (
	"flag"
	"log/slog"

	"curia.dev/platform/run"
	"curia.dev/services/curator"
)

func main() {
	cfg := curator.DefaultConfig()
	run.Main("curator", func(fs *flag.FlagSet) { cfg.AddFlags(fs) }, func(log *slog.Logger) (run.Service, error) {
		return curator.New(cfg, log)
	})
}
