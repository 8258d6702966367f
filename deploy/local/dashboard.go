package local

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// dashboardBin is the web dashboard's command (services/dashboard).
const dashboardBin = "curia-dashboard"

// dashboardAddr is where the dashboard listens: a loopback address of the
// cluster's subnet, port 7000.
func (c *Cluster) dashboardAddr() string { return c.cfg.Subnet + ".1:7000" }

// startDashboard starts the web dashboard with the admin's credentials,
// when Config.Dashboard asks for it and --bin has it, and returns its URL
// ("" when it does not run). A compose cluster's is started by up.sh
// (Detached, dashboard_detached.go), once the cluster is ready.
func (c *Cluster) startDashboard(ctx context.Context) string {
	if !c.cfg.Dashboard || c.cfg.Compose {
		return ""
	}
	if _, err := os.Stat(filepath.Join(c.cfg.Bin, dashboardBin)); err != nil {
		fmt.Fprintf(c.cfg.Out, "curia: no dashboard: %v\n", err)
		return ""
	}
	f := c.AdminFiles()
	addr := c.dashboardAddr()
	c.start(ctx, "dashboard", hostOf(addr), dashboardBin,
		"--cluster", c.cfg.Cluster, "--ca", f.CA, "--cert", f.Cert, "--key", f.Key,
		"--listen", addr,
		"--curator", strings.Join(c.Curators, ","), "--reconciler", strings.Join(c.Reconcilers, ","))
	return "http://" + addr
}

// printDashboard tells where the dashboard is, if it runs.
func (c *Cluster) printDashboard(url string) { PrintDashboard(c.cfg.Out, url) }

// PrintDashboard tells where the dashboard is, if it runs (url not ""): the
// last line make run and make up print.
func PrintDashboard(w io.Writer, url string) {
	if url != "" {
		fmt.Fprintf(w, "The dashboard (with the admin's credentials, on loopback only): %s\n", url)
	}
}
