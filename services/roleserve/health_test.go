package roleserve_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
	cut "curia.dev/services/curator/curatortest"
)

// TestHealthAndMetrics: an agent waiting for approval is NOT_SERVING (its
// API needs the node certificate); once committed it is SERVING, on
// /healthz and on its API; /metrics follows the enrolment; the node reports
// the agent's build as its version.
func TestHealthAndMetrics(t *testing.T) {
	c := cut.New(t, 1)
	a, n := c.NewConsensusAgent()
	rs := startAgent(t, c.PKI, n, "--curator", c.Curators[0].Addr, "--register-ticket-file", ticketFile(t, c))

	proctest.Eventually(t, time.Minute, func() error {
		if st, err := rs.enrolmentState(); err != nil || st != "WAITING_FOR_APPROVAL" {
			return fmt.Errorf("enrolment state %q (%v)", st, err)
		}
		return nil
	})
	proctest.WaitHealthz(t, rs.metrics, http.StatusServiceUnavailable, 30*time.Second)
	body := proctest.MetricsHave(t, rs.metrics, "curia_roleserve_enrolment_state", "curia_roleserve_curator_connected", "curia_build_info")
	if !strings.Contains(body, `curia_roleserve_enrolment_state{state="WAITING_FOR_APPROVAL"} 1`) {
		t.Error("/metrics does not say WAITING_FOR_APPROVAL")
	}
	if strings.Contains(body, "\ncuria_roleserve_certificate_expiry_seconds") {
		t.Error("/metrics reports a node certificate's expiry before the node has one")
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Management().ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: a.ID}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitHealthz(t, rs.metrics, http.StatusOK, time.Minute)
	cc, err := rpc.Dial(rs.listen, rpc.ClientConfig{Credentials: c.PKI.Creds(t, pki.Principal{Kind: pki.KindAdmin, Name: "test"}), ServerKinds: []pki.Kind{pki.KindNode}})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: "curia.roleserve.v1.RoleServer"})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health of the API: %v (%v)", resp.GetStatus(), err)
	}
	body = proctest.MetricsHave(t, rs.metrics, "grpc_server_handled_total", `curia_roleserve_certificate_expiry_seconds{certificate="node"}`)
	if !strings.Contains(body, `curia_roleserve_enrolment_state{state="RUNNING"} 1`) {
		t.Error("/metrics does not say RUNNING")
	}
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, `curia_roleserve_certificate_expiry_seconds{certificate="node"} `); ok {
			if f, err := strconv.ParseFloat(v, 64); err != nil || f < 3600 {
				t.Errorf("the node certificate expires in %q seconds", v)
			}
		}
	}
	proctest.Eventually(t, time.Minute, func() error {
		node, err := getNode(t, c.Management(), a.ID)
		if err != nil {
			return err
		}
		if v := node.GetStatus().GetVersion(); v == "" || v == "dev" {
			return fmt.Errorf("node reports version %q", v)
		}
		return nil
	})
}
