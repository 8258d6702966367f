package roleserve

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// registerMetrics adds the agent's metrics to its registry (served on
// --listen-metrics): read when scraped, from the state the agent keeps.
func (s *Service) registerMetrics() error {
	for _, c := range []prometheus.Collector{
		enrolmentCollector{s},
		certCollector{s},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "curia_roleserve_curator_connected", Help: "1 while the last heartbeat reached the curator.",
		}, func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.st.connected {
				return 1
			}
			return 0
		}),
	} {
		if err := s.registry.Register(c); err != nil {
			return fmt.Errorf("register roleserve metrics: %w", err)
		}
	}
	return nil
}

var enrolmentStateDesc = prometheus.NewDesc("curia_roleserve_enrolment_state",
	"The node's enrolment state: 1 for the current one, 0 for the others.", []string{"state"}, nil)

// enrolmentCollector reports the enrolment state machine's state.
type enrolmentCollector struct{ s *Service }

func (c enrolmentCollector) Describe(ch chan<- *prometheus.Desc) { ch <- enrolmentStateDesc }

func (c enrolmentCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.s.machine.State()
	for st := range enrolmentStates {
		v := 0.0
		if st == now {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(enrolmentStateDesc, prometheus.GaugeValue, v, string(st))
	}
}

var certExpiryDesc = prometheus.NewDesc("curia_roleserve_certificate_expiry_seconds",
	"Seconds until the node certificate (node/<id>, the agent's identity towards the curators and its API's) expires, negative once expired; absent until the node has one. The agent renews it from the curator two thirds into its validity: a value that keeps falling means renewal fails.",
	[]string{"certificate"}, nil)

// certCollector reports how long the node certificate has left.
type certCollector struct{ s *Service }

func (c certCollector) Describe(ch chan<- *prometheus.Desc) { ch <- certExpiryDesc }

func (c certCollector) Collect(ch chan<- prometheus.Metric) {
	c.s.connMu.Lock()
	creds := c.s.creds
	c.s.connMu.Unlock()
	if creds == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(certExpiryDesc, prometheus.GaugeValue, time.Until(creds.Leaf().NotAfter).Seconds(), "node")
}
