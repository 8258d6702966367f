package faults

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what a run found, printed as a table and kept as JSON.
type Report struct {
	Seed      uint64   `json:"seed"`
	Duration  string   `json:"duration"`
	Nemeses   []string `json:"nemeses"`
	Mutations []string `json:"mutations,omitempty"`
	// StrictReconfig: etcd's own reconfiguration checks were on.
	StrictReconfig bool               `json:"etcd_strict_reconfig"`
	Faults         map[string]int     `json:"faults_by_kind"`
	FaultLog       []fault            `json:"fault_log"`
	Ops            map[string]opStats `json:"operations"`
	Violations     []Violation        `json:"violations"`
	// Convergence is how long roles and membership took to agree again
	// after each heal, and after the final heal.
	Convergence      Timings `json:"convergence_after_heal"`
	FinalConvergence string  `json:"final_convergence"`
	// SlowestHeal names the fault whose heal took longest to get over.
	SlowestHeal string `json:"slowest_heal,omitempty"`
	// Rolls and RollsStopped count the rolling restarts (rolling-restart)
	// that finished and those that stopped: refused on an unhealthy
	// cluster, or a step not healthy again in time.
	Rolls              int     `json:"rolls,omitempty"`
	RollsStopped       int     `json:"rolls_stopped,omitempty"`
	CuratorFailover    Timings `json:"curator_failover"`
	ReconcilerTakeover Timings `json:"reconciler_takeover"`
	Registry           string  `json:"registry_linearizability"`
	RegistryOps        int     `json:"registry_ops_checked"`
	// RoleWrites are the operators' acknowledged UpdateNodeRoles calls
	// found in etcd's history, and those that could not be checked.
	RoleWrites          int    `json:"role_writes_checked"`
	RoleWritesUnchecked int    `json:"role_writes_unchecked"`
	Visualization       string `json:"visualization,omitempty"`
	Samples             int    `json:"samples"`
	MaxSampleGap        string `json:"max_sample_gap"`
}

// Timings summarises durations.
type Timings struct {
	Count  int    `json:"count"`
	Median string `json:"median"`
	Worst  string `json:"worst"`
	// Unfinished counts episodes that did not end before the next fault or
	// the end of the run.
	Unfinished int `json:"unfinished,omitempty"`
}

func timings(ds []time.Duration, unfinished int) Timings {
	t := Timings{Count: len(ds), Unfinished: unfinished}
	if len(ds) == 0 {
		return t
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	t.Median = s[len(s)/2].Round(time.Millisecond).String()
	t.Worst = s[len(s)-1].Round(time.Millisecond).String()
	return t
}

// Write prints the report as a table.
func (r *Report) Write(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "seed\t%d\n", r.Seed)
	fmt.Fprintf(tw, "duration\t%s\n", r.Duration)
	fmt.Fprintf(tw, "nemeses\t%s\n", strings.Join(r.Nemeses, ", "))
	fmt.Fprintf(tw, "etcd's strict reconfiguration check\t%s\n", map[bool]string{true: "on", false: "off (curia's guards alone)"}[r.StrictReconfig])
	if len(r.Mutations) > 0 {
		fmt.Fprintf(tw, "mutations (safety switched off)\t%s\n", strings.Join(r.Mutations, ", "))
	}
	kinds := make([]string, 0, len(r.Faults))
	for k := range r.Faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(tw, "faults: %s\t%d\n", k, r.Faults[k])
	}
	ops := make([]string, 0, len(r.Ops))
	for k := range r.Ops {
		ops = append(ops, k)
	}
	sort.Strings(ops)
	fmt.Fprintf(tw, "operation\tattempted\tacknowledged\trefused\tunknown\n")
	for _, k := range ops {
		o := r.Ops[k]
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\n", k, o.Attempted, o.Acknowledged, o.Refused, o.Unknown)
	}
	fmt.Fprintf(tw, "convergence after a heal\t%d heals, median %s, worst %s, %d unfinished\n", r.Convergence.Count, r.Convergence.Median, r.Convergence.Worst, r.Convergence.Unfinished)
	if r.SlowestHeal != "" {
		fmt.Fprintf(tw, "  slowest\t%s\n", r.SlowestHeal)
	}
	fmt.Fprintf(tw, "convergence after the final heal\t%s\n", r.FinalConvergence)
	if slices.Contains(r.Nemeses, NemRollingRestart) {
		fmt.Fprintf(tw, "rolling restarts beside the faults\t%d finished, %d stopped (unhealthy cluster)\n", r.Rolls, r.RollsStopped)
	}
	fmt.Fprintf(tw, "curator failover\t%d, median %s, worst %s\n", r.CuratorFailover.Count, r.CuratorFailover.Median, r.CuratorFailover.Worst)
	fmt.Fprintf(tw, "reconciler takeover\t%d, median %s, worst %s\n", r.ReconcilerTakeover.Count, r.ReconcilerTakeover.Median, r.ReconcilerTakeover.Worst)
	fmt.Fprintf(tw, "registry linearizability\t%s\n", r.Registry)
	fmt.Fprintf(tw, "acknowledged role writes\t%d found in etcd's history, %d not checkable\n", r.RoleWrites, r.RoleWritesUnchecked)
	fmt.Fprintf(tw, "samples\t%d (largest gap %s)\n", r.Samples, r.MaxSampleGap)
	fmt.Fprintf(tw, "violations\t%d\n", len(r.Violations))
	tw.Flush()
	for _, v := range r.Violations {
		fmt.Fprintf(w, "  VIOLATION %s\n", v)
	}
}

// Save writes the report as JSON.
func (r *Report) Save(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
