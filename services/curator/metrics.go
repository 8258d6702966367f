package curator

import (
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/services/curator/internal/nodewatch"
)

// registerMetrics adds the curator's metrics to the gRPC server's private
// registry (served on --listen-metrics): read when scraped, from the state
// the replica keeps anyway.
func (s *Service) registerMetrics(reg *prometheus.Registry) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "curia_curator_leader", Help: "1 while this replica leads.",
		}, func() float64 {
			if _, _, ok := s.lead.Ours(); ok {
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
		}, func() float64 { return float64(s.watch.Revision()) }),
		nodesCollector{s.watch},
		certCollector{s},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "curia_curator_etcd_endpoints", Help: "etcd voters the replica sends requests to: those that answered the last probe (endpoints.go).",
		}, func() float64 { return float64(len(s.etcd.Endpoints())) }),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register curator metrics: %w", err)
		}
	}
	for _, c := range append(s.snaps.Metrics(), s.defrag.Metrics()...) {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register curator metrics: %w", err)
		}
	}
	return nil
}

var (
	nodesDesc = prometheus.NewDesc("curia_curator_nodes",
		"Registered nodes by state (new: waiting for approval, standby, up, decommissioned) and health (healthy, heartbeat_timeout: its agent stopped heart-beating, unknown: never heard from), as this replica's watch hub sees them (every replica reports the same cluster: aggregate with max, not sum). Absent until the hub loaded.",
		[]string{"state", "health"}, nil)
	certExpiryDesc = prometheus.NewDesc("curia_curator_certificate_expiry_seconds",
		"Seconds until a certificate of this replica expires (negative once expired), by certificate: curator (its own, --cert; renewed by the deployment, not by curia) or ca (the cluster CA, --ca: every certificate of the cluster chains to it).",
		[]string{"certificate"}, nil)
)

// enumLabel is an enum value's name as a label value: NODE_STATE_UP is up.
func enumLabel(name, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(name, prefix))
}

// nodesCollector counts the watch hub's nodes by state and health, every
// combination of named values reported (0 included), so that a series
// does not vanish when its last node leaves it.
type nodesCollector struct{ h *nodewatch.Hub }

func (c nodesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- nodesDesc }

func (c nodesCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct{ state, health string }
	counts := map[key]int{}
	for st, sname := range curatorv1.NodeState_name {
		for hl, hname := range curatorv1.NodeHealth_name {
			if st != 0 && hl != 0 {
				counts[key{enumLabel(sname, "NODE_STATE_"), enumLabel(hname, "NODE_HEALTH_")}] = 0
			}
		}
	}
	if !c.h.Nodes(func(n *curatorv1.Node) {
		counts[key{enumLabel(n.GetState().String(), "NODE_STATE_"), enumLabel(n.GetHealth().String(), "NODE_HEALTH_")}]++
	}) {
		return
	}
	for k, v := range counts {
		ch <- prometheus.MustNewConstMetric(nodesDesc, prometheus.GaugeValue, float64(v), k.state, k.health)
	}
}

// certCollector reports how long the replica's certificate and the CA
// have left.
type certCollector struct{ s *Service }

func (c certCollector) Describe(ch chan<- *prometheus.Desc) { ch <- certExpiryDesc }

func (c certCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	if leaf := c.s.creds.Leaf(); leaf != nil {
		ch <- prometheus.MustNewConstMetric(certExpiryDesc, prometheus.GaugeValue, leaf.NotAfter.Sub(now).Seconds(), "curator")
	}
	ch <- prometheus.MustNewConstMetric(certExpiryDesc, prometheus.GaugeValue, c.s.certs.CA.Cert.NotAfter.Sub(now).Seconds(), "ca")
}
