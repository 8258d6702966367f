// Command curia-dashboard serves curia's web dashboard on a loopback
// address, with the admin's credentials, in the style of `kubectl proxy`:
//
//	curia-dashboard --ca ca.crt --cert admin.crt --key admin.key \
//	    --curator 127.0.0.21:7200,127.0.0.22:7200 --reconciler 127.0.0.31:7300,127.0.0.32:7300
//
// then open http://127.0.0.1:7000.
package main

import (
	"flag"
	"log/slog"

	"curia.dev/platform/run"
	"curia.dev/services/dashboard"
)

func main() {
	cfg := dashboard.DefaultConfig()
	run.Main("curia-dashboard", func(fs *flag.FlagSet) { cfg.AddFlags(fs) }, func(log *slog.Logger) (run.Service, error) {
		return dashboard.New(cfg, log)
	})
}
