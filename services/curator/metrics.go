package curator

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// registerMetrics adds the curator's metrics to the gRPC server's private
// registry (served on --listen-metrics): read when scraped, from the state
// the replica keeps anyway.
func (s *Service) registerMetrics(reg *prometheus.Registry) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "curia_curator_leader", Help: "1 while this replica leads.",
		}, func() float64 {
			if _, _, ok := s.lead.ours(); ok {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "curia_curator_leader_term", Help: "Term (election key create revision) of the leader this replica observes; 0 while none is known.",
		}, func() float64 {
			info, _ := s.lead.leader()
			return float64(info.Term)
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "curia_curator_watch_revision", Help: "etcd revision the node watch hub has served up to.",
		}, func() float64 { return float64(s.watch.revision()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "curia_curator_etcd_endpoints", Help: "etcd voters the replica sends requests to: those that answered the last probe (endpoints.go).",
		}, func() float64 { return float64(len(s.etcd.Endpoints())) }),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register curator metrics: %w", err)
		}
	}
	for _, c := range append(s.snaps.metrics(), s.defrag.metrics()...) {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register curator metrics: %w", err)
		}
	}
	return nil
}
