package consensus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"curia.dev/platform/pki"
)

// Metrics. /metrics serves this process's registry (the gRPC server's: its
// API's grpc_server_*, go_*, process_*, curia_build_info and the curia_*
// below); /metrics/etcd serves, in full and unchanged, the default registry
// embedded etcd registers on (etcd_*, its client port's grpc_server_*, its
// go_* and process_*), so that etcd's own dashboards and alerts work on it.
// The two share names (go_*, grpc_server_*): one /metrics merging them would
// have to drop one side.
const etcdMetricsPath = "/metrics/etcd"

var (
	votersDesc = prometheus.NewDesc("curia_consensus_voters",
		"etcd voting members in this member's applied view of the cluster (absent while the local member does not run).", nil, nil)
	learnersDesc = prometheus.NewDesc("curia_consensus_learners",
		"etcd learners (members that replicate but do not vote yet) in this member's applied view of the cluster (absent while the local member does not run).", nil, nil)
	healthyVotersDesc = prometheus.NewDesc("curia_consensus_healthy_voters",
		"Voters that answered this member's status probe at the current term, naming its leader and raising no alarm (absent while the local member does not run).", nil, nil)
	toleranceDesc = prometheus.NewDesc("curia_consensus_failure_tolerance",
		"How many more voters may fail with the quorum kept: healthy voters minus the quorum (voters/2+1). 0: the next voter lost stops every write; below 0: the quorum is lost now (absent while the local member does not run).", nil, nil)
	pendingAgeDesc = prometheus.NewDesc("curia_consensus_pending_change_age_seconds",
		"How long this process has seen the current membership change pending (by its own clock); 0 when none is pending (absent while the local member does not run). A change left pending past twice its deadline is resolved by any consensus process.", nil, nil)
	certExpiryDesc = prometheus.NewDesc("curia_consensus_certificate_expiry_seconds",
		"Seconds until a certificate this process serves expires (negative once expired), by certificate: api (consensus/<node>, the gRPC API's), member (member/<node>, etcd's peer and client ports' and this process's etcd client's). A certificate not installed is absent; the node's agent renews both.", []string{"certificate"}, nil)
)

// metricsCollector reads the consensus gauges when scraped.
type metricsCollector struct{ s *Service }

func (c metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{votersDesc, learnersDesc, healthyVotersDesc, toleranceDesc, pendingAgeDesc, certExpiryDesc} {
		ch <- d
	}
}

func (c metricsCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	id := c.s.member.id
	if !id.api.SelfSigned() {
		ch <- prometheus.MustNewConstMetric(certExpiryDesc, prometheus.GaugeValue, id.notAfter(pki.KindConsensus).Sub(now).Seconds(), "api")
	}
	if t := id.notAfter(pki.KindMember); !t.IsZero() {
		ch <- prometheus.MustNewConstMetric(certExpiryDesc, prometheus.GaugeValue, t.Sub(now).Seconds(), "member")
	}

	e, cli, err := c.s.member.running()
	if err != nil {
		return
	}
	var voters []*etcdMember
	learners := 0
	for _, m := range e.Server.Cluster().Members() {
		if m.IsLearner {
			learners++
			continue
		}
		voters = append(voters, &etcdMember{ID: uint64(m.ID), Name: m.Name, ClientURLs: m.ClientURLs})
	}
	healthy := len(judgeVoters(0, c.s.probeVoters(context.Background(), cli, voters)).healthy)
	ch <- prometheus.MustNewConstMetric(votersDesc, prometheus.GaugeValue, float64(len(voters)))
	ch <- prometheus.MustNewConstMetric(learnersDesc, prometheus.GaugeValue, float64(learners))
	ch <- prometheus.MustNewConstMetric(healthyVotersDesc, prometheus.GaugeValue, float64(healthy))
	ch <- prometheus.MustNewConstMetric(toleranceDesc, prometheus.GaugeValue, float64(healthy-(len(voters)/2+1)))
	ch <- prometheus.MustNewConstMetric(pendingAgeDesc, prometheus.GaugeValue, c.s.pending.currentAge(now).Seconds())
}

// probeVoters asks every voter for its status at once, within one health
// timeout (as the quorum guard does).
func (s *Service) probeVoters(ctx context.Context, cli *clientv3.Client, voters []*etcdMember) []probeResult {
	pctx, cancel := context.WithTimeout(ctx, s.cfg.HealthTimeout)
	defer cancel()
	results := make([]probeResult, len(voters))
	var wg sync.WaitGroup
	for i, v := range voters {
		results[i] = probeResult{member: v, node: v.Name}
		if len(v.ClientURLs) == 0 {
			results[i].err = errors.New("never started")
			continue
		}
		wg.Go(func() {
			results[i].status, results[i].err = statusAt(pctx, cli, v.ClientURLs[0])
		})
	}
	wg.Wait()
	return results
}

// registerMetrics adds the consensus gauges to the gRPC server's registry.
func (s *Service) registerMetrics(reg *prometheus.Registry) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "curia_consensus_member_running",
			Help: "1 while this node's etcd member runs (lifecycle state RUNNING).",
		}, func() float64 {
			if _, _, err := s.member.running(); err != nil {
				return 0
			}
			return 1
		}),
		metricsCollector{s},
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	return nil
}
