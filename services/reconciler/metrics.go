package reconciler

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
)

// metrics are registered on the gRPC server's private registry (etcd owns
// the default one).
type metrics struct {
	passes *prometheus.CounterVec
	// results counts passes by how they ended (the status's last_result).
	results     *prometheus.CounterVec
	actions     *prometheus.CounterVec
	refusals    prometheus.Counter
	convergence prometheus.Histogram
	active      prometheus.Gauge
	// pass is how long a pass takes to observe and plan (its action not
	// included), and observed how many nodes it saw.
	pass     prometheus.Histogram
	observed prometheus.Gauge
	// snapshots counts the snapshots asked for before membership changes,
	// by result: taken, reused (a recent one), failed, off (the curators
	// take none).
	snapshots *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "curia_reconciler_passes_total", Help: "Reconcile passes, by the kind of action planned.",
		}, []string{"planned"}),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "curia_reconciler_pass_results_total", Help: "Reconcile passes by how they ended: converged (nothing to do), waiting (something to do later, e.g. a grace period), acted (one action taken), refused (the snapshot looked wrong: nothing done, see the status's refusals), paused, standby (this replica does not hold the lease), error (could not observe, or the action failed).",
		}, []string{"result"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "curia_reconciler_actions_total", Help: "Actions taken, by kind and result.",
		}, []string{"kind", "result"}),
		refusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "curia_reconciler_refusals_total", Help: "Passes that refused to act on a snapshot that looked wrong.",
		}),
		convergence: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "curia_reconciler_convergence_seconds", Help: "Time from the first pass that found drift to the first that found none.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
		}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "curia_reconciler_active", Help: "1 while this replica holds the reconciler lease and so is the one that acts; 0 on a standby. Across the replicas, exactly one should be 1.",
		}),
		pass: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "curia_reconciler_pass_observe_plan_seconds", Help: "Time a pass takes to observe the cluster and plan, its action not included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		observed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "curia_reconciler_observed_nodes", Help: "Nodes the last pass observed.",
		}),
		snapshots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "curia_reconciler_snapshots_before_change_total", Help: "etcd snapshots asked of the curators before membership changes, by result: taken, reused (a recent one), failed (the change went on without), off (the curators take none).",
		}, []string{"result"}),
	}
	for _, result := range []string{"taken", "reused", "failed", "off"} {
		m.snapshots.WithLabelValues(result)
	}
	for v := range reconcilerv1.PassResult_name {
		if v != 0 {
			m.results.WithLabelValues(passResultLabel(reconcilerv1.PassResult(v)))
		}
	}
	reg.MustRegister(m.results, m.passes, m.actions, m.refusals, m.convergence, m.active, m.pass, m.observed, m.snapshots)
	return m
}

// passResultLabel is a pass result as a label value: PASS_RESULT_ACTED is
// acted.
func passResultLabel(r reconcilerv1.PassResult) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "PASS_RESULT_"))
}
